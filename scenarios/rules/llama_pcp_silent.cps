# Rule llama_pcp_silent (SGLang 0.5.17, silent, inferred; models/llama.py:158-166): Llama shards its
# attention heads over the full TP group, not over attention TP (cf. models/qwen3.py:86-92), so with
# prefill CP the CP partners hold different query-head shards: wrong output, no error. With 1 KV head
# the K rows Llama computes (max(1, 1 // tp 2) = 1 head) fit the pool row (max(1, 1 // attn_tp 1) =
# 1), so the observed crash of rule llama_pcp (2 KV heads, results/pcp2_zigzag_llama_kv2) does not
# apply and the server is expected to serve.
# 0.5.17 splits prefill only for its CP-v2 classes (layers/cp/utils.py:42-52), not Llama: launched as
# a user would, nothing is split and the output is TP2's (results/pcp2_zigzag_llama_kv1), so the rule
# can apply only with the split forced, SGLANG_ENABLE_CP_V2=1. Forcing it crashed triton's KV-cache
# write at the first CP extend on dense Qwen3 (results/_smoke, case b2); the same here would leave
# generation unknown. `rows split zigzag` shows whether the split ran.
# Judged by `generation` (plan.lint.CONTRADICTS), on its raw verdict (before `violated` is applied),
# teacher-forced against the TP2 baseline with the TP1 control as noise floor:
# - confirmed: generation fails (|dlogprob| p99 above 4 x the control's, or free-running outputs
#   differ outside each other's top 5);
# - refuted: generation holds.
cptest 1
scenario llama_pcp_silent {
  description "PCP2 zigzag on TP2, tiny Llama with 1 KV head (expected: serves, wrong output)"
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
    attn_cp 2
    cp_strategy zigzag
  }
  serve {
    env "SGLANG_ENABLE_CP_V2" "1"
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
    rows split zigzag
    violated generation logprob p99 <= 4 * control free_running topk 5 vs baseline on sglang "0.5.17" because "Llama shards attention heads over full TP: CP partners hold different query-head shards (models/llama.py:158-166)"
  }
}
