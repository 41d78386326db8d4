"""Which cells of the support matrix a release rules out, and why: release knowledge as data.

A *cell* is one combination cptest could qualify on the lent machine: model family x KV-head regime
x mode x attention backend x decode (eager or CUDA graph). `docs/support-matrix.md`
(`cptest matrix --support`, `cptest/report/support.py`) shows, for every cell, an archive that ran
it, else the rule below that rules it out (with its SGLang source lines), else the scenario that
would run it. This module holds only the rules; the archives and scenarios are read by the report.

A `CellRule` either reuses a rule of the release table (`releases.py`: `rule` names it, and its
citation, provenance and evidence are that rule's, never copied here) or carries its own citation,
for facts the admission rules do not model (a backend's kernel package, the CP-v2 model gate).
Citations are `path:line` relative to `sglang/srt/` of the release's wheel, as in releases.py; a path
starting with `sglang/` is relative to the wheel's root. The first matching rule of a release's
tuple wins, so intrinsic reasons (the model, the backend's code) come before the lent machine's.

Nothing outside this package branches on a release name: callers ask `cell_rules(name)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from cptest.engines.sglang.releases import RELEASE_0_5_17, Provenance, Release, get_release

Family = Literal["llama", "qwen3", "qwen3-moe", "mla"]
Regime = Literal["kv<=tp/dcp", "kv>tp/dcp", "latent"]
"""`kv<=tp/dcp`: every DCP group's ranks hold the same KV heads (docs/sglang.md §3); `latent`: MLA
keeps one latent KV per token whatever the degrees, so the regime does not apply."""
Mode = Literal["dcp2", "pcp2-zigzag", "pcp2-interleave"]
Backend = Literal["triton", "flashinfer", "fa3", "flashmla"]
Decode = Literal["eager", "graph"]

FAMILIES: tuple[Family, ...] = ("llama", "qwen3", "qwen3-moe", "mla")
MHA_FAMILIES: frozenset[Family] = frozenset({"llama", "qwen3", "qwen3-moe"})
MODES: tuple[Mode, ...] = ("dcp2", "pcp2-zigzag", "pcp2-interleave")
BACKENDS: tuple[Backend, ...] = ("triton", "flashinfer", "fa3", "flashmla")
DECODES: tuple[Decode, ...] = ("eager", "graph")

ARCHITECTURES: Mapping[str, Family] = {
    "LlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3-moe",
    "DeepseekV3ForCausalLM": "mla",
}
"""HF architecture class -> family. Qwen3-MoE's attention is Qwen3's (attention-TP sharding,
models/qwen3_moe.py:434-466); what sets it apart here is that it is a CP-v2 class
(layers/cp/utils.py:42-52)."""


def regimes_of(family: Family) -> tuple[Regime, ...]:
    return ("latent",) if family == "mla" else ("kv<=tp/dcp", "kv>tp/dcp")


@dataclass(frozen=True)
class Cell:
    family: Family
    regime: Regime
    mode: Mode
    backend: Backend
    decode: Decode

    def words(self) -> str:
        """The cell's coordinates in the matrix's order: `llama kv>tp/dcp dcp2 triton eager`."""
        return f"{self.family} {self.regime} {self.mode} {self.backend} {self.decode}"


def cells() -> list[Cell]:
    """Every cell of the grid, in the order the matrix shows them."""
    return [Cell(f, r, m, b, d) for f in FAMILIES for r in regimes_of(f) for m in MODES
            for b in BACKENDS for d in DECODES]  # fmt: skip


_ALL = frozenset[str]()


@dataclass(frozen=True)
class CellRule:
    """Rules out every cell whose coordinates are all in the given sets (an empty set matches all).

    `rule`: a code of the release table whose citation, provenance and evidence this reuses;
    otherwise `citation`, `provenance` and `evidence` are this rule's own."""

    code: str
    reason: str
    families: frozenset[str] = _ALL
    regimes: frozenset[str] = _ALL
    modes: frozenset[str] = _ALL
    backends: frozenset[str] = _ALL
    decodes: frozenset[str] = _ALL
    rule: str = ""
    citation: str = ""
    provenance: Provenance = "inferred"
    evidence: str = ""

    def matches(self, cell: Cell) -> bool:
        return all(not allowed or value in allowed for allowed, value in (
            (self.families, cell.family), (self.regimes, cell.regime), (self.modes, cell.mode),
            (self.backends, cell.backend), (self.decodes, cell.decode)))  # fmt: skip


