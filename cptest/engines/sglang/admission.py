"""Predict whether SGLang admits a launch, where it would reject it, and what it would silently get wrong.

Pure. The *conditions* below are the same for every release; whether a condition rejects (and with
which message, at which stage) is data in the release table (`releases.Release.rules`). So a rule
that is silent in 0.5.17 and a parse error in 0.5.23 (PCP with DCP) needs no version check here.
Used by `cptest lint` and by `plan` to compare a scenario's `expect launch ...` with the release.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cptest.engines.sglang.releases import Release, Rule
from cptest.scenario import Scenario
from cptest.topology import Degrees, kv_replicated_in_dcp_group, layout_codes

AdmissionStage = Literal["parse", "worker_start", "runtime", "accepted"]

ATTENTION_OVER_FULL_TP = frozenset({"LlamaForCausalLM"})
"""Architectures whose attention shards heads over the full TP group rather than attention-TP
(0.5.17 `models/llama.py:158-166`), so prefill CP hands CP partners different head shards."""

CP_V1_ARCHITECTURES = frozenset({"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM",
                                 "GlmMoeDsaForCausalLM", "DeepseekV4ForCausalLM", "Qwen3MoeForCausalLM"})
"""Architectures that split prefill rows on a path of their own when CP v2 is off (docs/sglang.md §3)."""
DSA_CANDIDATES = frozenset({
    "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLMNextN",
    "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM",
    "GlmMoeDsaForCausalLMNextN", "LongcatFlashForCausalLM", "LongcatFlashForCausalLMNextN",
})
"""Architectures that are DSA when the checkpoint has an indexer (`index_topk`): SGLang's
`is_deepseek_dsa` (0.5.17 `configs/model_config.py:106-121`)."""
DSA_BY_DEFAULT = frozenset({"DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"})
"""The candidates whose published checkpoints all carry an indexer: DSA when the config was not read."""


@dataclass(frozen=True)
class LaunchConfig:
    """What admission depends on: the degrees, model facts, backend, platform.

    `heads`/`kv_heads` of 0 mean unknown: rules that need them are skipped, not guessed.
    `min_prompt_len` is the shortest prompt the workload sends (None: unknown).
    """

    degrees: Degrees
    architecture: str = ""
    heads: int = 0
    kv_heads: int = 0
    is_mla: bool = False
    attention_backend: str | None = None
    platform: str = "cuda"
    min_prompt_len: int | None = None
    env: tuple[tuple[str, str], ...] = ()
    """The scenario's `serve { env }` (a release may read one: `Release.pcp_force_env`)."""
    dsa_indexer: bool | None = None
    """Whether the checkpoint has a DSA indexer (`ModelFacts.dsa_indexer`; None: not read)."""
    pcp_splits: bool = True
    """Whether the release's prefill CP splits rows for this architecture at all (`predict` sets it
    from `Release.pcp_model_classes`): where it does not, the rules about what a split gets wrong
    cannot apply."""

    @property
    def attn_tp(self) -> int:
        return self.degrees.attn_tp

    def values(self) -> dict[str, object]:
        """Every field by name, the degrees' among them: what rule messages are formatted with."""
        out: dict[str, object] = {k: v for k, v in vars(self).items() if k not in ("degrees", "env")}
        return {**self.degrees.model_dump(), **out}


class AdmissionWarning(BaseModel):
    """Something SGLang accepts but gets wrong or ignores without saying so."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    code: str
    message: str
    citation: str


class Admission(BaseModel):
    """The prediction (the plan records it). `accepted` is False only for a rule with an exception
    in this release; `message` is then SGLang's text (what `expect launch rejected matching "..."`
    should match)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    accepted: bool
    stage: AdmissionStage
    message: str | None
    citation: str
    warnings: tuple[AdmissionWarning, ...] = ()
    exception: str | None = None
    rule: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """The code of the rule that rejects the launch (None when accepted)."""
    cp_v1: bool = Field(default=False, exclude_if=lambda v: not v)
    """The launch splits prefill rows on a model's own CP-v1 path that the probe reads (`cp_v1_splits`):
    no padding to the strategy's alignment, and the MoE gather pads each shard to the longest."""

    @property
    def split_unobserved(self) -> str | None:
        """Why the probe cannot see this launch's prefill split, when a rule says so (None: it can)."""
        return next((w.message for w in self.warnings if w.code in UNOBSERVED_SPLIT), None)


