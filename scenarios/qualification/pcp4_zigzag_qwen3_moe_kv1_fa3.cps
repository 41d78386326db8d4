# PCP4 zigzag on TP4 on the CP-v2 class Qwen3-MoE with fa3 (as pcp2_zigzag_qwen3_moe_kv1_fa3, at four
# ranks): CP rank r owns zigzag blocks r and 7-r of every long extend. Co-located, four ranks'
# collectives go over loopback sockets, so the workload is a few requests; prompts are >= 2 x attn_cp
# tokens so that every extend is split (docs/sglang.md §5). The kernels come with the kernel extras.
cptest 1
scenario pcp4_zigzag_qwen3_moe_kv1_fa3 {
  description "PCP4 zigzag on TP4, tiny Qwen3-MoE (8 experts, top 2) with 1 KV head, fa3, small workload"
  extends "../defaults/tiny.cps"
  model synthetic qwen3_moe {
    layers 4
    hidden 256
    heads 8
    kv_heads 1
    head_dim 64
    vocab 4096
    intermediate 512
    seed 7
    experts 8
    experts_per_tok 2
    moe_intermediate 128
  }
  topology {
    gpus 4
    tp 4
    attn_cp 4
    cp_strategy zigzag
  }
  serve {
    attention_backend fa3
  }
  baseline {
    tp 4
  }
  workload {
    requests 8
    concurrency 4
    prompt_tokens uniform(256, 1024)
    output_tokens 16
  }
  expect {
    rows split zigzag
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
