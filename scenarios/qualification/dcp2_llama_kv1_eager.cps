# Requirement of docs/target-plan.md (P1: DCP2 on MHA with kv_heads <= tp/dcp, triton).
# Numerical, layout and capacity-group evidence: K/V position p written once, by DCP rank p % 2;
# logical capacity = 2 x per-rank rows on every surface (0.5.17 reports per-rank rows: capacity FAILs
# until SGLang reports the logical figure, docs/sglang.md §4.2); generation within 4 x the TP noise floor.
cptest 1
scenario dcp2_llama_kv1_eager {
  description "DCP2 on TP2, tiny Llama with 1 KV head, eager decode: layout, capacity group, parity"
  extends "../defaults/tiny.cps"
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
    dcp 2
  }
  baseline {
    tp 2
  }
  expect {
    rows kv_owner position % 2
    dcp handoff
    capacity logical == 2 * physical within 0.01
    capacity adapter
    # Teacher-forced against the measured noise floor (docs/language.md "Generation parity").
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
    log contains "DCP enabled, dcp_size=2, tp_size=2"
  }
}
