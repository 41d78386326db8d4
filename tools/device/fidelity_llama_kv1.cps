# The request set of tools/device/fidelity.py: cptest's client and sglang.bench_serving are both
# given these requests (the plan's token ids), against one TP1 server of the tiny Llama.
cptest 1
scenario fidelity_llama_kv1 {
  description "Workload fidelity: cptest's client vs sglang.bench_serving on one request set"
  extends "../../scenarios/defaults/tiny.cps"
  model local "../../.tiny-models/llama-kv1"
  facts {
    architecture "LlamaForCausalLM"
    layers 4
    hidden 256
    heads 8
    kv_heads 1
    head_dim 64
    vocab 4096
  }
  topology {
    gpus 1
    tp 1
  }
  baseline none
  workload {
    requests 256
    concurrency 32
    prompt_tokens uniform(64, 512)
    output_tokens 256
  }
  expect {
    rows replicated
  }
}
