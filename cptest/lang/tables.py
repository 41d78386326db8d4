"""The language's knowledge as data: which keys each block has, their order, types and ranges.

The grammar (cps.lark) lists the same keywords; tests/lang/test_tables.py checks that the two agree.
`BLOCK_KEYS` gives the canonical order the formatter prints; `SETTINGS` drives the type and range
checks of cptest/lang/settings.py and the reference in docs/language.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from cptest.contracts import CONTRACTS

TOP_BLOCK = "scenario"
"""Name used for the scenario (or defaults) body in BLOCK_KEYS."""

BLOCK_KEYS: dict[str, tuple[str, ...]] = {
    TOP_BLOCK: (
        "description", "exclusive", "unsafe", "deadline", "extends", "engine", "model", "facts", "topology",
        "serve", "baseline", "workload", "fault", "expect",
    ),
    "model": (
        "layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "intermediate", "seed",
        "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
        "experts", "experts_per_tok", "moe_intermediate",
    ),
    "facts": (
        "architecture", "layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "mla", "dsa_indexer",
    ),
    "topology": ("gpus", "nodes", "tp", "dcp", "attn_cp", "attn_dp", "pp", "prefill_cp", "cp_strategy"),
    "serve": (
        "attention_backend", "cuda_graph_decode", "cuda_graph_prefill", "page_size", "max_total_tokens",
        "mem_fraction", "context_length", "sampling_backend", "skip_tokenizer_init", "flag", "env",
    ),
    "baseline": ("gpus", "tp", "dcp", "attn_cp", "attn_dp", "prefill_cp", "cp_strategy"),
    "workload": (
        "requests", "concurrency", "rate", "seed", "prompt_tokens", "output_tokens", "sampling",
        "logprobs", "source", "timeout", "ignore_eos", "fill_drain",
    ),
    "sampling": ("temperature", "top_p", "top_k", "seed"),
    "expect": (*dict.fromkeys(c.syntax.keyword for c in CONTRACTS.values()), "violated"),
}  # fmt: skip

EXPECT_ORDER: tuple[str, ...] = tuple(key for c in CONTRACTS.values() for key in c.keys)
"""Canonical order of expectation statement keys: the registry's (graph is keyed by phase)."""

EXPECT_KEYS: dict[str, str] = {key: c.name for c in CONTRACTS.values() for key in c.keys}
"""Expectation statement key -> its contract's name."""


def contract_of(key: str) -> str:
    """The contract an expectation statement's key belongs to (a key no contract lists, such as a
    `graph` statement of an unknown phase, by its first word)."""
    return EXPECT_KEYS.get(key, key.split()[0])


LIST_KEYS: frozenset[tuple[str, str]] = frozenset(
    {("", "fault"), ("serve", "flag"), ("serve", "env")}
    | {("expect", c.name) for c in CONTRACTS.values() if c.listed}
)
"""Statements that may repeat; everything else may appear once per block."""


@dataclass(frozen=True)
class Setting:
    """Type and range of one `key value` setting."""

    kind: str
    """int, float, bool, word (one of `choices`), text (string or word), duration, dist."""
    field: str
    """Field of the typed model it sets."""
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    choices: tuple[str, ...] = ()


GRAPH_BACKENDS = ("full", "breakable", "disabled")


# ------------------------------------------------------------------------------------ limits
# Bounds on what one scenario may ask for, so that no input exhausts memory, overflows a fixed-width
# field downstream (SGLang's int64 seeds, numpy's uint32 token ids) or makes the plan huge. Each is far
# above what a qualification scenario needs; exceeding one is bad input (exit 2) at the setting.
MAX_GPUS = 1024
"""gpus, tp, dcp, attn_cp, attn_dp, pp, nodes (and a baseline's)."""
MAX_REQUESTS = 100_000
MAX_CONCURRENCY = 4096
MAX_TOKENS = 1 << 20
"""prompt_tokens, output_tokens, and each value of uniform()/choice() (1,048,576)."""
MAX_CHOICES = 1024
"""Values of one choice(...)."""
MAX_PLAN_TOKENS = 1 << 25
"""requests x the largest prompt: the token ids the plan stores (33,554,432, about 180 MB of JSON)."""
MAX_VOCAB = 1 << 22
"""4,194,304 token ids (the largest real vocabularies are about 262,144)."""
MAX_GEOMETRY = 1 << 20
"""Every other synthetic geometry or facts integer (layers, hidden, heads, ...)."""
MAX_SYNTHETIC_PARAMS = 16_000_000_000
"""Parameters of a synthetic model (written by cptest on first use: 32 GB in bf16)."""
MAX_SEED = (1 << 63) - 1
"""Seeds travel to SGLang as int64."""
MAX_SERVE_INT = 1 << 31
"""page_size, max_total_tokens, context_length."""
MAX_DATASET_BYTES = 256 << 20
"""A `source dataset` file is read whole into the plan: at most 256 MiB, and a regular file."""
MAX_TIMEOUT_S = 24 * 3600.0
"""A request's timeout and a fault's time."""
DEFAULT_DEADLINE_S = 3600.0
"""A whole run's wall-clock limit when the scenario declares none (`deadline 2h` raises it)."""
MAX_DEADLINE_S = 7 * 24 * 3600.0
MAX_SCENARIO_BYTES = 1 << 20
"""A scenario or defaults file: a regular file of at most 1 MiB."""
MAX_REGEX_CHARS = 4096
"""Length of a `log contains/absent` or `launch rejected matching` pattern."""
MAX_TEXT_CHARS = 65536
"""Any string of a scenario (descriptions, reasons, flag values, env values)."""
MAX_LIST_ENTRIES = 256
"""flag, env, fault and log statements of one scenario, each."""


