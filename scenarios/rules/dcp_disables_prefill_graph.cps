# Rule dcp_disables_prefill_graph (SGLang 0.5.17, parse-time warning, observed on the CPU (the
# resolved prefill graph backend) by tests/sglang_src/test_rules_differential.py;
# server_args.py:4440-4446, 4512-4520): with --dcp-size > 1 the default breakable prefill CUDA graph is turned off,
# with the warning "Breakable CUDA graph is incompatible with decode context parallel (dcp_size > 1);
# disabling prefill CUDA graph." The cascade is skipped when the prefill graph backend is given
# explicitly (server_args.py:4345-4346), so this scenario has no `rows` entry: rows makes cptest run
# eager and pass --cuda-graph-backend-prefill disabled itself. The prefill backend is left to
# SGLang's default (breakable).
# Expected if the rule holds: the warning is logged and no rank captures a prefill graph.
# - confirmed: `graph prefill captured` fails (no capture) and the log line is there;
# - refuted: a prefill graph is captured on every rank (and the line is absent).
# NOTE: `cptest lint --evidence` leaves this rule untested whatever this run shows:
# plan.lint.CONTRADICTS names no contract for it (the rule's stage is parse, but it has no
# exception, so hypotheses.py reads it as silent). Read this scenario's verdict instead.
cptest 1
scenario dcp_disables_prefill_graph {
  description "DCP2 on TP2, tiny Llama with 1 KV head, default prefill CUDA graph"
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
    dcp 2
  }
  baseline none
  workload {
    requests 16
    concurrency 8
    prompt_tokens uniform(64, 256)
    output_tokens 16
  }
  expect {
    violated graph prefill captured on sglang "0.5.17" because "DCP turns the breakable prefill CUDA graph off (server_args.py:4512-4520)"
    log contains "Breakable CUDA graph is incompatible with decode context parallel \(dcp_size > 1\); disabling prefill CUDA graph\."
    log absent "Traceback"
  }
}
