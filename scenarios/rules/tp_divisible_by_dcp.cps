# Rule tp_divisible_by_dcp (SGLang 0.5.17, worker start, observed on the CPU by
# tests/sglang_src/test_rules_differential.py; distributed/parallel_state.py:
# 2283-2287): tp % dcp != 0 passes ServerArgs (0.5.17 has no parse-time check, docs/sglang.md §2.3)
# and every scheduler raises in initialize_model_parallel:
# RuntimeError: tensor_model_parallel_size (2) must be divisible by decode_context_parallel_size (3)
# Every scheduler logs "Scheduler hit an exception" (managers/scheduler.py:4948-4952): the stage is
# worker start, not parse. The rejection pattern is kept short: `cptest lint --evidence` reads a
# launch verdict that fails on the pattern as "the server came up".
# - confirmed: the server does not come up (launch verdict pass, with the message in the log);
# - refuted: the server comes up.
cptest 1
scenario tp_divisible_by_dcp {
  description "TP2 with DCP3: rejected in every scheduler at worker start"
  extends "../defaults/tiny.cps"

  # the tiny model's geometry, written by cptest itself (cptest/run/models.py)
  model synthetic llama {
    layers 4
    hidden 256
    heads 8
    kv_heads 1
    head_dim 64
    vocab 4096
    intermediate 512
    seed 7
  }
  topology {
    gpus 2
    tp 2
    dcp 3
  }
  baseline none
  workload {
    requests 8
    concurrency 4
    prompt_tokens uniform(64, 256)
    output_tokens 8
  }
  expect {
    launch rejected matching "must be divisible by decode_context_parallel_size \(3\)"
    violated serving all_complete on sglang "0.5.17" because "the launch is rejected: no request is sent"
    log contains "Scheduler hit an exception"
  }
}