@dataclass(frozen=True)
class RuledOut:
    """A rule applied to a cell, its citation resolved against the release table."""

    code: str
    reason: str
    citation: str
    provenance: Provenance
    evidence: str
    observed_on: str = ""
    """Set by `in_cell` where the rule is observed, but its cited archives ran other cells: those
    cells (`Cell.words`), the provenance then being `inferred` for this one."""


def _set(*values: str) -> frozenset[str]:
    return frozenset(values)


_MHA = frozenset[str](MHA_FAMILIES)

CELL_RULES_0_5_17: tuple[CellRule, ...] = (
    CellRule(
        "flashmla_is_mla_only",
        "FlashMLA is an MLA backend: FlashMLABackend extends the FlashInfer MLA backend",
        families=_MHA, backends=_set("flashmla"),
        citation="layers/attention/attention_registry.py:202-206; layers/attention/flashmla_backend.py:58",
    ),
    CellRule(
        "interleave_no_attention",
        "InterleaveCPStrategy.run_attention returns None: only the DSA backend (no family here) runs "
        "attention itself under interleave",
        modes=_set("pcp2-interleave"), rule="interleave_no_attention",
    ),
    CellRule(
        "llama_pcp",
        "Llama shards heads over the full TP group, not attention-TP: the first prefill's KV-pool write "
        "fails where K // tp != K // attn_tp, and CP partners hold different head shards where it does not",
        families=_set("llama"), modes=_set("pcp2-zigzag"), rule="llama_pcp",
    ),
    CellRule(
        "pcp_not_cp_v2_class",
        "0.5.17 runs generic PCP only on the CP-v2 path, on by default only for CP_V2_DEFAULT_MODEL_CLASSES "
        "(DeepSeek V3/V3.2, GLM DSA, GPT-OSS, MiMo V2, Qwen3-MoE): for dense Qwen3 the PCP flags are a "
        "silent no-op, whatever the backend",
        families=_set("qwen3"), modes=_set("pcp2-zigzag"),
        citation="layers/cp/utils.py:42-52, 131-142; server_args.py:6287-6302; environ.py:314; "
        "model_executor/runner/eager_runner.py:251-268",
        provenance="observed", evidence="results/pcp2_zigzag_qwen3_kv2/20261203T120203Z-7d85d6be",
    ),
    CellRule(
        "pcp_backend_without_cp_path",
        "only fa3 (FLASH_ATTENTION) and trtllm_mha have a zigzag CP attention path; other backends attend "
        "over the local rows only",
        modes=_set("pcp2-zigzag"), backends=_set("triton", "flashinfer", "flashmla"),
        citation="layers/cp/zigzag.py:337-341, 415-458",
    ),
    CellRule(
        "mha_dcp_kv_not_replicated",
        "MHA DCP attends each rank's own KV heads after gathering Q over the group: right only when "
        "kv_heads <= tp/dcp; no check on CUDA",
        families=_MHA, modes=_set("dcp2"), regimes=_set("kv>tp/dcp"), rule="mha_dcp_kv_not_replicated",
    ),
    CellRule(
        "mla_dcp_triton_decode",
        "triton's DCP decode is MHA code: on an MLA layer its decode kernel's shape assertion fails at the "
        "first decode and the scheduler dies",
        families=_set("mla"), modes=_set("dcp2"), backends=_set("triton"), rule="mla_dcp_triton_decode",
    ),
    CellRule(
        "dcp_fused_rope_kv_write",
        "Qwen3-MoE writes K/V inside its RoPE kernel, which on CUDA ignores DCP's owner mask and physical "
        "slots: decode reads a pool written at the wrong slots",
        families=_set("qwen3-moe"), modes=_set("dcp2"), backends=_set("triton"),
        rule="dcp_fused_rope_kv_write",
    ),
    CellRule(
        "dcp_backend_without_dcp_path",
        "among MHA backends only triton has DCP code in 0.5.17 (owner-masked writes, Q all-gather, LSE "
        "merge); flashinfer and fa3 get widened slots and no DCP path",
        families=_MHA, modes=_set("dcp2"), backends=_set("flashinfer", "fa3"),
        rule="dcp_backend_without_dcp_path",
    ),
    CellRule(
        "mla_dcp_flashmla_lse_unpacked",
        "FlashMLA returns (output, LSE) under DCP, and the MLA layer, which does not count FlashMLA among "
        "its absorb-core backends, reshapes the tuple: the scheduler dies at the first decode",
        families=_set("mla"), modes=_set("dcp2"), backends=_set("flashmla"),
        rule="mla_dcp_flashmla_lse_unpacked",
    ),
    CellRule(
        "mla_dcp_fa3_no_lse",
        "the MLA layer's DCP decode needs (output, LSE) from the backend; fa3's MLA decode returns the "
        "output alone: the scheduler dies at the first decode",
        families=_set("mla"), modes=_set("dcp2"), backends=_set("fa3"), rule="mla_dcp_fa3_no_lse",
    ),
)
"""0.5.17's rules, first match first."""

