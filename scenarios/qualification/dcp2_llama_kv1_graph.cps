# Requirement of docs/target-plan.md (P1: DCP2 on MHA with kv_heads <= tp/dcp, triton).
# Graph evidence: decode graphs captured and replayed on both ranks, and the replayed decode agrees with
# the TP2 baseline as the eager one must (free-running by vLLM's top-k rule).
cptest 1
scenario dcp2_llama_kv1_graph {
  description "DCP2 on TP2, tiny Llama with 1 KV head, CUDA-graph decode: parity on replayed graphs"
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
  serve {
    # The default CUDA-graph decode: decode graphs stay on with DCP (docs/sglang.md §7). Module hooks
    # do not fire on replay; the probe records each replay's rows and positions (D58), but the KV
    # write and its owner mask run inside the graph, so this scenario judges what the graph computes.
    cuda_graph_decode full
  }
  baseline {
    tp 2
  }
  expect {
    # Rows under replay: DCP splits no rows, so every rank of the group runs each step, replays
    # included, on the same rows and positions. The K/V owner of a position written inside a graph
    # is not observable (`rows kv_owner` says unknown for it); the eager scenario judges the owners.
    rows replicated
    capacity logical == 2 * physical within 0.01
    capacity adapter
    # Teacher-forced against the measured noise floor (docs/language.md "Generation parity").
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
    graph decode captured
  }
}
