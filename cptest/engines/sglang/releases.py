"""What each SGLang release is known to do, as data: one table per release, `{**PREVIOUS, ...changes}`.

Every entry cites `path:line` inside that release's wheel (relative to `sglang/srt/`). 0.5.17 entries
were read in its source (`/tmp/sgl/src/sglang`) and, for the parse-time rules, confirmed by running
its own `ServerArgs.from_cli_args` on a CPU machine. 0.5.23 entries cite the 0.5.23 wheel,
grep-checked against it. docs/sglang.md explains these facts in prose, section by section.

Nothing outside this package may branch on a release name: callers ask `get_release(name)` for the
table and read fields. An unknown release raises `PlanError` naming the closest known one.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from cptest.engines.sglang.release_model import (
    PARSER_TEST,
    LogPattern,
    Provenance,
    Rule,
    Stage,
    Support,
    SupportEntry,
)
from cptest.engines.sglang.rules_0_5_17 import RULES_0_5_17
from cptest.engines.sglang.safety import POLICY_0_5_17, POLICY_0_5_23, Policy
from cptest.errors import PlanError, did_you_mean, one_of
from cptest.topology import KvHeadsRule


@dataclass(frozen=True)
class Release:
    """Everything release-specific cptest knows about one SGLang release."""

    name: str
    wheel: str
    wheel_sha256: str
    flags_file: str
    rules: Mapping[str, Rule]
    log_patterns: Mapping[str, LogPattern]
    support: Mapping[tuple[str, str, str], SupportEntry]
    """(model family, mode, attention backend) -> status. Families: mha (GQA/MHA with attention
    sharded over attention-TP, e.g. Qwen3), llama (attention sharded over full TP), mla, dsa.
    Modes: pcp-zigzag, pcp-interleave, dcp. Backend "*" is the family/mode default."""
    spellings: Mapping[str, tuple[str, ...]]
    """Concept -> argv fragment with `{n}` placeholders, for concepts whose flags differ by release."""
    kv_heads_rule: KvHeadsRule
    dcp_interleave_sizes: tuple[int, ...]
    sigterm_exit_statuses: frozenset[int]
    """Exit statuses of the launcher after a SIGTERM shutdown. SGLang SIGKILLs itself by design."""
    rank_kill_exit_statuses: frozenset[int]
    """Exit statuses of the launcher after one scheduler rank is killed (SIGQUIT path, then SIGKILL)."""
    graph_phases: Mapping[str, str]
    """Phase -> flag choosing its CUDA-graph backend; the values it accepts are in the flag table."""
    server_info_paths: tuple[str, ...]
    """The HTTP paths that answer with the server's resolved arguments and capacity, in the order
    the runner asks them (the first that answers 200 is recorded)."""
    safety: Policy
    """What a scenario may put into the server's environment and argv (`safety.py`; judged by
    `cptest.lang.safety` at validate time and again by the plan)."""
    colocation_env: Mapping[str, str] = field(default_factory=dict)
    """What every node of a co-located server gets in its environment (ranks as local nodes on
    shared GPUs: docs/placement.md), besides a host id of its own (`colocation_host_id_var`)."""
    colocation_flags: tuple[str, ...] = ()
    """What every node of a co-located server gets in its argv."""
    pcp_model_classes: frozenset[str] | None = None
    """The architectures whose prefill CP actually splits rows without being forced; None: every
    architecture. For any other, the PCP flags are accepted and nothing is split."""
    pcp_force_env: str | None = None
    """The variable that turns the split on for every architecture (`=1`), where there is one."""
    follower_ranks_ended: str | None = None
    """A regular expression of the line a node other than 0 prints when its scheduler process has
    ended: what follows in its log is its launcher's, after its ranks (docs/placement.md)."""
    follower_ports_checked: str | None = None
    """A regular expression of the line a node other than 0 prints once it has checked the ports it
    derives from the rendezvous address; co-located, node 0 starts after every follower printed it
    (docs/placement.md)."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @functools.cached_property
    def flags(self) -> Mapping[str, Mapping[str, Any]]:
        """Every CLI flag of the release (primary spelling and aliases) -> its entry in flags-<r>.json."""
        table = _load_flags(self.flags_file)["flags"]
        out: dict[str, Mapping[str, Any]] = {}
        for name, entry in table.items():
            out[name] = entry
            for alias in entry["aliases"]:
                out.setdefault(alias, entry)
        return out

    def log_pattern(self, name: str) -> LogPattern:
        return self.log_patterns[name]


@functools.cache
def _load_flags(filename: str) -> dict[str, Any]:
    text = resources.files("cptest.engines.sglang").joinpath(filename).read_text(encoding="utf-8")
    return json.loads(text)


# ------------------------------------------------------------------------------------------ 0.5.17

LOGS_0_5_17: dict[str, LogPattern] = {
    "log_prefix": LogPattern(
        r"^\[(?P<time>[^\]]*?)(?: DP(?P<dp>\d+))?(?: PP(?P<pp>\d+))?(?: ATTN_CP(?P<attn_cp>\d+))?"
        r"(?: MOE_DP(?P<moe_dp>\d+))?(?: TP(?P<tp>\d+))?(?: EP(?P<ep>\d+))?\] ",
        "managers/scheduler.py:4843-4859; utils/common.py:2173",
    ),
    "kv_cache_allocated": LogPattern(
        r"(?:(?P<label>\S+) )?KV Cache is allocated\. dtype: (?P<dtype>\S+), #tokens: (?P<tokens>\d+), "
        r"(?:K size: (?P<k_gb>[\d.]+) GB, V size: (?P<v_gb>[\d.]+) GB|KV size: (?P<kv_gb>[\d.]+) GB)",
        "mem_cache/memory_pool.py:1655-1680",
    ),
    "kv_cache_post_capture": LogPattern(
        r"Post-capture KV sizing: KV cache allocated\. dtype: (?P<dtype>\S+), #tokens: (?P<tokens>\d+), "
        r"KV size: (?P<kv_gb>[\d.]+) GB, avail mem=(?P<avail_gb>[\d.]+) GB",
        "model_executor/model_runner_components/kv_pool_runtime.py:121-123",
    ),
    "memory_pool_end": LogPattern(
        r"Memory pool end\. avail mem=(?P<avail_gb>[\d.]+) GB", "mem_cache/kv_cache_configurator.py:257-260"
    ),
    "max_total_num_tokens": LogPattern(
        r"max_total_num_tokens=(?P<tokens>\d+), chunked_prefill_size=(?P<chunked_prefill>-?\d+|None), "
        r"max_prefill_tokens=(?P<max_prefill>\d+), max_running_requests=(?P<max_running>\d+), "
        r"context_len=(?P<context_len>\d+), available_(?:gpu|cpu)_mem=(?P<avail_gb>[\d.]+) GB",
        "managers/scheduler.py:1067-1076",
    ),
    "dcp_enabled": LogPattern(
        r"DCP enabled, dcp_size=(?P<dcp>\d+), tp_size=(?P<tp>\d+)", "distributed/parallel_state.py:2352-2355"
    ),
    "forward_hook_registered": LogPattern(
        r"Registered forward hook '(?P<name>[^']*)' on (?P<module>\S+)", "model_executor/hook_manager.py:56"
    ),
    "forward_hook_unmatched": LogPattern(
        r"No modules matched hook spec '(?P<name>[^']*)'", "model_executor/hook_manager.py:47-51"
    ),
    "plugin_executed": LogPattern(r"Executed general plugin: (?P<name>\S+)", "plugins/__init__.py:134"),
    "plugin_failed": LogPattern(
        r"Failed to execute general plugin: (?P<name>\S+)", "plugins/__init__.py:136"
    ),
    "cuda_graph_captured": LogPattern(
        r"Capture (?P<phase>\S+) CUDA graph end\. elapsed=(?P<secs>[\d.]+) s, "
        r"mem usage=(?P<mem_gb>[\d.]+) GB",
        "model_executor/model_runner_components/cuda_graph_setup.py:373-377",
    ),
    "prefill_graph_disabled": LogPattern(
        r"Breakable CUDA graph is incompatible with (?P<reason>.+); disabling prefill CUDA graph\.",
        "server_args.py:4512-4520",
    ),
    "server_ready": LogPattern(
        r"The server is fired up and ready to roll!", "entrypoints/http_server.py:2355"
    ),
    "sigterm_received": LogPattern(
        r"SIGTERM received\. signum=(?P<signum>\S+) frame=.*Draining requests and shutting down",
        "managers/tokenizer_manager.py:3748-3751",
    ),
    "sigterm_force_exit": LogPattern(
        r"Signal SIGTERM received while (?P<why>health check failed|force shutdown flag set)\. "
        r"Force exiting\.",
        "managers/tokenizer_manager.py:3099-3111",
    ),
    "gracefully_exiting": LogPattern(
        r"Gracefully exiting\.\.\. Remaining number of requests (?P<remaining>\d+)\.",
        "managers/tokenizer_manager.py:3114-3116",
    ),
    "schedulers_still_alive": LogPattern(
        r"Schedulers still alive (?P<secs>\d+)s after ShutdownReq",
        "absent in 0.5.17: it waits 15 s silently (managers/tokenizer_manager.py:3124-3130)",
        present=False,
    ),
    "kill_process_tree": LogPattern(
        r"kill_process_tree called: parent_pid=(?P<parent_pid>\d+|None), include_parent=(?P<include_parent>"
        r"True|False), pid=(?P<pid>\d+)",
        "utils/common.py:2066-2069",
    ),
    "subprocess_crashed": LogPattern(
        r"Subprocess (?P<name>\S+) \(pid=(?P<pid>\d+)\) crashed with exit code (?P<code>-?\d+)\.",
        "utils/watchdog.py:210-221",
    ),
    "scheduler_exception": LogPattern(r"Scheduler hit an exception: ", "managers/scheduler.py:4948-4952"),
    "sigquit_running": LogPattern(
        r"SIGQUIT received\. signum=.*It usually means one child failed\.",
        "managers/tokenizer_manager.py:3753-3757",
    ),
    "sigquit_launch": LogPattern(
        r"Received sigquit from a child process\. It usually means the child failed\.",
        "entrypoints/engine.py:1650-1652",
    ),
    "health_check_failed": LogPattern(
        r"Health check failed\. Server couldn't get a response from detokenizer for last "
        r"(?P<secs>\d+) seconds\.",
        "entrypoints/http_server.py:713-717",
    ),
}

_S, _U, _R, _W, _E = "supported", "untested", "rejected", "silently-wrong", "runtime-error"

SUPPORT_0_5_17: dict[tuple[str, str, str], SupportEntry] = {
    ("mha", "pcp-zigzag", "fa3"): SupportEntry(
        _S, "layers/attention/flashattention_backend.py:1163-1189, 1381-1382", "Qwen3/Qwen3-MoE; GQA"
    ),
    ("mha", "pcp-zigzag", "trtllm_mha"): SupportEntry(
        _U, "layers/attention/trtllm_mha_backend.py", "SM100 only"
    ),
    ("mha", "pcp-zigzag", "*"): SupportEntry(
        _W, "layers/cp/zigzag.py:415-458", "backends without CP code compute attention on local rows only"
    ),
    ("mha", "pcp-interleave", "*"): SupportEntry(
        _E, "layers/cp/interleave.py:222-233", "run_attention is a no-op"
    ),
    ("mha", "dcp", "triton"): SupportEntry(
        _U,
        "layers/attention/triton_backend.py:182-187, 1228-1240, 1797-1830",
        "correct only when kv_heads <= tp/dcp (inferred)",
    ),
    ("mha", "dcp", "*"): SupportEntry(
        _W, "layers/attention/triton_backend.py:182-187", "no DCP path (inferred)"
    ),
    ("llama", "pcp-zigzag", "*"): SupportEntry(_W, "models/llama.py:158-166", "heads sharded over full TP"),
    ("llama", "pcp-interleave", "*"): SupportEntry(_E, "layers/cp/interleave.py:222-233"),
    ("llama", "dcp", "triton"): SupportEntry(
        _U, "layers/attention/triton_backend.py:1797-1830", "Llama-3.x (8 KV heads) needs tp/dcp >= 8"
    ),
    ("llama", "dcp", "*"): SupportEntry(_W, "layers/attention/triton_backend.py:182-187"),
    ("mla", "pcp-zigzag", "fa3"): SupportEntry(_S, "layers/attention/flashattention_backend.py:1163-1168"),
    ("mla", "dcp", "flashinfer"): SupportEntry(_S, "layers/attention/flashinfer_mla_backend.py"),
    ("mla", "dcp", "flashmla"): SupportEntry(
        _E,
        "models/deepseek_common/attention_forward_methods/forward_mla.py:990-1036",
        "LSE tuple not unpacked",
    ),
    ("mla", "dcp", "fa3"): SupportEntry(
        _E, "layers/attention/flashattention_backend.py:1974-2050", "MLA decode returns no LSE"
    ),
    ("mla", "dcp", "trtllm_mla"): SupportEntry(_S, "layers/attention/trtllm_mla_backend.py", "SM100"),
    ("mla", "dcp", "cutedsl_mla"): SupportEntry(_S, "layers/attention/cutedsl_mla_backend.py", "SM100"),
    ("dsa", "pcp-interleave", "*"): SupportEntry(_S, "layers/attention/dsa_backend.py"),
    ("*", "pcp+dcp", "*"): SupportEntry(_U, "server_args.py:3817-3847", "not rejected in 0.5.17"),
}

CP_V2_DEFAULT_MODEL_CLASSES_0_5_17 = frozenset({
    "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "GptOssForCausalLM", "MiMoV2FlashForCausalLM",
    "MiMoV2ForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM",
})
"""0.5.17 `layers/cp/utils.py:42-52`: the generic prefill CP path (CP v2) runs by default only for
these classes, and for any class with SGLANG_ENABLE_CP_V2=1 (`environ.py:314`,
`layers/cp/utils.py:131-142`). With CP v2 off, DeepSeek V2/V3/V4 and Qwen3-MoE split prefill rows on
model-local CP-v1 paths, which cptest's probe does not hook (docs/sglang.md §3); no scenario turns
CP v2 off, so `pcp_splits` predicts the CP-v2 split only."""

COLOCATION_ENV: Mapping[str, str] = {
    # NCCL: every rank a separate host (each node's own NCCL_HOSTID, `COLOCATION_HOST_ID_VAR`), so
    # that its init check lets two ranks share a GPU; sockets over loopback, and none of the
    # transports that assume one process per GPU (peer-to-peer, shared memory, InfiniBand).
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_NET": "Socket",
    "NCCL_IB_DISABLE": "1",
    "NCCL_P2P_DISABLE": "1",
    "NCCL_SHM_DISABLE": "1",
    # distributed/bootstrap.py:260-271: a rank that sees less free memory than 0.9 x the first one
    # raises "The memory capacity is unbalanced"; ranks sharing a GPU always do. 0 makes it a warning.
    "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "0",
}
"""Measured on one H200 with 0.5.17 (docs/placement.md): DCP2, DCP4 and PCP2 ran this way."""
COLOCATION_HOST_ID_VAR = "NCCL_HOSTID"
COLOCATION_TRANSPORT = "NCCL over sockets on loopback (no P2P, SHM, IB, custom all-reduce)"

RELEASE_0_5_17 = Release(
    name="0.5.17",
    wheel="sglang-0.5.17-cp311-cp311-manylinux_2_34_x86_64.whl",
    wheel_sha256="575e38f5683624ded3b4bb267f637a098e5ed37d13a1d1ff5ea09bd781a04d16",
    flags_file="flags-0.5.17.json",
    rules=RULES_0_5_17,
    log_patterns=LOGS_0_5_17,
    support=SUPPORT_0_5_17,
    spellings={
        # 0.5.17 has no --attn-dp-size: attention DP is data parallelism plus a switch.
        "attn_dp": ("--dp-size", "{n}", "--enable-dp-attention"),
        "dcp": ("--dcp-size", "{n}"),
        "attn_cp": ("--attn-cp-size", "{n}"),
        "prefill_cp": ("--enable-prefill-cp",),
        "cp_strategy": ("--cp-strategy", "{n}"),
    },
    kv_heads_rule="attn_tp",
    dcp_interleave_sizes=(1,),
    # tokenizer_manager.py:3124-3131: kill_process_tree(include_parent=True) SIGKILLs the launcher
    # before its sys.exit(0); 0 when uvicorn handles a SIGTERM that arrives before any request.
    sigterm_exit_statuses=frozenset({0, -9, 137}),
    # A dead scheduler -> watchdog SIGQUIT -> kill_process_tree(os.getpid()) -> SIGKILL of the launcher
    # (utils/watchdog.py:210-221, managers/tokenizer_manager.py:3753-3763).
    rank_kill_exit_statuses=frozenset({-9, 137}),
    graph_phases={"decode": "--cuda-graph-backend-decode", "prefill": "--cuda-graph-backend-prefill"},
    colocation_env=COLOCATION_ENV,
    colocation_flags=("--disable-custom-all-reduce",),
    pcp_model_classes=CP_V2_DEFAULT_MODEL_CLASSES_0_5_17,
    pcp_force_env="SGLANG_ENABLE_CP_V2",
    # entrypoints/engine.py:920-926 (block_until_scheduler_exits). After it, 0.5.17's follower goes on
    # into http_server.launch_server with no tokenizer manager and logs an AttributeError traceback
    # from the app's lifespan (seen on every co-located follower at shutdown).
    follower_ranks_ended=r"Scheduler or DataParallelController \d+ terminated with -?\d+",
    # entrypoints/engine.py:1057-1059: logged right after PortArgs.init_new, which under attention DP
    # waits for the TCP ports derived from the rendezvous port to be free (server_args.py:9522-9525)
    # and gives up after 30 s; node 0 binds them, so on one host a follower must check first.
    follower_ports_checked=r"server_args=ServerArgs\(",
    # entrypoints/http_server.py:863; /get_server_info is its deprecated alias.
    server_info_paths=("/server_info", "/get_server_info"),
    safety=POLICY_0_5_17,
)

# ------------------------------------------------------------------------------------------ 0.5.23

_NOT_LOOKED_UP_IN_0_5_23 = frozenset({"tp_divisible_by_attn_dp", "pcp_cp_v1_unobserved",
                                      "pcp_cp_v1_interleave_zigzag", "llama_attention_dp",
                                      "pcp_attention_dp_gather", "pcp_attention_dp_gather_wide"})
"""0.5.17 rules nobody has looked for in 0.5.23's source yet: they do not come over (their citation
would name a 0.5.17 line)."""
_FROM_0_5_17 = {code: dataclasses.replace(rule, provenance="inferred", evidence="")
                for code, rule in RULES_0_5_17.items() if code not in _NOT_LOOKED_UP_IN_0_5_23}
"""What 0.5.17 showed is not evidence about 0.5.23: its rules come over as inferred."""


def _moved(code: str, citation: str, **changes: Any) -> Rule:
    """A 0.5.17 rule that 0.5.23 keeps word for word, at another place in its source (`changes`:
    what else differs, such as a note that no longer holds)."""
    return dataclasses.replace(_FROM_0_5_17[code], citation=citation, **changes)


RULES_0_5_23: dict[str, Rule] = {
    **_FROM_0_5_17,
    "dcp_at_least_1": _moved("dcp_at_least_1", "arg_groups/parallel_hook.py:244-247"),
    "cp_strategy_required": _moved("cp_strategy_required", "arg_groups/parallel_hook.py:151-154"),
    "tp_divisible_by_attn_cp": Rule(
        "tp_divisible_by_attn_cp",
        "parse",
        "AssertionError",
        "tp_size must be divisible by attn_cp_size",
        "arg_groups/parallel_hook.py:157-161",
    ),
    "tp_divisible_by_dp_attn_cp": Rule(
        "tp_divisible_by_dp_attn_cp",
        "parse",
        "AssertionError",
        "tp_size must be divisible by attn_dp_size * attn_cp_size",
        "arg_groups/parallel_hook.py:157-168",
    ),
    "pcp_with_dcp": Rule(
        "pcp_with_dcp",
        "parse",
        "ValueError",
        "--dcp-size > 1 does not support --enable-prefill-cp.",
        "arg_groups/parallel_hook.py:249-250",
    ),
    "dcp_at_least_1_worker": _moved("dcp_at_least_1_worker", "distributed/parallel_state.py:2652-2655"),
    "tp_divisible_by_dcp": Rule(
        "tp_divisible_by_dcp",
        "worker_start",
        "RuntimeError",
        "tensor_model_parallel_size ({tp}) must be divisible by decode_context_parallel_size ({dcp})",
        "distributed/parallel_state.py:2665-2669",
    ),
    "mha_dcp_kv_not_replicated": Rule(
        "mha_dcp_kv_not_replicated",
        "silent",
        None,
        None,
        "configs/model_config.py:1700-1711",
        note="pool holds kv_heads // (tp // dcp) heads; the model must replicate KV within the DCP group "
        "(Qwen3.5 does, models/qwen3_5.py:1286-1341)",
    ),
    "dcp_disables_prefill_graph": _moved("dcp_disables_prefill_graph",
                                         "arg_groups/cuda_graph_hook.py:212-216, 240-252", note=""),
}

LOGS_0_5_23: dict[str, LogPattern] = {
    **LOGS_0_5_17,
    "kv_cache_allocated": LogPattern(
        LOGS_0_5_17["kv_cache_allocated"].regex, "mem_cache/memory_pool.py:2073-2099"
    ),
    "max_total_num_tokens": LogPattern(
        LOGS_0_5_17["max_total_num_tokens"].regex, "managers/scheduler.py:1267-1276"
    ),
    "dcp_enabled": LogPattern(LOGS_0_5_17["dcp_enabled"].regex, "distributed/parallel_state.py:2736-2739"),
    "schedulers_still_alive": LogPattern(
        r"Schedulers still alive (?P<secs>\d+)s after ShutdownReq, killing them before they released: "
        r"\[(?P<pids>[^\]]*)\]",
        "managers/tokenizer_manager.py:456, 3508-3571",
    ),
    "sigterm_received": LogPattern(
        r"SIGTERM received\. signum=(?P<signum>\S+) frame=.*Draining requests and shutting down",
        "managers/tokenizer_manager.py:4062-4070",
    ),
}

SUPPORT_0_5_23: dict[tuple[str, str, str], SupportEntry] = {
    **SUPPORT_0_5_17,
    ("*", "pcp+dcp", "*"): SupportEntry(_R, "arg_groups/parallel_hook.py:249-250"),
    ("mha", "dcp", "triton"): SupportEntry(
        _U, "layers/attention/triton_backend.py:1632-1667, 1998-2140", "Qwen3.5 tested (TP4/DCP4, B200)"
    ),
}

RELEASE_0_5_23 = Release(
    name="0.5.23",
    wheel="sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
    wheel_sha256="00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937",
    flags_file="flags-0.5.23.json",
    rules=RULES_0_5_23,
    log_patterns=LOGS_0_5_23,
    support=SUPPORT_0_5_23,
    spellings={
        **RELEASE_0_5_17.spellings,
        # arg_groups/fields/parallel.py:81-90; --dp-size N --enable-dp-attention is deprecated.
        "attn_dp": ("--attn-dp-size", "{n}"),
    },
    kv_heads_rule="attn_tp_over_dcp",
    dcp_interleave_sizes=(1,),
    sigterm_exit_statuses=frozenset({0, -9, 137}),
    rank_kill_exit_statuses=frozenset({-9, 137}),
    graph_phases=RELEASE_0_5_17.graph_phases,
    colocation_env=COLOCATION_ENV,
    colocation_flags=RELEASE_0_5_17.colocation_flags,
    follower_ranks_ended=RELEASE_0_5_17.follower_ranks_ended,
    follower_ports_checked=RELEASE_0_5_17.follower_ports_checked,
    server_info_paths=RELEASE_0_5_17.server_info_paths,
    safety=POLICY_0_5_23,
)

KNOWN_RELEASES: Mapping[str, Release] = {r.name: r for r in (RELEASE_0_5_17, RELEASE_0_5_23)}
"""Every release cptest has a table for, oldest first."""

PINNED_RELEASE: Release = RELEASE_0_5_17
"""The release the GPU machine installs (images/lock.json): every SGLang `path:line` cited outside
this package (the probe's hooks, the reference engine's HTTP shapes, topology's formulas, the
contracts' and the runner's notes) is in its wheel, and such code calls it "the pinned release"
rather than naming it. What differs between releases is a field of `Release`, never a comment there."""


def get_release(name: str) -> Release:
    """The table of release `name`. Raises `PlanError` naming the known releases and the closest one."""
    try:
        return KNOWN_RELEASES[name]
    except KeyError:
        pass
    known = list(KNOWN_RELEASES)
    guess = did_you_mean(name, known)
    hint = f"; did you mean {guess}?" if guess else ""
    raise PlanError(
        f'unknown SGLang release "{name}" (known: {", ".join(known)}{hint})',
    ) from None


def support_of(release: Release, family: str, mode: str, backend: str) -> SupportEntry | None:
    """Most specific support entry: exact backend, then the family/mode default, then any family."""
    for key in ((family, mode, backend), (family, mode, "*"), ("*", mode, "*")):
        if key in release.support:
            return release.support[key]
    return None


__all__ = [
    "KNOWN_RELEASES",
    "PARSER_TEST",
    "PINNED_RELEASE",
    "RULES_0_5_17",
    "LogPattern",
    "Provenance",
    "Release",
    "Rule",
    "Stage",
    "Support",
    "SupportEntry",
    "get_release",
    "one_of",
    "support_of",
]
