# Probe of a ruled-out cell (docs/target-plan.md "Ruled out by the source, no archive"; D64): PCP2
# zigzag on Qwen3-MoE with triton, cell qwen3-moe kv<=tp/dcp pcp2-zigzag triton eager, ruled out by the
# inferred rule pcp_backend_without_cp_path. Qwen3-MoE is the MHA family on which 0.5.17's PCP runs at
# all: Qwen3MoeForCausalLM is in CP_V2_DEFAULT_MODEL_CLASSES (layers/cp/utils.py:42-52), so SGLang sets
# SGLANG_ENABLE_CP_V2 itself (server_args.py:6290-6302; no env here) and extends of >= 2 x attn_cp
# tokens are split zigzag (layers/cp/zigzag.py:109-119) - unlike dense Qwen3, where the flags were a
# silent no-op (results/pcp2_zigzag_qwen3_kv2). Attention is sharded over attention-TP (1 here), so
# both CP ranks hold the one KV head.
# - Row split: CP rank r owns zigzag blocks r and 3-r of every sequence (docs/sglang.md §5).
# - Generation is expected to diverge: only fa3 and trtllm_mha have a zigzag attention path
#   (layers/cp/zigzag.py:337-341); fa3's run of this model is pcp2_zigzag_qwen3_moe_kv1_fa3.
#   With CP-v2 forced on dense Qwen3, triton crashed at the first batched extend (docs/sglang.md
#   §3.2, probe smoke case b2). The run decides which, and turns the inferred rule into evidence for
#   this family.
# - PCP adds no KV capacity (§5): no capacity entry.
cptest 1
scenario pcp2_zigzag_qwen3_moe_kv1 {
  description "PCP2 zigzag on TP2, tiny Qwen3-MoE (8 experts, top 2) with 1 KV head, triton (expected no-go)"
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
  baseline {
    tp 2
  }
  expect {
    rows split zigzag
    pcp rows
    violated generation logprob p99 <= 4 * control free_running topk 5 vs baseline because "triton has no zigzag CP attention path: only fa3 and trtllm_mha do (layers/cp/zigzag.py:337-341; inferred)"
  }
}
