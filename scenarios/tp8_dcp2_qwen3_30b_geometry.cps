# TP8 + DCP2 on a synthetic Qwen3 with Qwen3-30B-A3B's attention geometry (32 query heads,
# 4 KV heads, head dim 128, hidden 2048), dense, few layers, on one 8-GPU host.
# kv_heads 4 <= tp/dcp = 4: TP ranks 2k and 2k+1 share KV head k, and the DCP groups are the
# contiguous pairs [0,1], [2,3], ... (docs/sglang.md §6), so each DCP group holds one replicated
# head: layout-consistent, capacity x2 (§3.2 Qwen3-MoE row: "30B-A3B: 4 KV heads -> TP8/DCP2 fits").
cptest 1
scenario tp8_dcp2_qwen3_30b_geometry {
  description "TP8 + DCP2, Qwen3-30B-A3B attention geometry (synthetic dense, 4 layers)"
  extends "defaults/tiny.cps"
  model synthetic qwen3 {
    layers 4
    hidden 2048
    heads 32
    kv_heads 4
    head_dim 128
    vocab 8192
    intermediate 6144
  }
  topology {
    gpus 8
    tp 8
    dcp 2
  }
  serve {
    max_total_tokens 131072
    mem_fraction 0.5
  }
  baseline {
    tp 8
  }
  workload {
    requests 64
    concurrency 16
    prompt_tokens uniform(1024, 4096)
    output_tokens 64
  }
  expect {
    rows kv_owner position % 2
    capacity logical == 2 * physical within 0.01
    # Teacher-forced against the measured noise floor (docs/language.md "Generation parity"): the
    # control is the baseline's model at another TP degree; free-running by vLLM's top-k rule.
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
