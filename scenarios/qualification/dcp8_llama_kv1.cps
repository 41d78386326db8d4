# DCP8 on TP8 with the tiny Llama's one KV head (kv_heads 1 <= tp/dcp = 1: every rank of the DCP
# group holds the same head), the widest DCP the design card names. Co-located, eight ranks' collectives
# go over loopback sockets, so the workload is four short requests decoding 8 tokens each (every
# decode step crosses eight ranks over sockets); the contracts are those of
# dcp2_llama_kv1_eager at degree 8: owner rank = position % 8, capacity x8, parity with TP8.
cptest 1
scenario dcp8_llama_kv1 {
  description "DCP8 on TP8, tiny Llama with 1 KV head, eager decode, small workload"
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
    gpus 8
    tp 8
    dcp 8
  }
  baseline {
    tp 8
  }
  workload {
    requests 4
    concurrency 4
    prompt_tokens uniform(64, 192)
    output_tokens 8
  }
  expect {
    rows kv_owner position % 8
    capacity logical == 8 * physical within 0.01
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
    log contains "DCP enabled, dcp_size=8, tp_size=8"
  }
}
