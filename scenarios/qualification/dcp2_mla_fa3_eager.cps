# The support matrix's cell mla latent dcp2 fa3 eager: DCP2 on the tiny DeepSeek-style MLA
# model with fa3 (layers/attention/flashattention_backend.py), whose DCP path is not read yet.
# The kernels come with the kernel extras (tools/device/README.md). The geometry (kv_lora 512, rope
# 64) is DeepSeek's, which FlashMLA needs; as dcp2_mla_flashinfer_eager otherwise. MLA keeps one
# latent KV per token, so the DCP group's capacity grows by dcp (docs/sglang.md §4.2).
cptest 1
scenario dcp2_mla_fa3_eager {
  description "DCP2 on TP2, tiny DeepSeek MLA, fa3, eager decode"
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
    attention_backend fa3
  }
  baseline {
    tp 2
  }
  expect {
    rows kv_owner position % 2
    dcp handoff
    capacity logical == 2 * physical within 0.01
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
