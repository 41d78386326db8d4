# The no-go of dcp2_llama_kv4 under decode CUDA graphs: 4 KV heads on TP2/DCP2 (kv_heads > tp/dcp = 1)
# leave the two DCP ranks with different KV heads, which 0.5.17 does not check on CUDA (docs/sglang.md
# §2.4); the eager run diverged at the second token (results/dcp2_llama_kv4). The graph is expected to
# compute the same wrong decode. Rows and owners stay right; capacity as for kv1.
cptest 1
scenario dcp2_llama_kv4_graph {
  description "DCP2 on TP2, tiny Llama with 4 KV heads (kv_heads > tp/dcp), CUDA-graph decode"
  extends "../defaults/tiny.cps"
  model synthetic llama {
    layers 4
    hidden 256
    heads 8
    kv_heads 4
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
    # Teacher-forced against the measured noise floor (docs/language.md "Generation parity").
    violated generation logprob p99 <= 4 * control free_running topk 5 vs baseline on sglang "0.5.17" because "kv_heads 4 > tp/dcp 1: the DCP ranks hold different KV heads (docs/sglang.md §2.4, §3.2)"
    graph decode captured
  }
}
