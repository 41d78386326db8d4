# A DCP2 server over two nodes, one rank each (SGLang's `--nnodes 2 --node-rank k --dist-init-addr`),
# and SIGKILL of the rank on node 1 under load. Written for the reference engine (CI has no GPU)
# and for `--launcher slurm` (docs/slurm.md): the fault reaches the rank through a Slurm step on
# its node. Rank 0 sees the peer's death through its lifeline (cptest/reference/lifeline.py);
# node 0's server fails its in-flight requests and SIGKILLs itself (SIGQUIT path, status -9).
# In-flight requests must fail, not hang; no process may survive.
cptest 1
scenario reference_two_node_kill_rank {
  description "SIGKILL of the rank on node 1 of a two-node DCP2 server under load"
  extends "defaults/tiny.cps"
  engine reference "builtin"
  model synthetic llama {
    layers 4
    hidden 256
    heads 8
    kv_heads 1
    head_dim 64
    vocab 4096
    intermediate 512
    seed 7
  }
  topology {
    gpus 2
    nodes 2
    tp 2
    dcp 2
  }
  baseline none
  workload {
    requests 16
    concurrency 4
    prompt_tokens uniform(64, 256)
    output_tokens 16
  }
  fault kill rank 1 after 4 requests
  expect {
    rows kv_owner position % 2
    serving completed >= 4 of 16
    shutdown within 30s no_orphans exit_status in (-9, 137)
    log contains "SIGQUIT received"
  }
}
