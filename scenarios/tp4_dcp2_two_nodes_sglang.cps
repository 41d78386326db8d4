# TP4 + DCP2 over two nodes of two GPUs each: the suite's multi-node scenario. SGLang starts one
# server per node with --nnodes 2 --node-rank k --dist-init-addr of node 0 (docs/sglang.md); the
# DCP groups span the TP ranks as on one node. Kubernetes: `cptest compile --target lws` renders it
# as one LeaderWorkerSet of size 2 per server (docs/kubernetes.md); tests/k8s/golden/ pins that.
# The tiny Llama has 1 KV head, so kv_heads 1 <= tp/dcp = 2 and both ranks of a DCP group hold the
# same (replicated) head: the layout is consistent (docs/sglang.md §3, §4.2), as in dcp2_llama_kv1.
cptest 1
scenario tp4_dcp2_two_nodes_sglang {
  description "TP4 + DCP2 on two nodes of 2 GPUs, tiny Llama with 1 KV head"
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
    gpus 4
    nodes 2
    tp 4
    dcp 2
  }

  # TP4 without CP, on the same two nodes (the baseline keeps the main topology's nodes).
  baseline {
    tp 4
  }
  expect {
    rows kv_owner position % 2
    capacity logical == 2 * physical within 0.01
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
    log contains "DCP enabled, dcp_size=2, tp_size=4"
  }
}
