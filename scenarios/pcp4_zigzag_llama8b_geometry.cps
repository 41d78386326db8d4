# TP4 + attention-CP 4 + zigzag prefill CP with Llama-3.1-8B's attention geometry. On 2 GPUs the
# same configuration on tiny Llama crashed the scheduler in the first batched prefill
# (results/pcp2_zigzag_llama_kv2): Llama shards attention over the full TP group, not attention-TP
# (docs/sglang.md §3.2). Declared: the launch is expected to fail the same way at 4 ranks.
cptest 1
scenario pcp4_zigzag_llama8b_geometry {
  description "TP4 + PCP4 zigzag, Llama-3.1-8B attention geometry (synthetic, 4 layers)"
  extends "defaults/llama8b_geometry.cps"
  topology {
    gpus 4
    tp 4
    attn_cp 4
    cp_strategy zigzag
  }
  baseline {
    tp 4
  }
  expect {
    violated launch accepted because "PCP on Llama crashed the scheduler at 2 ranks (results/pcp2_zigzag_llama_kv2)"
    violated rows split zigzag because "Llama attention is sharded over full TP (docs/sglang.md §3.2)"
    violated generation logprob p99 <= 4 * control free_running topk 5 vs baseline because "Llama attention is sharded over full TP and triton has no PCP path (docs/sglang.md §3.1, §3.2)"
  }
}
