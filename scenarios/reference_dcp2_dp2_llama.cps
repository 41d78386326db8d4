# DCP2 inside each attention-DP rank: TP4 with attention DP 2 (attention TP 2) and DCP 2, tiny Llama
# with one KV head. Each DP rank runs its own requests through attention; its two ranks are one DCP
# group, which shards that DP rank's KV positions p % 2 and merges decode attention by LSE; the MLP
# runs over the attention-DP buffer of both DP ranks' rows. SGLang 0.5.17 launches this layout and
# builds these groups (executed on CPU, docs/sglang.md §2.4); no SGLang run has judged it yet. The
# reference engine shards attention over attention TP whatever the family; SGLang's Llama does not
# (rule llama_attention_dp), so the SGLang run of this layout is dense Qwen3's:
# scenarios/qualification/dcp2_dp2_qwen3_kv1_eager.cps.
cptest 1
scenario reference_dcp2_dp2_llama {
  description "DCP2 inside attention DP 2 on TP4, tiny Llama with 1 KV head"
  extends "defaults/tiny.cps"
  engine reference "builtin"
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
  }
  expect {
    rows kv_owner position % 2
    dcp handoff
    capacity logical == 2 * physical within 0.01
    capacity adapter
    generation logprob p99 <= 4 * control logprob max <= 0.001 free_running topk 5 vs baseline
  }
}
