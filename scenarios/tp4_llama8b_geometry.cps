# TP4 baseline with Llama-3.1-8B's attention geometry: 8 KV heads over 4 ranks, 2 per rank; rows
# replicated on every TP rank (docs/architecture.md §9). The parity reference of the 4-GPU runs; its
# TP2 baseline measures the noise floor at this geometry (cf. tp2_llama_kv1 on the tiny model).
cptest 1
scenario tp4_llama8b_geometry {
  description "TP4 baseline, Llama-3.1-8B attention geometry (synthetic, 4 layers)"
  extends "defaults/llama8b_geometry.cps"
  topology {
    gpus 4
    tp 4
  }
  baseline {
    tp 2
  }
  expect {
    rows replicated
    # Noise floor of the tiny model (results/tp2_llama_kv1/20261130T053444Z-65cc93be): 0.596, 0.091.
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
