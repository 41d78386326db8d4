# TP4 + DCP4 with Llama-3.1-8B's attention geometry (32 query heads, 8 KV heads, head dim 128,
# hidden 4096) on a synthetic model with few layers, on one 4-GPU host.
# 8 KV heads > tp/dcp = 1: in 0.5.17 each rank's pool holds its TP shard of 2 KV heads
# (pool_configurator.py:290-296), so the DCP group holds four different shards and every head misses
# three quarters of its positions: generation is expected to diverge (docs/sglang.md §3.2, Llama DCP:
# "triton needs kv_heads <= tp/dcp (not Llama-3.x on <= 8 GPUs)"; inferred).
# The owner rule and the capacity accounting (logical = rows x 4) still hold.
#
# To run the real checkpoint instead, replace the model statement with
#   model hub "meta-llama/Llama-3.1-8B-Instruct" revision "<commit>" sha256 "<weights sha256>"
#   facts { architecture "LlamaForCausalLM" layers 32 hidden 4096 heads 32 kv_heads 8 head_dim 128 vocab 128256 }
# or with a downloaded copy: model local "/models/Llama-3.1-8B-Instruct" (facts come from its config.json).
cptest 1
scenario dcp4_llama {
  description "TP4 + DCP4, Llama-3.1-8B attention geometry (synthetic, 4 layers)"
  extends "defaults/tiny.cps"
  model synthetic llama {
    layers 4
    hidden 4096
    heads 32
    kv_heads 8
    head_dim 128
    vocab 8192
    intermediate 14336
    seed 7
  }
  topology {
    gpus 4
    tp 4
    dcp 4
  }
  serve {
    max_total_tokens 131072
    mem_fraction 0.5
  }
  baseline {
    tp 4
  }
  workload {
    requests 32
    concurrency 16
    prompt_tokens uniform(256, 1024)
    output_tokens 32
  }
  fault kill rank 2 after 16 requests
  expect {
    rows kv_owner position % 4
    capacity logical == 4 * physical within 0.01
    # Teacher-forced against the measured noise floor (docs/language.md "Generation parity"): the
    # control is the baseline's model at another TP degree; free-running by vLLM's top-k rule.
    violated generation logprob p99 <= 4 * control free_running topk 5 vs baseline because "kv_heads 8 > tp/dcp 1: DCP ranks hold different KV heads (docs/sglang.md §3.2)"
    serving completed >= 16 of 32
    shutdown within 30s gpu_memory_released no_orphans exit_status in (-9, 137)
    log contains "DCP enabled, dcp_size=4, tp_size=4"
  }
}
