# PCP together with DCP. SGLang 0.5.23 rejects it at argument time with
# "--dcp-size > 1 does not support --enable-prefill-cp." (docs/sglang.md §2.2), but the pinned
# 0.5.17 has no such check: server_args.py _handle_dcp_validation (3817-3847) and
# _handle_context_parallelism (6287-6343) never look at both. So the admission contract
# "SGLang rejects PCP+DCP" is expected to be violated on 0.5.17: the server launches.
cptest 1
scenario pcp_dcp_rejected {
  description "PCP2 + DCP2 on TP2: rejected by 0.5.23, accepted by 0.5.17"
  extends "defaults/tiny.cps"

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
    dcp 2
    attn_cp 2
    cp_strategy zigzag
  }
  baseline none
  workload {
    requests 4
    concurrency 2
  }
  expect {
    violated launch rejected matching "does not support --enable-prefill-cp" because "0.5.17 has no PCP+DCP admission check (added by 0.5.23, parallel_hook.py:249-250)"
  }
}
