# The support matrix's cell qwen3-moe kv>tp/dcp pcp2-zigzag fa3 eager: PCP2 zigzag on the
# CP-v2 class Qwen3-MoE with fa3, one of the two backends with a zigzag attention path
# (layers/cp/zigzag.py:337-341; layers/attention/flashattention_backend.py:1163-1189). fa3's kernels
# come with the kernel extras (tools/device/README.md). SGLang turns CP-v2 on itself for this class
# (server_args.py:6290-6302), so no env is set. Attention is sharded over attention-TP (1 here): both
# CP ranks hold all 4 KV head(s). The triton run of the same model is pcp2_zigzag_qwen3_moe_kv1.
cptest 1
scenario pcp2_zigzag_qwen3_moe_kv4_fa3 {
  description "PCP2 zigzag on TP2, tiny Qwen3-MoE (8 experts, top 2) with 4 KV head(s), fa3, eager decode"
  extends "../defaults/tiny.cps"
  model synthetic qwen3_moe {
    layers 4
    hidden 256
    heads 8
    kv_heads 4
    head_dim 64
    vocab 4096
    intermediate 512
    seed 7
    experts 8
    experts_per_tok 2
    moe_intermediate 128
  }
  topology {
    gpus 2
    tp 2
    attn_cp 2
    cp_strategy zigzag
  }
  serve {
    attention_backend fa3
  }
  baseline {
    tp 2
  }
  expect {
    rows split zigzag
    pcp rows
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
