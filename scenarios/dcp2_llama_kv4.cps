# DCP2 on TP2 with 4 KV heads: kv_heads 4 > tp/dcp = 1. In 0.5.17 each rank's pool holds its TP
# shard of 2 KV heads (pool_configurator.py:290-296, get_num_kv_heads(attn_tp_size)), so the two
# ranks of the DCP group hold *different* heads while each writes only half of the positions:
# every head misses the partner's positions (docs/sglang.md §3 "MHA DCP needs KV heads replicated
# inside a DCP group", §3.2 Llama row; inferred, not yet observed). No check rejects it (§2.4).
# The owner rule and the capacity accounting still hold; generation is expected to diverge.
cptest 1
scenario dcp2_llama_kv4 {
  description "DCP2 on TP2, tiny Llama with 4 KV heads (kv_heads > tp/dcp: expected no-go)"
  extends "defaults/tiny.cps"

  # the tiny model's geometry, written by cptest itself (cptest/run/models.py)
  model synthetic llama {
    layers 4
    hidden 256
    heads 8
    kv_heads 4
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
    capacity logical == 2 * physical within 0.01
    # Teacher-forced against the measured noise floor (docs/language.md "Generation parity"): the
    # control is the baseline's model at another TP degree; free-running by vLLM's top-k rule.
    violated generation logprob p99 <= 4 * control free_running topk 5 vs baseline because "kv_heads 4 > tp/dcp 1: DCP ranks hold different KV heads (docs/sglang.md §3, §4.2)"
  }
}
