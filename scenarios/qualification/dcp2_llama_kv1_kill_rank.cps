# Requirement of docs/target-plan.md (P1: DCP2 on MHA with kv_heads <= tp/dcp, triton).
# Reclamation when a rank dies: SIGKILL of DCP rank 1 after 8 requests ends the whole server by
# SGLang's SIGQUIT path (docs/sglang.md §10); no request hangs, no process is left, GPU memory returns.
cptest 1
scenario dcp2_llama_kv1_kill_rank {
  description "DCP2 on TP2, tiny Llama with 1 KV head: SIGKILL of one DCP rank under load"
  extends "../defaults/tiny.cps"
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
    tp 2
    dcp 2
  }
  baseline none
  fault kill rank 1 after 8 requests
  expect {
    serving completed >= 8 of 32
    shutdown within 30s gpu_memory_released no_orphans exit_status in (-9, 137)
    log contains "SIGQUIT received"
  }
}
