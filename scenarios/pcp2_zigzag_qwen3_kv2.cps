# PCP2 zigzag on a tiny Qwen3 (TP2, attn_cp 2). Qwen3 partitions attention over attention TP
# (docs/sglang.md §3, models/qwen3.py), which PCP needs, so the model side is consistent.
# - Row split: CP rank r owns zigzag blocks r and 3-r of every sequence (§5).
# - Generation: expected to agree with the TP2 baseline *if* the attention backend implements PCP;
#   §3.1 lists no PCP path for triton (zigzag is fa3/fa4/trtllm_mha; fa3 comes with the kernel
#   extras). Dense Qwen3 is not a CP-v2 class, so the flags are a silent no-op whatever the backend.
cptest 1
scenario pcp2_zigzag_qwen3_kv2 {
  description "PCP2 zigzag on TP2, tiny Qwen3 with 2 KV heads"
  extends "defaults/tiny.cps"

  # the tiny model's geometry, written by cptest itself (cptest/run/models.py)
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
    cp_strategy zigzag
  }
  baseline {
    tp 2
  }
  expect {
    rows split zigzag
    pcp rows
    # Teacher-forced against the measured noise floor (docs/language.md "Generation parity"): the
    # control is the baseline's model at another TP degree; free-running by vLLM's top-k rule.
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
