# Rule prefill_cp_needs_attn_cp (SGLang 0.5.17, silent, inferred; layers/cp/base.py:245-256):
# `--enable-prefill-cp --cp-strategy zigzag` with attn_cp 1 passes every parse-time check
# (server_args.py:6319-6345 checks divisibility only when attn_cp > 1) and `init_cp_strategy` leaves
# the strategy unset (base.py:249-251): the server runs, no error, nothing is split.
# cptest's layout rules refuse prefill CP with attn_cp 1 except in a scenario about admission, hence
# the `violated launch rejected` entry, which also states the first half of the claim (it launches).
# SGLANG_ENABLE_CP_V2=1 so that nothing but attn_cp <= 1 can be why no extend is split.
# Judged by `rows` (plan.lint.CONTRADICTS), on its raw verdict (before `violated` is applied):
# - confirmed: rows fails, every extend step ran with cp_active false;
# - refuted: rows passes (some extend was split). With one CP rank SGLang's own can_apply is false
#   (zigzag.py:109-110), so this archive can hardly refute it: if the launch is rejected instead,
#   rows is unknown and the rule stays untested for it, while the launch verdict shows the surprise.
cptest 1
scenario prefill_cp_needs_attn_cp {
  description "--enable-prefill-cp with attn_cp 1 on TP2, tiny Qwen3 (expected: accepted, never split)"
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
    prefill_cp true
    cp_strategy zigzag
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
    violated launch rejected because "0.5.17 does not reject --enable-prefill-cp with attn_cp 1: the strategy is left unset (layers/cp/base.py:245-256)"
    violated rows split zigzag on sglang "0.5.17" because "attn_cp 1: no CP strategy is bound, nothing is split (layers/cp/base.py:249-251)"
  }
}
