# Kill TP rank 1 of a DCP2 server after 8 requests. The watchdog sees the dead scheduler and
# sends SIGQUIT; the main process then SIGKILLs its children and itself (docs/sglang.md §10,
# tokenizer_manager.py:3753-3762 in 0.5.17), so the exit status is -9/137 by design, not 0.
# In-flight requests must fail, not hang; no process may survive; GPU memory must come back.
cptest 1
scenario fault_kill_rank_dcp2 {
  description "SIGKILL of one DCP rank under load"
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
    dcp 2
  }
  baseline none
  fault kill rank 1 after 8 requests
  expect {
    serving completed >= 8 of 32
    shutdown within 30s gpu_memory_released no_orphans exit_status in (-9, 137)
    log contains "SIGQUIT received"
  }
}
