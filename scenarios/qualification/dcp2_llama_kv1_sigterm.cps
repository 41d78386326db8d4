# Requirement of docs/target-plan.md (P1: DCP2 on MHA with kv_heads <= tp/dcp, triton).
# Reclamation on a graceful stop: SIGTERM after 4 requests drains and exits (0.5.17 SIGKILLs its own
# process group, docs/sglang.md §10); nothing left, GPU memory back to its pre-launch level.
cptest 1
scenario dcp2_llama_kv1_sigterm {
  description "DCP2 on TP2, tiny Llama with 1 KV head: graceful SIGTERM under load"
  extends "../defaults/tiny.cps"
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
  fault sigterm server after 4 requests
  expect {
    serving completed >= 4 of 32
    shutdown within 60s gpu_memory_released no_orphans exit_status in (0, -15, 143, -9, 137)
    log contains "SIGTERM received"
  }
}
