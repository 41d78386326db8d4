# Candidate of docs/target-plan.md (not yet run): DCP2 on Qwen3-MoE, the support matrix's cell
# qwen3-moe kv<=tp/dcp dcp2 triton eager (D64). As dcp2_qwen3_kv1_eager on the tiny Qwen3-MoE (every
# layer a sparse block of 8 experts, 2 per token): attention is Qwen3's, sharded over attention-TP
# (models/qwen3_moe.py:459-474), the experts over MoE-TP = tp (each expert's intermediate split in two,
# layers/moe/fused_moe_triton/layer.py:307-308); DCP shards neither, only the KV cache.
# Qwen3MoeForCausalLM is a CP-v2 class: SGLang sets SGLANG_ENABLE_CP_V2 for it at every launch
# (server_args.py:6290-6302), but CP-v2 acts only on batches of a prefill CP strategy
# (layers/cp/utils.py:138-154, layers/cp/base.py:291), which DCP alone has not; no env is set here.
cptest 1
scenario dcp2_qwen3_moe_kv1_eager {
  description "DCP2 on TP2, tiny Qwen3-MoE (8 experts, top 2) with 1 KV head, eager decode: layout, capacity group, parity"
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
  baseline {
    tp 2
  }
  expect {
    rows kv_owner position % 2
    dcp handoff
    capacity logical == 2 * physical within 0.01
    # Teacher-forced against the measured noise floor (docs/language.md "Generation parity"): the
    # control runs the same experts at another TP degree, so routing flips between layouts are in it.
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
