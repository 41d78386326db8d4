# PCP2 zigzag on tiny Llama (TP2, attn_cp 2 -> attention TP 1).
# - Row split: each sequence's extend tokens form 4 blocks; CP rank r owns blocks r and 3-r
#   (docs/sglang.md §5). The split itself is strategy code, independent of the model.
# - Generation is expected to diverge: Llama shards attention heads over full TP, not attention TP,
#   so CP gathers K/V from a partner holding other heads (§3.2 Llama row, inferred); and the triton
#   backend has no PCP path at all (§3.1). Not rejected by 0.5.17 (server_args.py 6319-6343 only
#   checks the strategy and divisibility).
# - PCP adds no KV capacity (§5 "written in full to every CP rank's pool"): no capacity entry.
cptest 1
scenario pcp2_zigzag_llama_kv2 {
  description "PCP2 zigzag on TP2, tiny Llama with 2 KV heads (expected no-go)"
  extends "defaults/tiny.cps"

  # the tiny model's geometry, written by cptest itself (cptest/run/models.py)
  model synthetic llama {
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
    cp_strategy zigzag
  }
  baseline {
    tp 2
  }
  expect {
    violated launch accepted because "Llama's K (full-TP head shard) does not fit the attention-TP pool row: the scheduler dies at the first prefill (docs/sglang.md §3.2)"
    rows split zigzag
    # Teacher-forced against the measured noise floor (docs/language.md "Generation parity"): the
    # control is the baseline's model at another TP degree; free-running by vLLM's top-k rule.
    violated generation logprob p99 <= 4 * control free_running topk 5 vs baseline because "Llama attention is sharded over full TP and triton has no PCP path (docs/sglang.md §3.1, §3.2)"
  }
}