UNOBSERVED_SPLIT = frozenset({"pcp_cp_v1_unobserved"})
"""Rules under which rows are split where the probe does not look: the row contracts are unknown."""


def launch_config(scenario: Scenario) -> LaunchConfig:
    """What admission depends on, read from a scenario (its shortest prompt included)."""
    topo, facts = scenario.topology, scenario.model.facts
    return LaunchConfig(
        degrees=topo.as_degrees(), architecture=facts.architecture,
        heads=facts.heads, kv_heads=facts.kv_heads, is_mla=facts.is_mla, dsa_indexer=facts.dsa_indexer,
        attention_backend=scenario.serve.attention_backend,
        min_prompt_len=scenario.workload.prompt_tokens.bounds()[0],
        env=tuple(sorted(scenario.serve.env.items())),
    )  # fmt: skip


Predicate = Callable[[LaunchConfig], bool]

def _layout(code: str) -> Predicate:
    """A condition that is one of `cptest.topology`'s layout rules: the arithmetic lives there once."""
    return lambda c: code in layout_codes(c.degrees)


# SGLang's evaluation order: `_handle_dcp_validation` (server_args.py:3501) runs before
# `_handle_data_parallelism` (its tp % dp_size assert, server_args.py:6464), which runs before the CP
# block (server_args.py:6319-6345); worker-start checks run in `initialize_model_parallel` afterwards.
CONDITIONS: tuple[tuple[str, Predicate], ...] = (
    ("dcp_at_least_1", lambda c: c.degrees.dcp < 1),
    ("pcp_with_dcp", lambda c: c.degrees.prefill_cp and c.degrees.dcp > 1),
    ("tp_divisible_by_attn_dp", lambda c: c.degrees.attn_dp > 1 and c.degrees.tp % c.degrees.attn_dp != 0),
    ("cp_strategy_required", _layout("cp_strategy_required")),
    ("tp_divisible_by_attn_cp", _layout("tp_divisible_by_attn_cp")),
    ("tp_divisible_by_dp_attn_cp", _layout("tp_divisible_by_dp_attn_cp")),
    ("dcp_platform", lambda c: c.degrees.dcp > 1 and c.platform not in ("cuda", "hip")),
    ("tp_divisible_by_dcp", _layout("tp_divisible_by_dcp")),
    ("prefill_cp_needs_attn_cp", _layout("prefill_cp_needs_attn_cp")),
    ("attn_cp_without_prefill_cp", lambda c: c.degrees.attn_cp > 1 and not c.degrees.prefill_cp),
    (
        "zigzag_short_prompt",
        lambda c: _pcp(c, "zigzag") and _shorter(c, 2 * c.degrees.attn_cp),
    ),
    (
        "interleave_short_batch",
        lambda c: _pcp(c, "interleave") and _shorter(c, c.degrees.attn_cp),
    ),
    ("pcp_cp_v1_unobserved", lambda c: _cp_v1(c) and _round_robin(c)),
    ("pcp_cp_v1_interleave_zigzag", lambda c: _cp_v1(c) and _pcp(c, "interleave") and not _round_robin(c)),
    (
        "interleave_no_attention",
        lambda c: _pcp(c, "interleave") and c.pcp_splits and not _attention_runs_interleave(c),
    ),
    # Observed on 0.5.17: with DCP the PCP split never activates (results/pcp_dcp_rejected), and
    # it crashes only when the KV heads Llama computes per rank (full-TP shard) differ from what
    # the attention-TP-sized pool row holds (results/pcp2_zigzag_llama_kv2).
    ("llama_attention_dp", lambda c: c.degrees.attn_dp > 1 and c.architecture in ATTENTION_OVER_FULL_TP),
    ("llama_pcp", lambda c: _llama_pcp(c) and _kv_row_mismatch(c)),
    ("llama_pcp_silent", lambda c: _llama_pcp(c) and c.pcp_splits and not _kv_row_mismatch(c)),
    (
        "mha_dcp_kv_not_replicated",
        lambda c: (
            c.degrees.dcp > 1
            and not c.is_mla
            and c.kv_heads > 0
            and not _layout("tp_divisible_by_dcp")(c)
            and not kv_replicated_in_dcp_group(c.attn_tp, c.degrees.dcp, c.kv_heads)
        ),
    ),
    (
        "dcp_backend_without_dcp_path",
        lambda c: c.degrees.dcp > 1 and not c.is_mla and c.attention_backend != "triton",
    ),
    ("dcp_disables_prefill_graph", lambda c: c.degrees.dcp > 1),
    # Last: it fires at the first decode padded to the longest DP rank, after every other rule's stage
    # (llama_pcp's first prefill among them); at attention DP 2 that is the launch's warm-up, at 3 or
    # more a later decode (the warm-up all-reduces instead). Llama gathers no attention-DP buffer.
    ("pcp_attention_dp_gather", lambda c: _cp_in_dp_gather(c) and c.degrees.attn_dp == 2),
    ("pcp_attention_dp_gather_wide", lambda c: _cp_in_dp_gather(c) and c.degrees.attn_dp > 2),
)


