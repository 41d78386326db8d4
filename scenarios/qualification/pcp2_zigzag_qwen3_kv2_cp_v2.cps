# PCP2 zigzag on dense Qwen3 with SGLang's CP-v2 path forced on (scenarios/pcp2_zigzag_qwen3_kv2.cps
# is the same without it). 0.5.17 splits prefill rows only on the CP-v2 path, which it turns on by
# itself only for CP_V2_DEFAULT_MODEL_CLASSES (layers/cp/utils.py:42-52; dense Qwen3 is not one), so
# without the variable the flags are accepted and nothing is split. With it, the zigzag split runs on
# a model class SGLang does not default it for, on triton, which has no zigzag attention path (only
# fa3 and trtllm_mha: layers/cp/zigzag.py:337-341). A one-rank probe smoke crashed the first batched
# extend this way (docs/sglang.md §3.2); this run decides it with both ranks and the contracts.
# - Row split: CP rank r owns zigzag blocks r and 3-r of every sequence (docs/sglang.md §5).
# - Generation: expected to diverge from TP2 or not to be served at all (no zigzag attention path).
cptest 1
scenario pcp2_zigzag_qwen3_kv2_cp_v2 {
  description "PCP2 zigzag on TP2, tiny Qwen3 with 2 KV heads, SGLANG_ENABLE_CP_V2=1 (expected no-go)"
  extends "../defaults/tiny.cps"
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
    gpus 2
    tp 2
    attn_cp 2
    cp_strategy zigzag
  }
  serve {
    env "SGLANG_ENABLE_CP_V2" "1"
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
