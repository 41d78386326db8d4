# TP1 baseline of the Qwen3-MoE family on torch_native (scenarios/baselines/README.md): the
# model block is scenarios/qualification/dcp2_qwen3_moe_kv1_graph.cps's, seed included, so this archive is
# the one-GPU reference its CP runs compare with. tools/device/family_parity.py scores its outputs
# teacher-forced against transformers.
# SGLang turns CUDA graphs off for torch_native (server_args.py:5751-5756), so this
# baseline is eager only: no graph parity.
cptest 1
scenario tp1_qwen3_moe_torch_native {
  description "TP1 tiny Qwen3-MoE on torch_native: load, eager decode"
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
    attention_backend torch_native
    # Tiny model, capped pool: a twentieth of the GPU leaves room for many baselines at once.
    mem_fraction 0.05
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
    graph decode disabled
    serving all_complete
  }
}