def _i(field: str, lo: int = 1, hi: float | None = None) -> Setting:
    return Setting("int", field, min=lo, max=hi)


def _g(field: str, lo: int = 1) -> Setting:
    return _i(field, lo, MAX_VOCAB if field == "vocab" else MAX_SEED if field == "seed" else MAX_GEOMETRY)


SETTINGS: dict[str, dict[str, Setting]] = {
    "scenario": {
        "deadline": Setting("duration", "deadline_s", min=0.0, min_exclusive=True, max=MAX_DEADLINE_S),
    },
    "topology": {
        "gpus": _i("gpus", 1, MAX_GPUS), "nodes": _i("nodes", 1, MAX_GPUS), "tp": _i("tp", 1, MAX_GPUS),
        "dcp": _i("dcp", 1, MAX_GPUS), "attn_cp": _i("attn_cp", 1, MAX_GPUS),
        "attn_dp": _i("attn_dp", 1, MAX_GPUS), "pp": _i("pp", 1, MAX_GPUS),
        "prefill_cp": Setting("bool", "prefill_cp"),
        "cp_strategy": Setting("word", "cp_strategy", choices=("zigzag", "interleave")),
    },
    "baseline": {
        "gpus": _i("gpus", 1, MAX_GPUS), "tp": _i("tp", 1, MAX_GPUS), "dcp": _i("dcp", 1, MAX_GPUS),
        "attn_cp": _i("attn_cp", 1, MAX_GPUS), "attn_dp": _i("attn_dp", 1, MAX_GPUS),
        "prefill_cp": Setting("bool", "prefill_cp"),
        "cp_strategy": Setting("word", "cp_strategy", choices=("zigzag", "interleave")),
    },
    "serve": {
        "attention_backend": Setting("text", "attention_backend"),
        "cuda_graph_decode": Setting("word", "cuda_graph_decode", choices=GRAPH_BACKENDS),
        "cuda_graph_prefill": Setting("word", "cuda_graph_prefill", choices=GRAPH_BACKENDS),
        "page_size": _i("page_size", 1, MAX_SERVE_INT),
        "max_total_tokens": _i("max_total_tokens", 1, MAX_SERVE_INT),
        "mem_fraction": Setting("float", "mem_fraction", min=0.0, max=1.0, min_exclusive=True),
        "context_length": _i("context_length", 1, MAX_SERVE_INT),
        "sampling_backend": Setting("text", "sampling_backend"),
        "skip_tokenizer_init": Setting("bool", "skip_tokenizer_init"),
    },
    "workload": {
        "requests": _i("requests", 1, MAX_REQUESTS),
        "concurrency": _i("concurrency", 1, MAX_CONCURRENCY),
        "rate": Setting("float", "rate", min=0.0, min_exclusive=True, max=1e6),
        "seed": _i("seed", 0, MAX_SEED),
        "prompt_tokens": Setting("dist", "prompt_tokens", min=1, max=MAX_TOKENS),
        "output_tokens": Setting("dist", "output_tokens", min=1, max=MAX_TOKENS),
        "logprobs": Setting("bool", "logprobs"),
        "timeout": Setting("duration", "timeout_s", min=0.0, min_exclusive=True, max=MAX_TIMEOUT_S),
        "ignore_eos": Setting("bool", "ignore_eos"),
        "fill_drain": Setting("float", "fill_drain", min=0.0, min_exclusive=True, max=1.0),
    },
    "sampling": {
        "temperature": Setting("float", "temperature", min=0.0, max=1e6),
        "top_p": Setting("float", "top_p", min=0.0, max=1.0, min_exclusive=True),
        "top_k": Setting("int", "top_k", min=-1, max=MAX_VOCAB),
        "seed": _i("seed", 0, MAX_SEED),
    },
    "model": {k: _g(k, 0 if k in ("seed", "q_lora_rank") else 1) for k in BLOCK_KEYS["model"]},
    "facts": {
        "architecture": Setting("text", "architecture"),
        **{k: _g(k) for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab")},
        "mla": Setting("bool", "is_mla"),
        "dsa_indexer": Setting("bool", "dsa_indexer"),
    },
}  # fmt: skip

ENGINE_KINDS = ("sglang", "reference")
MODEL_KINDS = ("local", "hub", "synthetic")
SYNTHETIC_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_mla": "DeepseekV3ForCausalLM",
}
"""Synthetic architecture -> HF class name (the names .tiny-models/*/config.json use)."""
MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
MOE_KEYS = ("experts", "experts_per_tok", "moe_intermediate")
"""The geometry keys of `qwen3_moe` only (every layer a sparse MoE block)."""
FAULT_ACTIONS = ("kill", "stop", "cont", "sigterm", "sigint")
SERVER_ONLY_ACTIONS = ("sigterm", "sigint")
DIST_FUNCS = ("uniform", "choice")
