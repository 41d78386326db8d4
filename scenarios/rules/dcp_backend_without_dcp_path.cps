# Rule dcp_backend_without_dcp_path (SGLang 0.5.17, silent, inferred;
# layers/attention/triton_backend.py:182-187): among MHA backends only triton has DCP code in 0.5.17
# (owner-masked KV writes at out_cache_loc // dcp, Q all-gather, LSE merge; triton_backend.py:
# 1228-1240, 1797-1830). Another backend gets the widened allocator slots and no DCP path.
# flashinfer is the non-triton MHA backend of the base bundle (fa3 comes with the kernel extras).
# 1 KV head at TP2/DCP2 keeps the KV heads replicated in the DCP group, so rule
# mha_dcp_kv_not_replicated does not apply: what goes wrong here is the backend's. dcp_disables_prefill_graph also applies (any dcp > 1) and no
# contract of this scenario judges it.
# Judged by `rows` and `generation` (plan.lint.CONTRADICTS), on their raw verdicts (before
# `violated` is applied):
# - confirmed: rows fails (a K/V position written by both DCP ranks, or by the wrong one) or
#   generation fails against the TP2 flashinfer baseline (TP1 control as noise floor);
# - refuted: both hold (flashinfer writes only owned positions and decodes right).
cptest 1
scenario dcp_backend_without_dcp_path {
  description "DCP2 on TP2 with the flashinfer backend, tiny Llama with 1 KV head"
  extends "../defaults/tiny.cps"

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
    gpus 2
    tp 2
    dcp 2
  }
  serve {
    attention_backend flashinfer
  }
  baseline {
    tp 2
  }
  workload {
    requests 16
    concurrency 8
    prompt_tokens uniform(64, 256)
    output_tokens 16
  }
  expect {
    violated rows kv_owner position % 2 on sglang "0.5.17" because "flashinfer has no DCP owner-masked write (only triton does, triton_backend.py:1228-1240)"
    violated generation logprob p99 <= 4 * control free_running topk 5 vs baseline on sglang "0.5.17" because "flashinfer has no DCP decode path (Q all-gather, LSE merge: triton only, triton_backend.py:182-187)"
    log contains "DCP enabled, dcp_size=2, tp_size=2"
    log absent "Traceback"
  }
}
