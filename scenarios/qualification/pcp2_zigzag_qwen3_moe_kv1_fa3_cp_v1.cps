# PCP2 zigzag on Qwen3-MoE with CP v2 switched off: the model's own CP-v1 split
# (models/qwen3_moe.py:989-997), the path of every CP-v1 class (DeepSeek V2/V3 and V3.2's zigzag
# too), which the probe reads at cp_split_and_rebuild_position (layers/utils/cp_utils.py:150). The
# twin of pcp2_zigzag_qwen3_moe_kv1_fa3, which takes CP v2 by the class default.
# - Row split: CP rank r owns zigzag blocks r and 3-r of every sequence, as on CP v2, but unpadded:
#   attention runs over the rank's own rows, and the MoE gather pads each shard to the longest
#   (layers/communicator.py:1247-1273); `pcp rows` judges by that (its plan says `cp_v1`).
# - Generation against TP2: fa3 has a CP-v1 attention path (flashattention_backend.py:1144-1148).
# - PCP adds no KV capacity (docs/sglang.md §5): no capacity entry.
cptest 1
scenario pcp2_zigzag_qwen3_moe_kv1_fa3_cp_v1 {
  description "PCP2 zigzag on TP2 with CP v2 off, tiny Qwen3-MoE (8 experts, top 2) with 1 KV head, fa3, eager decode"
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
    gpus 2
    tp 2
    attn_cp 2
    cp_strategy zigzag
  }
  serve {
    attention_backend fa3
    env "SGLANG_ENABLE_CP_V2" "0"
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
