# Capacity transitions (issue 13 item 4, docs/decisions.md D59): the KV pool of a TP2/DCP2 server
# filled past 90 % and drained to zero, with requests admitted and finished throughout.
# - `fill_drain 0.95` sizes the closed loop from the pool (docs/language.md, workload): every
#   request takes 256 tokens (240 + 16); SGLang 0.5.17 reads max_total_tokens 4096 as rows per rank,
#   8192 logical tokens at DCP2 (docs/sglang.md §4.2), so 31 requests hold 95 % and a 32nd waits;
#   the reference engine reads it as the logical capacity (4096: 16 held, a 17th waits).
# - `capacity transitions` judges every pool sample of every rank: allocator total == 2 x rows,
#   the scheduler's total equal to it, a sample at >= 90 % with a request waiting, each rank's
#   last sample drained with 0 tokens in use (the radix cache's evictable tokens reported apart),
#   both DCP ranks equal at every scheduler iteration they both sampled.
cptest 1
scenario capacity_transitions_dcp2_llama_kv1 {
  description "TP2/DCP2 tiny Llama: KV pool filled past 90 % and drained, judged at every sample"
  extends "../defaults/tiny.cps"
  engine sglang "0.5.17"

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
    max_total_tokens 4096
  }
  baseline none
  workload {
    requests 64
    prompt_tokens 240
    output_tokens 16
    fill_drain 0.95
  }
  expect {
    capacity logical == 2 * physical within 0.01
    capacity adapter
    capacity transitions peak >= 0.9
  }
}
