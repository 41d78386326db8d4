# TP1 baseline of the Qwen3-MoE family on fa4 (scenarios/baselines/README.md): the
# model block is scenarios/qualification/dcp2_qwen3_moe_kv1_graph.cps's, seed included, so this archive is
# the one-GPU reference its CP runs compare with. tools/device/family_parity.py scores its outputs
# teacher-forced against transformers.
# fa4 is SGLang's vendored FlashAttention 4 (CuTe DSL), which has an SM90 path
# (kernels/ops/attention/flash_attn/cute/interface.py:1236-1237, flash_fwd_sm90.py).
cptest 1
scenario tp1_qwen3_moe_fa4 {
  description "TP1 tiny Qwen3-MoE on fa4: load, graph decode, graph vs eager parity"
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
    gpus 1
    tp 1
  }
  serve {
    attention_backend fa4
    cuda_graph_decode full
    # Tiny model, capped pool: a twentieth of the GPU leaves room for many baselines at once.
    mem_fraction 0.05
    # Graph capture up to batch 16 only: the workload runs 8 at a time, and capture is most of
    # a tiny model's start-up.
    flag "--cuda-graph-max-bs-decode" "16"
    # The flag list replaces the defaults' list, so their flag is repeated.
    flag "--disable-custom-all-reduce"
  }
  baseline none
  workload {
    requests 16
    concurrency 8
    prompt_tokens uniform(32, 256)
    output_tokens 16
    logprobs true
  }
  expect {
    launch accepted
    rows replicated
    graph decode captured
    graph parity vs eager free_running topk 5
    serving all_complete
  }
}
