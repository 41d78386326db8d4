# TP2 baseline: rows are replicated on both TP ranks (docs/architecture.md §9); TP1 is the parity
# reference, so generation differences here are the noise floor for the CP scenarios.
cptest 1
scenario tp2_llama_kv1 {
  description "TP2 baseline vs TP1, tiny Llama with 1 KV head"
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
  }
  baseline {
    tp 1
  }
  expect {
    rows replicated
    # Teacher-forced against the measured noise floor (docs/language.md "Generation parity"): the
    # control is the baseline's model at another TP degree; free-running by vLLM's top-k rule.
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
