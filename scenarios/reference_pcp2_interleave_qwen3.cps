# PCP2 with the interleave strategy on a tiny Qwen3 (TP2, attn_cp 2): packed extend token i is
# computed by CP rank i % 2 (docs/sglang.md §5, 0.5.17 layers/cp/interleave.py), K/V are gathered over
# the CP group, and generation must agree with the TP2 baseline. SGLang 0.5.17 lists no attention
# backend with an interleave path on the GPU machine; the reference engine implements the contract.
cptest 1
scenario reference_pcp2_interleave_qwen3 {
  description "PCP2 interleave on TP2, tiny Qwen3 with 2 KV heads"
  extends "defaults/tiny.cps"
  engine reference "builtin"
  model synthetic qwen3 {
    layers 4
    hidden 256
    heads 8
    kv_heads 2
    head_dim 64
    vocab 4096
    intermediate 512
    seed 7
  }
  topology {
    gpus 2
    tp 2
    attn_cp 2
    cp_strategy interleave
  }
  baseline {
    tp 2
  }
  workload {
    requests 16
    concurrency 8
  }
  expect {
    rows split interleave ffn gathered
    pcp rows
    generation logprob p99 <= 4 * control logprob max <= 0.001 free_running topk 5 vs baseline
  }
}
