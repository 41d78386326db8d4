# Rule interleave_short_batch (SGLang 0.5.17, silent, inferred; layers/cp/interleave.py:64-69):
# `InterleaveCPStrategy.can_apply` is false when the batch holds fewer than attn_cp extend tokens,
# and the batch then runs without CP, without a log line. Every prompt here is 1 token and the load
# is closed-loop with one request in flight, so every extend batch holds 1 < attn_cp = 2 tokens.
# SGLANG_ENABLE_CP_V2=1 removes the other reason 0.5.17 never splits on Qwen3 (not a CP-v2 model
# class, layers/cp/utils.py:42-52; docs/sglang.md §3): without it rows would fail whatever the rule
# says. --skip-server-warmup: SGLang's warm-up request has 3 tokens (entrypoints/http_server.py:
# 2214), enough to take the interleave path, which is expected to fail on a non-DSA model
# (rule interleave_no_attention, layers/cp/interleave.py:222-233) before the workload starts.
# Written out in full rather than extending ../defaults/tiny.cps, to leave out `serving` (and
# `generation`): interleave_no_attention also applies to this configuration and is judged by those
# two contracts, but no CP extend runs here, so a pass would "refute" it without exercising it.
# Judged by `rows` (plan.lint.CONTRADICTS), on its raw verdict (before `violated` is applied):
# - confirmed: rows fails with "none of N extend step(s) was split: each held an extend shorter
#   than 2 tokens";
# - refuted: rows passes (the 1-token batches were split over the 2 ATTN_CP ranks).
cptest 1
scenario interleave_short_batch {
  description "PCP2 interleave on TP2, tiny Qwen3, every extend batch shorter than attn_cp tokens"
  engine sglang "0.5.17"

  # the tiny model's geometry, written by cptest itself (cptest/run/models.py)
  model synthetic qwen3 {
    layers 4
    hidden 256
    heads 8
    kv_heads 2
    head_dim 64
    vocab 4096
    intermediate 512
    seed 7
  }
  topology {
    gpus 2
    tp 2
    attn_cp 2
    cp_strategy interleave
  }
  serve {
    attention_backend triton
    cuda_graph_decode disabled
    max_total_tokens 65536
    mem_fraction 0.3
    sampling_backend pytorch
    skip_tokenizer_init true
    flag "--disable-custom-all-reduce"
    flag "--skip-server-warmup"
    env "SGLANG_ENABLE_CP_V2" "1"
  }
  baseline none
  workload {
    requests 8
    concurrency 1
    seed 7
    prompt_tokens 1
    output_tokens 8
    sampling greedy
    timeout 120s
  }
  expect {
    launch accepted
    violated rows split interleave on sglang "0.5.17" because "every extend batch holds 1 < attn_cp = 2 tokens: can_apply is false and the batch runs without CP (layers/cp/interleave.py:64-69)"
    graph decode disabled
    shutdown within 60s gpu_memory_released no_orphans
    log absent "Traceback"
  }
}
