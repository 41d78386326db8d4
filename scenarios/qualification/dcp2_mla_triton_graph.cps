# Candidate of docs/target-plan.md (not yet run): scenarios/dcp2_mla.cps with CUDA-graph decode.
# triton's DCP code is MHA's (docs/sglang.md §3.1), so generation is expected to diverge (inferred), as
# dcp2_mla declares; the run decides it.
cptest 1
scenario dcp2_mla_triton_graph {
  description "DCP2 on TP2, tiny DeepSeek MLA, triton, CUDA-graph decode"
  extends "../defaults/tiny.cps"
  model synthetic deepseek_mla {
    layers 4
    hidden 256
    heads 8
    kv_heads 8
    vocab 4096
    intermediate 512
    seed 4321
    kv_lora_rank 64
    q_lora_rank 128
    qk_nope_head_dim 32
    qk_rope_head_dim 16
    v_head_dim 32
  }
  topology {
    gpus 2
    tp 2
    dcp 2
  }
  serve {
    cuda_graph_decode full
  }
  baseline {
    tp 2
  }
  expect {
    violated generation logprob p99 <= 4 * control free_running topk 5 vs baseline because "triton implements DCP for MHA only (docs/sglang.md §3.1)"
    graph decode captured
  }
}
