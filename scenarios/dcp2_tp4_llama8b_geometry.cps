# TP4 + DCP2 with Llama-3.1-8B's attention geometry: each rank's pool holds its attention-TP shard
# of 2 KV heads (0.5.17 sizes heads by attn_tp only, pool_configurator.py:290-296), and the two
# ranks of a DCP group hold different heads (kv_heads 8 > tp/dcp 2): the owner rule holds, the
# merged attention reads the wrong heads for half the positions, so generation is expected to
# diverge — as observed on TP2/DCP2 with 4 KV heads (results/dcp2_llama_kv4). Capacity: every
# public surface of 0.5.17 reports per-rank rows (results/dcp2_llama_kv1), so it is declared
# violated here with the reason.
cptest 1
scenario dcp2_tp4_llama8b_geometry {
  description "TP4 + DCP2, Llama-3.1-8B attention geometry (synthetic, 4 layers)"
  extends "defaults/llama8b_geometry.cps"
  topology {
    gpus 4
    tp 4
    dcp 2
  }
  baseline {
    tp 4
  }
  expect {
    rows kv_owner position % 2
    violated capacity logical == 2 * physical within 0.01 because "0.5.17 reports per-rank rows as max_total_num_tokens (scheduler.py:2005, 2137)"
    violated generation logprob p99 <= 4 * control free_running topk 5 vs baseline because "kv_heads 8 > tp/dcp 2: DCP ranks hold different KV heads (docs/sglang.md §3.2)"
    log contains "DCP enabled, dcp_size=2, tp_size=4"
  }
}
