# Rule pcp_cp_v1_interleave_zigzag (SGLang 0.5.17, silent, observed; models/qwen3_moe.py:989-997,
# layers/utils/cp_utils.py:470-673): with SGLANG_ENABLE_CP_V2 off, Qwen3-MoE splits prefill rows on
# its own CP-v1 path, whose metadata, prepare_context_parallel_metadata, has one layout outside DSA's
# round robin: zigzag. ServerArgs accepts --cp-strategy interleave here (CP v2's switch and the
# strategy binding run on the CPU in tests/sglang_src/test_rules_differential.py), so the rows are
# expected split zigzag where interleave was asked. The metadata and the probe's reading of it run on
# the CPU too (tests/sglang_src/test_topology_differential.py); the forward needs this run.
# fa3 is the backend with a CP-v1 attention path (layers/attention/flashattention_backend.py:1144-1148).
# Judged by `pcp rows` (plan.lint.CONTRADICTS), on its raw verdict, which judges split steps only:
# - confirmed: a split step's shards are zigzag's, not interleave's (pcp rows fails on the order);
# - refuted: the shards are interleave's (pcp rows holds);
# - untested: nothing is split (pcp rows unknown). `rows split` then fails as a silent fallback,
#   which is why it shows the run but does not judge the rule: it fails on either defect.
# Generation is expected to hold against TP2: zigzag is a correct split, only not the one asked for.
# Confirmed on one H200 with co-located ranks: results/pcp_cp_v1_interleave_zigzag/20261205T042659Z-ffc6ee5a.
cptest 1
scenario pcp_cp_v1_interleave_zigzag {
  description "PCP2 interleave on TP2 with CP v2 off, tiny Qwen3-MoE with 1 KV head, fa3 (expected: rows split zigzag)"
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
    attn_cp 2
    cp_strategy interleave
  }
  serve {
    attention_backend fa3
    env "SGLANG_ENABLE_CP_V2" "0"
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
    violated rows split interleave on sglang "0.5.17" because "CP v1's metadata is zigzag whatever the strategy (layers/utils/cp_utils.py:470-673)"
    violated pcp rows on sglang "0.5.17" because "CP v1's metadata is zigzag whatever the strategy (layers/utils/cp_utils.py:470-673)"
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