SUPPORT_RELEASE = RELEASE_0_5_17.name
"""The release of the lent machine's bundle: the one release with cell rules, `cptest matrix
--support`'s default (`default_release`)."""

CELL_RULES: Mapping[str, tuple[CellRule, ...]] = {SUPPORT_RELEASE: CELL_RULES_0_5_17}
"""Release -> its cell rules. Only the release of the lent machine's bundle has a table."""


def default_release() -> str:
    """The SGLang release a command that takes `--release` uses without one: the release whose cell
    rules cptest has (`SUPPORT_RELEASE`), so that its default always has a table to read."""
    return SUPPORT_RELEASE


def cell_rules(release: str) -> tuple[CellRule, ...]:
    """The cell rules of `release`. Raises PlanError for a release cptest does not know at all, and
    KeyError naming the releases that have cell rules for one it knows without them."""
    get_release(release)
    try:
        return CELL_RULES[release]
    except KeyError:
        have = ", ".join(CELL_RULES)
        raise KeyError(f"no support-matrix rules for SGLang {release} (have: {have})") from None


def ruled_out(release: Release, cell: Cell) -> RuledOut | None:
    """The first rule of the release that rules `cell` out, its citation resolved; None if none does."""
    for r in cell_rules(release.name):
        if not r.matches(cell):
            continue
        if r.rule:
            base = release.rules[r.rule]
            return RuledOut(r.code, r.reason, base.citation, base.provenance, base.evidence)
        return RuledOut(r.code, r.reason, r.citation, r.provenance, r.evidence)
    return None


def evidence_archives(evidence: str) -> tuple[str, ...]:
    """The archives (`results/<scenario>/<run>`) an evidence text cites, in its order; other
    evidence (a test, a CI run) is not an archive of a cell."""
    return tuple(part.strip() for part in evidence.split(";") if part.strip().startswith("results/"))


def in_cell(rule: RuledOut, cell: Cell, ran: Callable[[str], object]) -> RuledOut:
    """`rule` as `cell` shows it. An observed rule whose evidence cites archives is observed only in
    the cell one of them ran (same family, KV regime, mode, backend and decode; `ran(archive)` says
    where an archive ran: a Cell, or anything else for no cell of the grid); in any other cell it
    matches it is inferred from the source, `observed_on` naming where it was seen. A rule observed
    by other means (the release's own parser in CI) or inferred is returned as it is."""
    archives = evidence_archives(rule.evidence)
    if rule.provenance != "observed" or not archives:
        return rule
    places = [ran(a) for a in archives]
    if cell in places:
        return rule
    seen = [p.words() if isinstance(p, Cell) else f"{a} (no cell of the grid)"
            for a, p in zip(archives, places, strict=True)]
    return replace(rule, provenance="inferred", observed_on="; ".join(dict.fromkeys(seen)))


__all__ = ["ARCHITECTURES", "BACKENDS", "DECODES", "FAMILIES", "MODES", "Cell", "CellRule", "RuledOut",
           "cell_rules", "cells", "default_release", "evidence_archives", "in_cell", "regimes_of",
           "ruled_out"]
