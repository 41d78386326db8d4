"""The language's knowledge as data: which keys each block has, their order, types and ranges.

The grammar (cps.lark) lists the same keywords; tests/lang/test_tables.py checks that the two agree.
`BLOCK_KEYS` gives the canonical order the formatter prints; `SETTINGS` drives the type and range
checks of cptest/lang/validate.py and the reference in docs/language.md.
"""

from __future__ import annotations

from dataclasses import dataclass

TOP_BLOCK = "scenario"
"""Name used for the scenario (or defaults) body in BLOCK_KEYS."""

BLOCK_KEYS: dict[str, tuple[str, ...]] = {
    TOP_BLOCK: (
        "description", "exclusive", "extends", "engine", "model", "facts", "topology", "serve", "baseline",
        "workload", "fault", "expect",
    ),
    "model": (
        "layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "intermediate", "seed",
        "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    ),
    "facts": ("architecture", "layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "mla"),
    "topology": ("gpus", "nodes", "tp", "dcp", "attn_cp", "attn_dp", "pp", "prefill_cp", "cp_strategy"),
    "serve": (
        "attention_backend", "cuda_graph_decode", "cuda_graph_prefill", "page_size", "max_total_tokens",
        "mem_fraction", "context_length", "sampling_backend", "skip_tokenizer_init", "flag", "env",
    ),
    "baseline": ("gpus", "tp", "dcp", "attn_cp", "attn_dp", "prefill_cp", "cp_strategy"),
    "workload": (
        "requests", "concurrency", "rate", "seed", "prompt_tokens", "output_tokens", "sampling",
        "logprobs", "source", "timeout", "ignore_eos",
    ),
    "sampling": ("temperature", "top_p", "top_k", "seed"),
    "expect": (
        "launch", "rows", "capacity", "generation", "graph", "serving", "shutdown", "log", "violated",
    ),
}  # fmt: skip

EXPECT_ORDER: tuple[str, ...] = (
    "launch", "rows", "capacity", "generation", "graph decode", "graph prefill", "serving", "shutdown", "log",
)  # fmt: skip
"""Canonical order of expectation statement keys (graph is keyed by phase)."""

LIST_KEYS: frozenset[tuple[str, str]] = frozenset(
    {("", "fault"), ("serve", "flag"), ("serve", "env"), ("expect", "log")}
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


def _i(field: str, lo: int = 1) -> Setting:
    return Setting("int", field, min=lo)


SETTINGS: dict[str, dict[str, Setting]] = {
    "topology": {
        "gpus": _i("gpus"), "nodes": _i("nodes"), "tp": _i("tp"), "dcp": _i("dcp"),
        "attn_cp": _i("attn_cp"), "attn_dp": _i("attn_dp"), "pp": _i("pp"),
        "prefill_cp": Setting("bool", "prefill_cp"),
        "cp_strategy": Setting("word", "cp_strategy", choices=("zigzag", "interleave")),
    },
    "baseline": {
        "gpus": _i("gpus"), "tp": _i("tp"), "dcp": _i("dcp"), "attn_cp": _i("attn_cp"),
        "attn_dp": _i("attn_dp"), "prefill_cp": Setting("bool", "prefill_cp"),
        "cp_strategy": Setting("word", "cp_strategy", choices=("zigzag", "interleave")),
    },
    "serve": {
        "attention_backend": Setting("text", "attention_backend"),
        "cuda_graph_decode": Setting("word", "cuda_graph_decode", choices=GRAPH_BACKENDS),
        "cuda_graph_prefill": Setting("word", "cuda_graph_prefill", choices=GRAPH_BACKENDS),
        "page_size": _i("page_size"),
        "max_total_tokens": _i("max_total_tokens"),
        "mem_fraction": Setting("float", "mem_fraction", min=0.0, max=1.0, min_exclusive=True),
        "context_length": _i("context_length"),
        "sampling_backend": Setting("text", "sampling_backend"),
        "skip_tokenizer_init": Setting("bool", "skip_tokenizer_init"),
    },
    "workload": {
        "requests": _i("requests"),
        "concurrency": _i("concurrency"),
        "rate": Setting("float", "rate", min=0.0, min_exclusive=True),
        "seed": _i("seed", 0),
        "prompt_tokens": Setting("dist", "prompt_tokens", min=1),
        "output_tokens": Setting("dist", "output_tokens", min=1),
        "logprobs": Setting("bool", "logprobs"),
        "timeout": Setting("duration", "timeout_s", min=0.0, min_exclusive=True),
        "ignore_eos": Setting("bool", "ignore_eos"),
    },
    "sampling": {
        "temperature": Setting("float", "temperature", min=0.0),
        "top_p": Setting("float", "top_p", min=0.0, max=1.0, min_exclusive=True),
        "top_k": Setting("int", "top_k", min=-1),
        "seed": _i("seed", 0),
    },
    "model": {k: _i(k, 0 if k in ("seed", "q_lora_rank") else 1) for k in BLOCK_KEYS["model"]},
    "facts": {
        "architecture": Setting("text", "architecture"),
        **{k: _i(k) for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab")},
        "mla": Setting("bool", "is_mla"),
    },
}  # fmt: skip

ENGINE_KINDS = ("sglang", "reference")
MODEL_KINDS = ("local", "hub", "synthetic")
SYNTHETIC_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "deepseek_mla": "DeepseekV3ForCausalLM",
}
"""Synthetic architecture -> HF class name (the names .tiny-models/*/config.json use)."""
MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
FAULT_ACTIONS = ("kill", "stop", "cont", "sigterm", "sigint")
SERVER_ONLY_ACTIONS = ("sigterm", "sigint")
DIST_FUNCS = ("uniform", "choice")
