# The support matrix's cell mla latent pcp2-zigzag fa3 graph: PCP2 zigzag on the tiny DeepSeek-style
# MLA model (DeepseekV3ForCausalLM, a CP-v2 class: layers/cp/utils.py:42-52) with fa3, whose MLA
# path handles zigzag CP (layers/attention/flashattention_backend.py:1163-1168). The kernels come
# with the kernel extras (tools/device/README.md). PCP adds no KV capacity: no capacity entry.
cptest 1
scenario pcp2_zigzag_mla_fa3_graph {
  description "PCP2 zigzag on TP2, tiny DeepSeek MLA, fa3, graph decode"
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
    attn_cp 2
    cp_strategy zigzag
  }
  serve {
    attention_backend fa3
    cuda_graph_decode full
  }
  baseline {
    tp 2
  }
  expect {
    pcp rows
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
    graph decode captured
  }
}
