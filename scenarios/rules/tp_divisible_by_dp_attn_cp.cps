# Rule tp_divisible_by_dp_attn_cp (SGLang 0.5.17, parse, inferred; server_args.py:6343-6345): with
# attn_cp > 1, tp must be divisible by dp_size * attn_cp_size. TP2 with attention DP 2 (0.5.17
# spelling: --dp-size 2 --enable-dp-attention) and attn_cp 2 passes the attn_cp check (2 % 2) and
# fails this one (2 % 4), so the launcher exits with
# AssertionError: tp_size must be divisible by dp_size * attn_cp_size
# before any GPU work. Never seen apart before: with dp 1 the attn_cp rule fires first.
# No scheduler is started, so none logs "Scheduler hit an exception" (the stage is parse).
# - confirmed: the server does not come up (launch verdict pass, with the message in the log);
# - refuted: the server comes up.
cptest 1
scenario tp_divisible_by_dp_attn_cp {
  description "TP2 with attention DP 2 and attn_cp 2: rejected at parse time"
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
    attn_dp 2
  }
  baseline none
  workload {
    requests 8
    concurrency 4
    prompt_tokens uniform(64, 256)
    output_tokens 8
  }
  expect {
    launch rejected matching "tp_size must be divisible by dp_size \* attn_cp_size"
    violated serving all_complete on sglang "0.5.17" because "the launch is rejected: no request is sent"
    # The launcher's assertion ends the process with status 1 before any server exists (seen on the
    # lent H200), not the -9/137 of a server torn down by its process group.
    shutdown within 60s gpu_memory_released no_orphans exit_status in (1)
    log absent "Scheduler hit an exception"
  }
}
