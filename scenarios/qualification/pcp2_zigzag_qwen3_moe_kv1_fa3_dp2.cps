# Candidate (not yet run): PCP2 zigzag with attention DP 2 on the CP-v2 class Qwen3-MoE with fa3,
# the combination whose MLP input is the attention-DP group's gathered buffer. TP4 is the smallest
# TP that 0.5.17's rule admits (tp % (dp_size * attn_cp_size) == 0, server_args.py:6343-6345);
# attention-TP is tp / (dp * attn_cp) = 1. `pcp rows` judges the split and, from each rank's record
# of the attention-DP buffer its forward sized (evidence schema v7), each DP rank's slice of it.
cptest 1
scenario pcp2_zigzag_qwen3_moe_kv1_fa3_dp2 {
  description "PCP2 zigzag with attention DP 2 on TP4, tiny Qwen3-MoE (8 experts, top 2), fa3, eager decode"
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
    attn_cp 2
    attn_dp 2
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
    prompt_tokens uniform(64, 512)
    output_tokens 8
    logprobs true
  }
  expect {
    rows split zigzag
    pcp rows
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
