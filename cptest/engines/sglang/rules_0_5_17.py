"""SGLang 0.5.17's admission rules: what it rejects, where, with which message, and what it gets
silently wrong. Each cites `path:line` in the 0.5.17 wheel (relative to `sglang/srt/`); an observed
rule names the archive or test that showed it (docs/sglang.md explains them in prose)."""

from __future__ import annotations

from cptest.engines.sglang.release_model import DIFFERENTIAL_TEST, Rule

RULES_0_5_17: dict[str, Rule] = {
    "dcp_at_least_1": Rule(
        "dcp_at_least_1",
        "parse",
        "ValueError",
        "Decode context parallel size (--dcp-size / --decode-context-parallel-size) must be >= 1, "
        "but got dcp_size={dcp}.",
        "server_args.py:3818-3823",
        provenance="observed",
        evidence=DIFFERENTIAL_TEST,
    ),
    "cp_strategy_required": Rule(
        "cp_strategy_required",
        "parse",
        "ValueError",
        "--cp-strategy must be set when --enable-prefill-cp is enabled.",
        "server_args.py:6319-6322",
        provenance="observed",
        evidence=DIFFERENTIAL_TEST,
    ),
    "tp_divisible_by_attn_dp": Rule(
        "tp_divisible_by_attn_dp",
        "parse",
        "AssertionError",
        "",
        "server_args.py:6462-6464",
        note="a bare assert (empty message) in _handle_data_parallelism, which runs before the CP "
        "checks: with attention DP, tp % dp_size != 0 is refused here whatever attn_cp is",
        provenance="observed",
        evidence=DIFFERENTIAL_TEST,
    ),
    "tp_divisible_by_attn_cp": Rule(
        "tp_divisible_by_attn_cp",
        "parse",
        "AssertionError",
        "tp_size must be divisible by attn_cp_size",
        "server_args.py:6339-6342",
        note="only checked when attn_cp > 1",
        provenance="observed",
        evidence=DIFFERENTIAL_TEST,
    ),
    "tp_divisible_by_dp_attn_cp": Rule(
        "tp_divisible_by_dp_attn_cp",
        "parse",
        "AssertionError",
        "tp_size must be divisible by dp_size * attn_cp_size",
        "server_args.py:6343-6345",
        note="only checked when attn_cp > 1, after tp % dp_size (tp_divisible_by_attn_dp) and tp % attn_cp",
        provenance="observed",
        evidence=DIFFERENTIAL_TEST,
    ),
    "pcp_with_dcp": Rule(
        "pcp_with_dcp",
        "silent",
        None,
        None,
        "server_args.py:3817-3847",
        note="0.5.17 does not reject --enable-prefill-cp with --dcp-size > 1 (confirmed with its own "
        "ServerArgs.from_cli_args; 0.5.23 does). It launched and served on 2 x H200 and on one H200 with "
        "the ranks co-located: results/pcp_dcp_rejected/20261203T082951Z-f1696101.",
        provenance="observed",
        evidence="results/pcp_dcp_rejected/20261203T082951Z-f1696101; " + DIFFERENTIAL_TEST,
    ),
    "dcp_at_least_1_worker": Rule(
        "dcp_at_least_1_worker",
        "worker_start",
        "RuntimeError",
        "decode_context_parallel_size ({dcp}) must be >= 1",
        "distributed/parallel_state.py:2272-2275",
        note="unreachable through ServerArgs, which refuses dcp < 1 at parse time (dcp_at_least_1)",
        provenance="observed",
        evidence=DIFFERENTIAL_TEST,
    ),
    "dcp_platform": Rule(
        "dcp_platform",
        "worker_start",
        "RuntimeError",
        "Decode context parallel (decode_context_parallel_size > 1) is currently only supported on the "
        "AMD HIP platform or CUDA platform, but got decode_context_parallel_size ({dcp}) on a non-HIP "
        "or non-CUDA platform.",
        "distributed/parallel_state.py:2276-2282",
        provenance="observed",
        evidence=DIFFERENTIAL_TEST,
    ),
    "tp_divisible_by_dcp": Rule(
        "tp_divisible_by_dcp",
        "worker_start",
        "RuntimeError",
        "tensor_model_parallel_size ({tp}) must be divisible by decode_context_parallel_size ({dcp})",
        "distributed/parallel_state.py:2283-2287",
        note="not checked at parse time: tp 4 dcp 3 passes ServerArgs and fails in every scheduler",
        provenance="observed",
        evidence=DIFFERENTIAL_TEST,
    ),
    "zigzag_short_prompt": Rule(
        "zigzag_short_prompt",
        "silent",
        None,
        None,
        "layers/cp/zigzag.py:109-119",
        note="any extend length < 2*attn_cp disables the split for the whole batch, without a log line "
        "(its predicate, ZigzagCPStrategy.can_apply, runs on the CPU in "
        "tests/sglang_src/test_topology_differential.py; the unsplit forward needs a GPU run)",
    ),
    "interleave_short_batch": Rule(
        "interleave_short_batch",
        "silent",
        None,
        None,
        "layers/cp/interleave.py:64-69",
        note="fewer than attn_cp extend tokens in the batch: no split (the predicate is "
        "InterleaveCPStrategy.can_apply, runs on the CPU in tests/sglang_src/test_topology_differential.py; "
        "the unsplit forward needs a GPU run)",
    ),
    "prefill_cp_needs_attn_cp": Rule(
        "prefill_cp_needs_attn_cp",
        "silent",
        None,
        None,
        "layers/cp/base.py:245-256",
        note="--enable-prefill-cp with attn_cp <= 1 leaves the strategy unset, no error (ServerArgs "
        "binding no strategy is checked on the CPU in tests/sglang_src/test_rules_differential.py; the "
        "unsplit forward needs a GPU run)",
    ),
    "attn_cp_without_prefill_cp": Rule(
        "attn_cp_without_prefill_cp",
        "silent",
        None,
        None,
        "layers/cp/base.py:249-251",
        note="--attn-cp-size > 1 without --enable-prefill-cp builds CP groups and shrinks attention-TP "
        "but never splits tokens (ServerArgs binding no strategy is checked on the CPU by "
        "tests/sglang_src/test_rules_differential.py; the unsplit forward needs a GPU run)",
    ),
    "pcp_cp_v1_unobserved": Rule(
        "pcp_cp_v1_unobserved",
        "silent",
        None,
        None,
        "layers/attention/dsa/utils.py:105-109; layers/utils/cp_utils.py:482-483",
        note="with SGLANG_ENABLE_CP_V2 off, interleave on a DSA model or DeepSeek V4 splits prefill rows "
        "round robin on the model's own CP-v1 path, whose CP metadata is empty: cptest's probe reads "
        "CP-v1 splits by that metadata, so every extend step reads cp_active false and `rows split` and "
        "`pcp rows` see no split where rows were split (inferred)",
    ),
    "pcp_cp_v1_interleave_zigzag": Rule(
        "pcp_cp_v1_interleave_zigzag",
        "silent",
        None,
        None,
        "models/qwen3_moe.py:989-997; layers/utils/cp_utils.py:470-673",
        note="with SGLANG_ENABLE_CP_V2 off, Qwen3-MoE and DeepSeek V2/V3 without an indexer split prefill "
        "rows on their own CP-v1 path, whose metadata (prepare_context_parallel_metadata) is the zigzag "
        "layout whatever --cp-strategy says: interleave is accepted and rows are split zigzag (the "
        "metadata runs on the CPU in tests/sglang_src/test_topology_differential.py). Observed on one "
        "H200 with co-located ranks (Qwen3-MoE, tp 2, attn_cp 2, fa3): every split step's shards were "
        "zigzag's: results/pcp_cp_v1_interleave_zigzag/20261205T042659Z-ffc6ee5a.",
        provenance="observed",
        evidence="results/pcp_cp_v1_interleave_zigzag/20261205T042659Z-ffc6ee5a",
    ),
    "interleave_no_attention": Rule(
        "interleave_no_attention",
        "runtime",
        None,
        None,
        "layers/cp/interleave.py:222-233",
        note="InterleaveCPStrategy.run_attention returns None: only the DSA backend runs attention "
        "itself; interleave on an fa3 MHA/GQA model fails at the first CP extend (inferred)",
    ),
    "llama_pcp": Rule(
        "llama_pcp",
        "runtime",
        "RuntimeError",
        "shape '[-1, <pool row>]' is invalid for input of size <k rows> (first prefill, KV pool write)",
        "models/llama.py:158-166; mem_cache/memory_pool.py:159",
        note="Llama shards KV heads over the full TP group while the pool holds the attention-TP "
        "shard, so the first extend's K does not fit the pool row and the scheduler dies. Observed "
        "on one H200 with co-located ranks (tp 2, attn_cp 2), as on 2 x H200 before: "
        "results/pcp2_zigzag_llama_kv2/20261203T143850Z-3d162b6e.",
        provenance="observed",
        evidence="results/pcp2_zigzag_llama_kv2/20261203T143850Z-3d162b6e",
    ),
    "llama_pcp_silent": Rule(
        "llama_pcp_silent",
        "silent",
        None,
        None,
        "models/llama.py:158-166",
        note="Llama shards attention heads over the full TP group, not attention-TP "
        "(cf. models/qwen3.py:86-92); CP partners hold different query-head shards (inferred wrong output)",
    ),
    "llama_attention_dp": Rule(
        "llama_attention_dp",
        "silent",
        None,
        None,
        "models/llama.py:158-166, 184-199; layers/linear.py:1433-1437",
        note="Llama shards attention (and its MLP) over the full TP group and gathers no attention-DP "
        "buffer: its projections take the TP group's size and rank, and o_proj all-reduces over the "
        "whole TP group, so ranks of different attention-DP ranks, each with its own batch, meet in one "
        "all-reduce (inferred: wrong output, or a crash or hang where their row counts differ; no run)",
    ),
    "pcp_attention_dp_gather": Rule(
        "pcp_attention_dp_gather",
        "runtime",
        "ValueError",
        "output tensor size must be equal to world_size times input tensor size (first decode padded to "
        "the longest DP rank: the MLP's attention-DP gather)",
        "layers/dp_attention.py:86-118, 490-523, 776-786; model_executor/forward_batch_info.py:1291-1298; "
        "layers/communicator.py:1110-1134",
        note="under attention DP the MLP runs over one buffer of every DP rank's rows, gathered over the "
        "TP group, which with attention CP holds attn_dp * attn_cp * attn_tp ranks while the buffer "
        "holds attn_dp slices. A forward that pads every DP rank to the longest (MAX_LEN: 2 * sum >= "
        "attn_dp * max, so every decode at attention DP 2) all-gathers each rank's slice, after the "
        "attention-TP reduce-scatter, into a buffer attn_cp times too small, and the scheduler dies: at "
        "attention DP 2 on the launch's warm-up request (attention DP 3 or more: "
        "pcp_attention_dp_gather_wide). Attention CP builds its groups with or without "
        "--enable-prefill-cp; DCP changes neither the group nor the buffer (read, not run); Llama "
        "gathers no attention-DP buffer (llama_attention_dp). SGLang's own sizing and gather ran on the "
        "CPU over gloo for every layout of attention DP 2-4, attention CP 1-4 and attention TP 1-2 on at "
        "most 8 ranks: refused exactly where attention CP > 1 and the mode is MAX_LEN. Observed on one "
        "H100 with co-located ranks (Qwen3-MoE, tp 4, attn_cp 2, attn_dp 2, fa3): the launch's warm-up "
        "decode raised it.",
        provenance="observed",
        evidence="results/pcp2_zigzag_qwen3_moe_kv1_fa3_dp2/20261205T101404Z-1321b4d3; "
        "tests/sglang_src/test_dp_gather_differential.py (the release's own DP sizing and gather over "
        "gloo, every layout up to 8 ranks, in CI)",
    ),
    "pcp_attention_dp_gather_wide": Rule(
        "pcp_attention_dp_gather_wide",
        "silent",
        None,
        None,
        "layers/dp_attention.py:86-118, 490-523, 776-786; model_executor/forward_batch_info.py:1291-1298; "
        "layers/communicator.py:1110-1134; model_executor/runner/decode_cuda_graph_runner.py:735-743",
        note="at attention DP 3 or more, pcp_attention_dp_gather's gather may let the launch through: "
        "the warm-up's one decode request leaves the DP ranks' loads far apart, and SGLang then pads "
        "to their sum (SUM_LEN) and all-reduces, which raises nothing but adds up every CP rank's copy "
        "of each row (attn_cp times the rows: wrong output). The first decode with even loads pads to "
        "the longest (MAX_LEN) and dies as at attention DP 2, and so would a CUDA-graph decode's "
        "capture, which sizes every DP rank alike (inferred from its sizing code). The gather's "
        "refusal and the all-reduce's sum ran on the CPU (tests/sglang_src/test_dp_gather_differential.py); "
        "a served run at attention DP 3 or more has not (inferred: the server crashes, or its output is "
        "wrong)",
    ),
    "mha_dcp_kv_not_replicated": Rule(
        "mha_dcp_kv_not_replicated",
        "silent",
        None,
        None,
        "layers/attention/triton_backend.py:1797-1810; mem_cache/kv_cache_configurator.py:1442",
        note="DCP all-gathers Q over the group and attends against each rank's own KV heads "
        "(pool holds max(1, kv_heads // attn_tp)); right only if the DCP group's ranks hold the same "
        "KV heads, i.e. kv_heads <= tp/dcp. No check on CUDA (wrong output: observed with 4 KV heads at "
        "tp 2 dcp 2, generation against the TP2 baseline below the 0.5 floor)",
        provenance="observed",
        evidence="results/dcp2_llama_kv4/20261203T081109Z-733943a0; "
        "results/dcp2_llama_kv4_graph/20261203T111929Z-7984e228",
    ),
    "mla_dcp_triton_decode": Rule(
        "mla_dcp_triton_decode",
        "runtime",
        "AssertionError",
        "assert q.shape[0] <= kv_indptr.shape[0] - 1 (first decode: DCP's Q all-gather on an MLA layer)",
        "layers/attention/triton_backend.py:1797-1830; sglang/kernels/ops/attention/decode_attention.py:992",
        note="triton's DCP decode gathers Q over the group and calls the MHA decode kernel; on an MLA "
        "layer the kernel's shape assertion fails at the first decode (eager: the first served decode; "
        "CUDA-graph decode: during capture) and the scheduler dies. Observed at tp 2 dcp 2 on the tiny "
        "DeepSeek-style model (kv_lora 64, rope 16) in both decodes",
        provenance="observed",
        evidence="results/dcp2_mla/20261203T144442Z-d95b93bd; "
        "results/dcp2_mla_triton_graph/20261203T144852Z-9c779d72",
    ),
    "mla_dcp_flashmla_lse_unpacked": Rule(
        "mla_dcp_flashmla_lse_unpacked",
        "runtime",
        "AttributeError",
        "'tuple' object has no attribute 'view' (first decode: forward_absorb_core's DCP merge)",
        "layers/attention/flashmla_backend.py:480-481; models/deepseek_common/utils.py:60-72; "
        "models/deepseek_common/attention_forward_methods/forward_mla.py:990-1036",
        note="FlashMLA's decode returns (output, LSE) under DCP, but FlashMLA is not among the "
        "absorb-core backends, so the MLA layer takes the plain attention call, keeps the tuple and "
        "reshapes it for the DCP merge: the scheduler dies at the first decode (the warm-up request, "
        "so the launch fails). Observed at tp 2 dcp 2 on the tiny DeepSeek-style model (kv_lora 512, "
        "rope 64), eager and graph decode",
        provenance="observed",
        evidence="results/dcp2_mla_flashmla_eager/20261203T175823Z-9cbb2bef; "
        "results/dcp2_mla_flashmla_graph/20261203T175823Z-74bd3fd8",
    ),
    "mla_dcp_fa3_no_lse": Rule(
        "mla_dcp_fa3_no_lse",
        "runtime",
        "ValueError",
        "not enough values to unpack (expected 2, got 1) (first decode: attn_mqa_for_dcp_decode)",
        "models/deepseek_common/attention_forward_methods/forward_mla.py:955-972; "
        "layers/attention/flashattention_backend.py:1974-2050",
        note="the MLA layer's DCP decode asks the absorb-core backend for (output, LSE); fa3's MLA "
        "decode returns the output alone, so the scheduler dies at the first decode (the warm-up "
        "request, so the launch fails). Observed at tp 2 dcp 2 on the tiny DeepSeek-style model, eager "
        "decode; graph capture runs the same decode",
        provenance="observed",
        evidence="results/dcp2_mla_fa3_eager/20261203T180718Z-8a3f3131",
    ),
    "dcp_fused_rope_kv_write": Rule(
        "dcp_fused_rope_kv_write",
        "silent",
        None,
        None,
        "models/utils.py:284-305; model_executor/forward_batch_info.py:961-968; "
        "models/qwen3_moe.py:637-649, 680-693; layers/attention/triton_backend.py:1217-1245",
        note="A model that writes K/V inside its RoPE kernel (Qwen3-MoE, GPT-OSS, Bailing-MoE) does so "
        "whenever the batch has no dcp_kv_mask, and only HIP sets one: on CUDA every rank writes every "
        "token at its logical slot, not its owner's physical slot (out_cache_loc // dcp) through the "
        "masked store, and attention skips its own store. Prefill attends the fresh K/V and scores "
        "right; decode reads the pool and diverges at its first token. Observed at tp 2 dcp 2 with 1 "
        "KV head, eager and graph decode; the probe, which watches the pool's store, sees no K/V write",
        provenance="observed",
        evidence="results/dcp2_qwen3_moe_kv1_eager/20261203T143851Z-a58f99bb; "
        "results/dcp2_qwen3_moe_kv1_graph/20261203T144442Z-005d0ae0",
    ),
    "dcp_backend_without_dcp_path": Rule(
        "dcp_backend_without_dcp_path",
        "silent",
        None,
        None,
        "layers/attention/triton_backend.py:182-187",
        note="among MHA backends only triton has DCP code in 0.5.17 (owner-masked writes, Q all-gather, "
        "LSE merge); fa3/flashinfer get widened slots and no DCP path (inferred wrong output)",
    ),
    "dcp_disables_prefill_graph": Rule(
        "dcp_disables_prefill_graph",
        "parse",
        None,
        "Breakable CUDA graph is incompatible with decode context parallel (dcp_size > 1); "
        "disabling prefill CUDA graph.",
        "server_args.py:4440-4446, 4512-4520",
        note="a warning, not a rejection: the prefill graph is turned off",
        provenance="observed",
        evidence=DIFFERENTIAL_TEST,
    ),
}
