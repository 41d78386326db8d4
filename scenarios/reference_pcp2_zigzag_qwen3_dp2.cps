# PCP2 zigzag with attention DP 2 on TP4, tiny Qwen3 (attention TP 1): each DP rank runs its own
# requests through attention, split over its two CP ranks, and the MLP runs over the attention-DP
# buffer of both DP ranks' rows (SGLang 0.5.17 sizes it in prepare_mlp_sync_batch,
# docs/sglang.md §5). `pcp rows` judges each DP rank's slice of that buffer from every rank's record
# of it. The reference engine implements the contract; the SGLang run of the same layout is
# scenarios/qualification/pcp2_zigzag_qwen3_moe_kv1_fa3_dp2.cps.
cptest 1
scenario reference_pcp2_zigzag_qwen3_dp2 {
  description "PCP2 zigzag with attention DP 2 on TP4, tiny Qwen3 with 2 KV heads"
  extends "defaults/tiny.cps"
  engine reference "builtin"
  model synthetic qwen3 {
    layers 4
    hidden 256
    heads 8
    kv_heads 2
    head_dim 64
    vocab 4096
    intermediate 512
    seed 7
  }
  topology {
    gpus 4
    tp 4
    attn_cp 2
    attn_dp 2
    cp_strategy zigzag
  }
  baseline {
    tp 4
  }
  workload {
    requests 8
    concurrency 4
  }
  expect {
    rows split zigzag ffn gathered
    pcp rows
    generation logprob p99 <= 4 * control logprob max <= 0.001 free_running topk 5 vs baseline
  }
}
