# TP2 baseline: rows are replicated on both TP ranks (architecture.md §3); TP1 is the parity
# reference, so generation differences here are the noise floor for the CP scenarios.
cptest 1
scenario tp2_llama_kv1 {
  description "TP2 baseline vs TP1, tiny Llama with 1 KV head"
  extends "defaults/tiny.cps"
  model local "../.tiny-models/llama-kv1"
  facts {
    architecture "LlamaForCausalLM"
    layers 4
    hidden 256
    heads 8
    kv_heads 1
    head_dim 64
    vocab 4096
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
    generation tokens_agree >= 0.95 logprob_within 0.05 vs baseline
  }
}
