# DCP2 on TP2 with 1 KV head: kv_heads 1 <= tp/dcp = 1, so both ranks of the DCP group hold the
# same (replicated) KV head and the layout is consistent (docs/sglang.md §3, §4.2).
# - KV position p is written only by DCP rank p % 2 (§4.1 owner rule, triton masked write).
# - Capacity: per-rank rows x dcp = max_total_num_tokens (§4.2; 0.5.17 pool_configurator.py:290-296
#   sizes cells by attn_tp heads, model_runner logical = rows x dcp).
# - Decode graphs would stay on with DCP (§7); the suite runs decode eager for row evidence.
cptest 1
scenario dcp2_llama_kv1 {
  description "DCP2 on TP2, tiny Llama with 1 KV head (layout consistent)"
  extends "defaults/tiny.cps"

  # the tiny model's geometry, written by cptest itself (cptest/run/models.py)
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
  baseline {
    tp 2
  }
  expect {
    rows kv_owner position % 2
    dcp handoff
    capacity logical == 2 * physical within 0.01
    # Teacher-forced against the measured noise floor (docs/language.md "Generation parity"): the
    # control is the baseline's model at another TP degree; free-running by vLLM's top-k rule.
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
    log contains "DCP enabled, dcp_size=2, tp_size=2"
  }
}
