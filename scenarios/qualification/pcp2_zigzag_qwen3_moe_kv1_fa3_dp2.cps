# PCP2 zigzag with attention DP 2 on the CP-v2 class Qwen3-MoE with fa3, the combination whose MLP
# input is the attention-DP group's gathered buffer. TP4 is the smallest TP that 0.5.17's rule admits
# (tp % (dp_size * attn_cp_size) == 0, server_args.py:6343-6345); attention-TP is tp / (dp * attn_cp)
# = 1. `pcp rows` judges the split and, from each rank's record of the attention-DP buffer its forward
# sized (evidence schema v7), each DP rank's slice of it.
# A no-go on 0.5.17 (rule pcp_attention_dp_gather, observed): the launch's warm-up decode pads both DP
# ranks to the longest and all-gathers each rank's rows over the TP group, 4 ranks here, into a
# buffer of 2 slices (layers/dp_attention.py:490-523, model_executor/forward_batch_info.py:1291-1298):
# `ValueError: output tensor size must be equal to world_size times input tensor size` and the
# scheduler dies, co-located on one H100:
# results/pcp2_zigzag_qwen3_moe_kv1_fa3_dp2/20261205T101404Z-1321b4d3. So the launch is declared
# violated; the other contracts stay what a fixed release should show.
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
    violated launch accepted because "the MLP's attention-DP gather all-gathers over the TP group, attn_cp times the buffer's DP slices: the first padded decode raises (layers/dp_attention.py:490-523)"
    rows split zigzag
    pcp rows
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
