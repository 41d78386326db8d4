# TP4 + DCP4 on a synthetic MLA model with DeepSeek-V3's attention geometry (128 heads,
# kv_lora_rank 512, q_lora_rank 1536, nope 128, rope 64, v 128, hidden 7168), 2 dense layers.
# MLA stores one latent KV per token on every rank, so DCP4 is layout-consistent and capacity
# grows x4 (docs/sglang.md §4.2). With kv_lora 512 / rope 64 the FlashInfer MLA backend applies,
# which has a DCP path (§3.1); triton's DCP path is MHA-only.
cptest 1
scenario dcp4_mla_dsv3_geometry {
  description "TP4 + DCP4, DeepSeek-V3 MLA geometry (synthetic, 2 layers)"
  extends "defaults/tiny.cps"
  model synthetic deepseek_mla {
    layers 2
    hidden 7168
    heads 128
    kv_heads 128
    vocab 8192
    intermediate 18432
    kv_lora_rank 512
    q_lora_rank 1536
    qk_nope_head_dim 128
    qk_rope_head_dim 64
    v_head_dim 128
  }
  topology {
    gpus 4
    tp 4
    dcp 4
  }
  serve {
    attention_backend flashinfer
    mem_fraction 0.5
  }
  baseline {
    tp 4
  }
  expect {
    rows kv_owner position % 4
    capacity logical == 4 * physical within 0.01
    # Teacher-forced against the measured noise floor (docs/language.md "Generation parity"): the
    # control is the baseline's model at another TP degree; free-running by vLLM's top-k rule.
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