def _cp_in_dp_gather(c: LaunchConfig) -> bool:
    """Attention CP inside attention DP on a model whose MLP gathers the attention-DP buffer."""
    return c.degrees.attn_cp > 1 and c.degrees.attn_dp > 1 and c.architecture not in ATTENTION_OVER_FULL_TP


def _shorter(c: LaunchConfig, tokens: int) -> bool:
    return c.min_prompt_len is not None and c.min_prompt_len < tokens


def _llama_pcp(c: LaunchConfig) -> bool:
    return _pcp(c, None) and c.degrees.dcp == 1 and c.architecture in ATTENTION_OVER_FULL_TP


def _kv_row_mismatch(c: LaunchConfig) -> bool:
    # Pool rows hold max(1, K // attn_tp) heads; Llama's K projection yields max(1, K // tp).
    return c.kv_heads > 0 and max(1, c.kv_heads // c.attn_tp) != max(1, c.kv_heads // c.degrees.tp)


def _pcp(c: LaunchConfig, strategy: str | None) -> bool:
    d = c.degrees
    return d.pcp and (strategy is None or d.cp_strategy == strategy)


# What applies to *this* config, said before a silent rule's general note.
SITUATIONS: dict[str, str] = {
    "pcp_with_dcp": "--enable-prefill-cp with --dcp-size {dcp}",
    "prefill_cp_needs_attn_cp": "--enable-prefill-cp with --attn-cp-size {attn_cp}",
    "attn_cp_without_prefill_cp": "--attn-cp-size {attn_cp} without --enable-prefill-cp",
    "zigzag_short_prompt": "zigzag with attn_cp {attn_cp} and prompts as short as {min_prompt_len} tokens",
    "interleave_short_batch": "interleave with attn_cp {attn_cp} and prompts as short as {min_prompt_len}",
    "interleave_no_attention": "--cp-strategy interleave on {architecture}",
    "llama_pcp": "prefill CP on {architecture}",
    "llama_attention_dp": "attention DP {attn_dp} on {architecture}",
    "llama_pcp_silent": "prefill CP on {architecture} with {kv_heads} KV head(s)",
    "pcp_attention_dp_gather": "attention CP {attn_cp} inside attention DP {attn_dp} on {architecture}",
    "pcp_attention_dp_gather_wide": "attention CP {attn_cp} inside attention DP {attn_dp} on {architecture}",
    "mha_dcp_kv_not_replicated": "{kv_heads} KV heads with tp {tp} and dcp {dcp}",
    "dcp_backend_without_dcp_path": "DCP with attention backend {attention_backend}",
}


def _render(rule: Rule, cfg: LaunchConfig) -> str:
    values = cfg.values()
    if rule.message is not None:
        return rule.message.format(**values)
    situation = SITUATIONS.get(rule.code)
    return f"{situation.format(**values)}: {rule.note}" if situation else rule.note


ENV_TRUE = ("true", "1", "yes", "y")
ENV_FALSE = ("false", "0", "no", "n")
"""How the pinned release reads a boolean variable, case aside (0.5.17 `environ.py:125-132`, `EnvBool`)."""


def pcp_splits(release: Release, cfg: LaunchConfig) -> bool:
    """Whether `release`'s generic prefill CP path (CP v2) splits rows for `cfg`: on every
    architecture where the release names no classes; else, where the scenario sets `pcp_force_env`,
    as its value reads (a value that is no boolean reads as the variable's default, off, with a
    warning: 0.5.17 `environ.py:49-70`), and where it does not, on the release's classes, a DSA one
    only for interleave (`ServerArgs._handle_context_parallelism`, 0.5.17 `server_args.py:6287-6302`).
    DSA is SGLang's test (`is_dsa`). With the path off, DeepSeek V2/V3/V4 and Qwen3-MoE split on
    model-local CP-v1 paths that cptest's probe does not hook (docs/sglang.md §3): this predicts the
    CP-v2 split only."""
    classes = release.pcp_model_classes
    if classes is None:
        return True
    env = dict(cfg.env).get(release.pcp_force_env or "")
    if env is not None:  # set at all: the class default is not applied
        return env.lower() in ENV_TRUE
    dsa = is_dsa(cfg)
    interleave = cfg.degrees.prefill_cp and cfg.degrees.cp_strategy == "interleave"
    return cfg.architecture in classes and (not dsa or interleave)


def _cp_v1(cfg: LaunchConfig) -> bool:
    """Prefill CP on an architecture with a CP-v1 path of its own, CP v2 off (`pcp_splits`)."""
    return cfg.degrees.pcp and not cfg.pcp_splits and cfg.architecture in CP_V1_ARCHITECTURES


def _round_robin(cfg: LaunchConfig) -> bool:
    """DSA's round-robin split: interleave where the DSA prefill CP path runs, a DSA model or
    DeepSeek V4 (`layers/attention/dsa/utils.py:105-109`); its CP metadata is empty
    (`layers/utils/cp_utils.py:482-483`)."""
    return _pcp(cfg, "interleave") and _attention_runs_interleave(cfg)


def cp_v1_splits(cfg: LaunchConfig) -> bool:
    """Whether the launch splits prefill rows on a model's own CP-v1 path in the zigzag layout that
    the probe reads at `cp_split_and_rebuild_position` (`cptest.probe.hooks`): CP v2 off on a CP-v1
    architecture, DSA's round-robin split excepted. `cfg.pcp_splits` must be set (`predict` does)."""
    return _cp_v1(cfg) and not _round_robin(cfg)


def _attention_runs_interleave(cfg: LaunchConfig) -> bool:
    """Whether the model's attention backend runs interleave CP itself (`layers/cp/interleave.py:222-233`):
    a DSA model's, or DeepSeek V4's own."""
    return is_dsa(cfg) or cfg.architecture == "DeepseekV4ForCausalLM"


def is_dsa(cfg: LaunchConfig) -> bool:
    """SGLang's `is_deepseek_dsa`: a candidate architecture with an indexer. Where the config was not
    read (`dsa_indexer` None), the architecture's published checkpoints decide (`DSA_BY_DEFAULT`)."""
    if cfg.architecture not in DSA_CANDIDATES:
        return False
    return cfg.dsa_indexer if cfg.dsa_indexer is not None else cfg.architecture in DSA_BY_DEFAULT


def predict(release: Release, cfg: LaunchConfig) -> Admission:
    """What `release` does with `cfg`: the first rejecting rule (in SGLang's order), else accepted,
    with a warning for every silent or inferred problem that applies. Never raises for a config."""
    warnings: list[AdmissionWarning] = []
    cfg = replace(cfg, pcp_splits=pcp_splits(release, cfg))
    for code, cond in CONDITIONS:
        rule = release.rules.get(code)
        if rule is None or not cond(cfg):
            continue
        if rule.exception is not None and rule.stage in ("parse", "worker_start", "runtime"):
            return Admission(
                accepted=False,
                stage=rule.stage,
                message=_render(rule, cfg),
                citation=rule.citation,
                warnings=tuple(warnings),
                exception=rule.exception,
                rule=code,
            )
        warnings.append(AdmissionWarning(code=code, message=_render(rule, cfg), citation=rule.citation))
    return Admission(accepted=True, stage="accepted", message=None, citation="", warnings=tuple(warnings),
                     cp_v1=cp_v1_splits(cfg))
