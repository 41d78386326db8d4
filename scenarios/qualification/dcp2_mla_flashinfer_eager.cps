# Candidate of docs/target-plan.md (not yet run): DCP2 on a tiny DeepSeek-V3-style MLA model with the
# FlashInfer MLA backend (`--attention-backend flashinfer` picks it for MLA, layers/attention/
# attention_registry.py:42-66), which has a DCP path (docs/sglang.md §3.1). FlashInfer's MLA kernels
# need kv_lora_rank 512 and a rope dimension of 64, hence this geometry. MLA keeps one latent KV per
# token, so the DCP group's capacity grows by dcp (§4.2).
cptest 1
scenario dcp2_mla_flashinfer_eager {
  description "DCP2 on TP2, tiny DeepSeek MLA, FlashInfer MLA, eager decode"
  extends "../defaults/tiny.cps"
  model synthetic deepseek_mla {
    layers 4
    hidden 256
    heads 8
    kv_heads 8
    vocab 4096
    intermediate 512
    seed 4321
    kv_lora_rank 512
    q_lora_rank 128
    qk_nope_head_dim 128
    qk_rope_head_dim 64
    v_head_dim 128
  }
  topology {
    gpus 2
    tp 2
    dcp 2
  }
  serve {
    attention_backend flashinfer
  }
  baseline {
    tp 2
  }
  expect {
    rows kv_owner position % 2
    dcp handoff
    capacity logical == 2 * physical within 0.01
    capacity adapter
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
