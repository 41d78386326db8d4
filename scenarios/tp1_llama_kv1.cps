# TP-only baseline on one GPU: every rank holds every row (there is one rank).
# With tp2_llama_kv1.cps it calibrates the logprob noise between two equivalent baselines.
cptest 1
scenario tp1_llama_kv1 {
  description "TP1 baseline, tiny Llama with 1 KV head"
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
    gpus 1
    tp 1
  }
  baseline none
  expect {
    rows replicated
  }
}
