# Candidate of docs/target-plan.md (not yet run): DCP2 on Qwen3-MoE with CUDA-graph decode, the support
# matrix's cell qwen3-moe kv<=tp/dcp dcp2 triton graph (D64). As dcp2_qwen3_kv1_graph on the tiny
# Qwen3-MoE; dcp2_qwen3_moe_kv1_eager says what is sharded where and why no env is set.
cptest 1
scenario dcp2_qwen3_moe_kv1_graph {
  description "DCP2 on TP2, tiny Qwen3-MoE (8 experts, top 2) with 1 KV head, CUDA-graph decode: parity on replayed graphs"
  extends "../defaults/tiny.cps"
  model synthetic qwen3_moe {
    layers 4
    hidden 256
    heads 8
    kv_heads 1
    head_dim 64
    vocab 4096
    intermediate 512
    seed 7
    experts 8
    experts_per_tok 2
    moe_intermediate 128
  }
  topology {
    gpus 2
    tp 2
    dcp 2
  }
  serve {
    # The default CUDA-graph decode: decode graphs stay on with DCP (docs/sglang.md §7); the fused
    # MoE kernels are captured with the rest of the decode step.
    cuda_graph_decode full
  }
  baseline {
    tp 2
  }
  expect {
    # Teacher-forced against the measured noise floor (docs/language.md "Generation parity").
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
    graph decode captured
  }
}
