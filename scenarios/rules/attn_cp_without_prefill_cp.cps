# Rule attn_cp_without_prefill_cp (SGLang 0.5.17, silent, inferred; layers/cp/base.py:249-251):
# `--attn-cp-size 2` without `--enable-prefill-cp` builds the ATTN_CP groups and shrinks attention
# TP to 1, but `init_cp_strategy` binds no strategy (base.py:245-251), and `is_cp_v2_active` needs
# one (layers/cp/utils.py:138-153), so no extend is ever token-split. No error, no log line.
# SGLANG_ENABLE_CP_V2=1 removes the other reason 0.5.17 never splits on Qwen3 (not a CP-v2 model
# class, layers/cp/utils.py:42-52; docs/sglang.md §3): without it rows would fail whatever the rule
# says, and the run would confirm nothing. The missing --enable-prefill-cp is then the only cause left.
# Judged by `rows` (plan.lint.CONTRADICTS), on its raw verdict (before `violated` is applied):
# - confirmed: rows fails, every extend step ran with cp_active false on both ranks (prompts are
#   >= 64 tokens, so zigzag's short-extend fallback is not what stops it);
# - refuted: rows passes, extends were split by zigzag over the 2 ATTN_CP ranks.
cptest 1
scenario attn_cp_without_prefill_cp {
  description "attn_cp 2 without --enable-prefill-cp on TP2, tiny Qwen3 (expected: never split)"
  extends "../defaults/tiny.cps"

  # the tiny model's geometry, written by cptest itself (cptest/run/models.py)
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
  }
  serve {
    env "SGLANG_ENABLE_CP_V2" "1"
  }
  baseline none
  workload {
    requests 16
    concurrency 8
    prompt_tokens uniform(64, 256)
    output_tokens 16
  }
  expect {
    violated rows split zigzag on sglang "0.5.17" because "no --enable-prefill-cp: no CP strategy is bound, so no extend is split (layers/cp/base.py:245-251)"
  }
}
