# SIGTERM to the server after 4 requests: the tokenizer manager drains (logs every 5 s), sends
# ShutdownReq, kills schedulers still alive after 15 s, then kills the process tree
# (docs/sglang.md §10; "Draining requests" at tokenizer_manager.py:3749 in 0.5.17).
# The accepted exit statuses are declared: a clean 0, or death by the signal / its own SIGKILL.
cptest 1
scenario sigterm_shutdown {
  description "graceful SIGTERM shutdown of a TP2 server under load"
  extends "defaults/tiny.cps"

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
  }
  baseline none
  fault sigterm server after 4 requests
  expect {
    serving completed >= 4 of 32
    shutdown within 60s gpu_memory_released no_orphans exit_status in (0, -15, 143, -9, 137)
    log contains "SIGTERM received"
  }
}
