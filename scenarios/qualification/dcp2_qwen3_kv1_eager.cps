# Requirement of docs/target-plan.md (P1: DCP2 on MHA with kv_heads <= tp/dcp, triton).
# As dcp2_llama_kv1_eager on Qwen3, which shards attention over attention-TP (models/qwen3.py:86-92).
cptest 1
scenario dcp2_qwen3_kv1_eager {
  description "DCP2 on TP2, tiny Qwen3 with 1 KV head, eager decode: layout, capacity group, parity"
  extends "../defaults/tiny.cps"
  model synthetic qwen3 {
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
    capacity adapter
    # Teacher-forced against the measured noise floor (docs/language.md "Generation parity").
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
