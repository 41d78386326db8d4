# Rule llama_attention_dp (SGLang 0.5.17, silent, inferred; models/llama.py:184-199,
# layers/linear.py:1433-1437): Llama's projections take the full TP group's size and rank and its
# forward gathers no attention-DP buffer, so under attention DP the ranks of different DP ranks, each
# with its own batch, meet in one o_proj all-reduce. 0.5.17 accepts --enable-dp-attention for any
# model (executed on CPU: tests/sglang_src/test_rules_differential.py). TP 2 with attention DP 2
# leaves attention TP 1: each rank is its own DP rank and computes half of Llama's heads.
# Judged by `generation` (plan.lint.CONTRADICTS), teacher-forced against the TP2 baseline with the
# TP1 control as noise floor, and by `serving`:
# - confirmed: generation fails, or the server crashes or hangs (serving fails, generation unknown);
# - refuted: generation and serving hold.
cptest 1
scenario llama_attention_dp {
  description "attention DP 2 on TP2, tiny Llama with 1 KV head (expected: wrong output, a crash or a hang)"
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
    attn_dp 2
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
    violated generation logprob p99 <= 4 * control free_running topk 5 vs baseline on sglang "0.5.17" because "Llama's attention takes the full TP group: DP ranks' batches meet in o_proj's all-reduce (models/llama.py:184-199)"
  }
}
