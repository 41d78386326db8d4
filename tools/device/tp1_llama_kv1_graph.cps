# One GPU (the `nvidia-h200` kind): what the 1-GPU machine can show of issue 13's graph and capacity
# evidence on real SGLang 0.5.17 (tools/device/replay_check.sh). Not a qualification scenario: no
# context parallelism runs on one GPU. It checks the probe's replay records (D58), the pool samples
# through a fill-and-drain workload (D59) and graph parity against the eager twin (D60) at TP1.
# - decode CUDA graphs captured; every replayed decode step recorded with its padded size;
# - `rows replicated` judged on replays too (one rank: every step's rows seen, padding apart);
# - the pool filled past 90 % and drained (max_total_tokens 4096, 256 tokens a request);
# - graph parity free-running only: the twin's outputs against main's replayed ones (no baseline,
#   so no control floor on one GPU: the control would be TP2).
cptest 1
scenario tp1_llama_kv1_graph {
  description "TP1 tiny Llama, decode CUDA graphs: replay records, pool samples, graph parity (1 GPU)"
  extends "../../scenarios/defaults/tiny.cps"
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
    gpus 1
    tp 1
  }
  serve {
    cuda_graph_decode full
    max_total_tokens 4096
  }
  baseline none
  workload {
    requests 64
    prompt_tokens 240
    output_tokens 16
    fill_drain 0.95
  }
  expect {
    graph decode captured
    rows replicated
    capacity transitions peak >= 0.9
    graph parity vs eager free_running topk 5
  }
}
