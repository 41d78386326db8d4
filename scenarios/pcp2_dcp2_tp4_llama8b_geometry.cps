# PCP2 + DCP2 on TP4 with Llama-3.1-8B's attention geometry. 0.5.17 has no PCP+DCP admission check
# (0.5.23 rejects it: "--dcp-size > 1 does not support --enable-prefill-cp."); on 2 GPUs the
# combination came up and served (results/pcp_dcp_rejected). Declared: the rejection that a
# correct release gives is expected to be missing.
cptest 1
scenario pcp2_dcp2_tp4_llama8b_geometry {
  description "TP4 + PCP2 + DCP2 (rejected by 0.5.23, accepted by 0.5.17), Llama-3.1-8B geometry"
  extends "defaults/llama8b_geometry.cps"
  topology {
    gpus 4
    tp 4
    dcp 2
    attn_cp 2
    cp_strategy zigzag
  }
  baseline none
  workload {
    requests 4
    concurrency 4
  }
  expect {
    violated launch rejected matching "does not support --enable-prefill-cp" because "0.5.17 has no PCP+DCP admission check (server_args.py:3817-3847)"
  }
}
