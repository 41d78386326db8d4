# Rule zigzag_short_prompt (SGLang 0.5.17, silent, inferred; layers/cp/zigzag.py:109-119):
# `ZigzagCPStrategy.can_apply` is false when any extend of the batch is shorter than 2 * attn_cp
# tokens, and the batch then runs without CP on every rank, without a log line. Every prompt here is
# 2 or 3 tokens, below 2 * 2 = 4, so no extend step may be split (SGLang's own 3-token warm-up
# request too). SGLANG_ENABLE_CP_V2=1 removes the other reason 0.5.17 never splits on Qwen3 (not a
# CP-v2 model class, layers/cp/utils.py:42-52; docs/sglang.md §3): without it rows would fail
# whatever the rule says. With it, a long extend would take the CP-v2 path, which crashed in triton's
# KV-cache kernel on this machine (results/_smoke, case b2): only short prompts are sent.
# Judged by `rows` (plan.lint.CONTRADICTS), on its raw verdict (before `violated` is applied):
# - confirmed: rows fails with "none of N extend step(s) was split: each held an extend shorter
#   than 4 tokens" (cp_active false on both ranks in every extend step);
# - refuted: rows passes, the short extends were split by zigzag over the 2 ATTN_CP ranks.
cptest 1
scenario zigzag_short_prompt {
  description "PCP2 zigzag on TP2, tiny Qwen3, every prompt shorter than 2 * attn_cp tokens"
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
    cp_strategy zigzag
  }
  serve {
    env "SGLANG_ENABLE_CP_V2" "1"
  }
  baseline none
  workload {
    requests 16
    concurrency 4
    prompt_tokens uniform(2, 3)
    output_tokens 8
  }
  expect {
    violated rows split zigzag on sglang "0.5.17" because "every extend is shorter than 2 * attn_cp = 4 tokens: can_apply is false and the batch runs without CP (layers/cp/zigzag.py:109-119)"
  }
}
