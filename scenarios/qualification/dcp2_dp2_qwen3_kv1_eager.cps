# Requirement of P1 (docs/target-plan.md): DCP2 inside attention DP 2 on TP4, tiny dense Qwen3 with one KV head,
# triton, eager decode. Attention TP is tp / dp = 2, so each DP rank's two ranks are one DCP group
# (0.5.17 builds these groups, executed on CPU, docs/sglang.md §2.4): it shards that DP rank's KV
# positions p % 2, and the MLP runs over the attention-DP buffer of both DP ranks' rows. Qwen3 shards
# attention over attention TP (models/qwen3.py:86-92), as attention DP needs. The reference engine
# passes every contract here (scenarios/reference_dcp2_dp2_llama.cps). SGLang's first run, co-located:
# results/dcp2_dp2_qwen3_kv1_eager/20261205T041819Z-d5f529c1 (capacity FAIL, C1; the rest PASS).
cptest 1
scenario dcp2_dp2_qwen3_kv1_eager {
  description "DCP2 inside attention DP 2 on TP4, tiny Qwen3 with 1 KV head, eager decode"
  extends "../defaults/tiny.cps"
  model synthetic qwen3 {
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
    gpus 4
    tp 4
    dcp 2
    attn_dp 2
  }
  baseline {
    tp 4
  }
  workload {
    requests 8
    concurrency 4
    prompt_tokens uniform(64, 512)
    output_tokens 8
    logprobs true
  }
  expect {
    rows kv_owner position % 2
    dcp handoff
    capacity logical == 2 * physical within 0.01
    capacity adapter
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
