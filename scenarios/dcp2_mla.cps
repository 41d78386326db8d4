# DCP2 on a tiny DeepSeek-V3-style MLA model (TP2). MLA keeps one latent KV per token whatever
# the TP size, so the DCP group always holds the same KV and capacity grows by dcp (§4.2:
# "MLA unchanged" cell size, logical = rows x dcp).
# The tiny model works with triton attention only (make-tiny-models: FlashInfer MLA needs
# kv_lora 512 / rope 64); §3.1 lists DCP for MLA only on flashinfer-MLA, flashmla and trtllm_mla,
# and triton's DCP path is MHA-only, so generation is expected to diverge (inferred).
cptest 1
scenario dcp2_mla {
  description "DCP2 on TP2, tiny DeepSeek MLA"
  extends "defaults/tiny.cps"

  # tiny DeepSeek-V3-style MLA, written by cptest itself (cptest/run/models.py)
  model synthetic deepseek_mla {
    layers 4
    hidden 256
    heads 8
    kv_heads 8
    vocab 4096
    intermediate 512
    seed 4321
    kv_lora_rank 64
    q_lora_rank 128
    qk_nope_head_dim 32
    qk_rope_head_dim 16
    v_head_dim 32
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
    violated generation logprob p99 <= 4 * control free_running topk 5 vs baseline because "triton implements DCP for MHA only (docs/sglang.md §3.1)"
  }
}
