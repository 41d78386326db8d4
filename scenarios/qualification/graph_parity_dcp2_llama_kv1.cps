# Graph qualification (issue 13): DCP2 on TP2 with decode CUDA graphs captured, compared with the
# same layout run eagerly (the plan's eager twin: every CUDA-graph phase disabled), teacher-forced
# and along the free-running outputs, against the measured noise floor (docs/language.md "Graph
# parity", docs/decisions.md D60).
# - teacher-forced: both score the baseline's sequences (one prefill forward each: prefill graphs,
#   not declared here, would be compared there);
# - decode: the free-running outputs along each pair's common prefix, where main replays decode
#   graphs and the twin runs eager forwards on the same history;
# - the floor: the control (the baseline at TP1) against the baseline, the same two measures.
# The CPU reference engine has no CUDA graphs: there main and twin run the same code, the graph
# parity verdict says so, and `graph decode captured` is the declared violation.
cptest 1
scenario graph_parity_dcp2_llama_kv1 {
  description "DCP2 on TP2, tiny Llama with 1 KV head: decode CUDA graphs against the eager twin"
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
    # Decode graphs on the main server (docs/sglang.md §7: they stay on with DCP); the eager twin
    # gets every phase disabled from the plan. No row contract here: the KV positions written inside
    # a replay cannot be judged (D58), so `rows kv_owner` would be unknown.
    cuda_graph_decode full
  }
  baseline {
    tp 2
  }
  expect {
    violated graph decode captured on reference because "the CPU reference engine has no CUDA graphs"
    graph parity vs eager logprob p99 <= 4 * control logprob max <= 8 * control free_running topk 5
  }
}
