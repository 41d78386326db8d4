# SIGSTOP one DCP rank for 3 s under load, then SIGCONT. A stopped rank is slow, not dead: every
# collective waits for it, no request may fail or hang, and the server shuts down cleanly afterwards.
# Written for the reference engine (CI has no GPU); on SGLang the same contract holds if no watchdog
# fires within the stop (SGLang's default watchdog timeout is 300 s).
cptest 1
scenario reference_stop_rank_dcp2 {
  description "SIGSTOP / SIGCONT of one DCP rank under load"
  extends "defaults/tiny.cps"
  engine reference "builtin"
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
    concurrency 4
  }
  fault stop rank 1 at 1s for 3s
  expect {
    rows kv_owner position % 2
    serving all_complete
  }
}
