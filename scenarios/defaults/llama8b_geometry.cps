# Llama-3.1-8B's attention geometry (32 query heads, 8 KV heads, head dim 128, hidden 4096) on a
# synthetic 4-layer model, for the 4- and 8-GPU runs (issue 5): cptest writes the weights on the
# machine from the fixed seed and records their sha256 in the manifest; nothing is downloaded.
cptest 1
defaults {
  extends "tiny.cps"
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
  serve {
    max_total_tokens 131072
    mem_fraction 0.5
  }
  workload {
    requests 64
    concurrency 16
    prompt_tokens uniform(1024, 4096)
    output_tokens 64
  }
}
