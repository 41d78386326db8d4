"""The support matrix: every cell of model family x KV regime x mode x backend x decode on the lent
machine, from scenarios x published archives x release knowledge: docs/support-matrix.md.

A cell is exactly one of:
- **run**: a published SGLang archive whose scenario falls in the cell (its verdict, each contract's);
- **ruled out**: a rule of `cptest/engines/sglang/cells.py` applies (its SGLang source lines);
- **not yet run**: neither; the scenarios that would run it are named, or why none can yet.

A run wins over a rule (the evidence is shown, and the rule beside it). A rule is shown observed
only in the cell its cited archive ran; in the other cells it rules out it is inferred, and says
where it was observed (`cells.in_cell`). Scenarios that fall in no
cell (more GPUs than the machine lends, TP only, PCP with DCP) are rows of a second table, under
the same three states. `support_matrix` is pure (parsed scenarios and verdict rows in, a value
out); `read_inputs` reads the folders; `render_support` writes docs/support-matrix.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cptest.contracts import CONTRACTS
from cptest.engines.protocol import MAX_COLOCATED_RANKS
from cptest.engines.sglang.cells import (
    ARCHITECTURES,
    Cell,
    RuledOut,
    cells,
    in_cell,
    ruled_out,
)
from cptest.engines.sglang.releases import Release
from cptest.errors import CptestError
from cptest.report import Judge
from cptest.report.text import md_inline
from cptest.scenario import Scenario
from cptest.topology import PlacementMode

State = Literal["run", "ruled out", "not yet run"]

LENT_GPUS = 1
"""The GPUs the device machine lends: one H200. Every rank of a scenario runs on it co-located
(docs/placement.md), up to `MAX_COLOCATED_RANKS` ranks a server."""

GAPS: Mapping[str, str] = {}
"""Family -> why a not-yet-run cell of it has no scenario (a gap of cptest, not of SGLang). Empty: cptest
writes synthetic weights of every family in the grid; a family cptest cannot write a model of goes here."""

CHECKER_ORDER = tuple(CONTRACTS)
"""The order a run's contracts are listed in: the registry's."""


@dataclass(frozen=True)
class ArchiveRun:
    archive: str
    """`results/<scenario>/<run>`, relative to the checkout."""
    scenario: str
    status: str
    contracts: Mapping[str, str]
    """Checker -> status, as `cptest matrix` shows it (`pass (no-go seen)` for a declared violation seen)."""
    placement: PlacementMode = "physical"
    """`colocated`: its ranks shared GPUs. Such a run is a run of its own beside a physical one of the
    same scenario, labelled where it is shown."""


@dataclass(frozen=True)
class Entry:
    """One cell of the grid (`cell`) or one scenario outside it (`where`), in exactly one state."""

    state: State
    cell: Cell | None = None
    where: str = ""
    """Outside the grid: the scenario's topology in words."""
    runs: tuple[ArchiveRun, ...] = ()
    rule: RuledOut | None = None
    scenarios: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class SupportMatrix:
    release: str
    grid: list[Entry]
    outside: list[Entry] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Grid cells per state (`run`, `ruled out`, `not yet run`, and of those `no scenario`), and the
        same for the scenarios outside the grid (`outside ...`)."""
        out: dict[str, int] = {"grid cells": len(self.grid), "outside the grid": len(self.outside)}
        for prefix, entries in (("", self.grid), ("outside ", self.outside)):
            for state in ("run", "ruled out", "not yet run"):
                out[prefix + state] = sum(e.state == state for e in entries)
            out[prefix + "no scenario"] = sum(e.state == "not yet run" and not e.scenarios for e in entries)
        return out


# ------------------------------------------------------------------------------ where a scenario falls
@dataclass(frozen=True)
class Outside:
    """Where a scenario outside the grid runs: its topology in words, and the GPUs it needs."""

    words: str
    gpus: int
    nodes: int


def locate(scenario: Scenario) -> Cell | Outside:
    """The grid cell `scenario` runs, else where it runs (why it is outside the grid)."""
    t = scenario.topology
    gpus = t.gpus or t.tp * t.pp
    words = Outside(_topology_words(scenario), gpus, t.nodes)
    if t.nodes > 1:
        return words
    family = ARCHITECTURES.get(scenario.model.facts.architecture)
    backend = scenario.serve.attention_backend
    if t.tp != 2 or t.pp != 1 or t.attn_dp != 1 or family is None or backend not in (
            "triton", "flashinfer", "fa3", "flashmla"):
        return words
    if t.dcp == 2 and t.attn_cp == 1:
        mode = "dcp2"
    elif t.attn_cp == 2 and t.dcp == 1 and t.cp_strategy in ("zigzag", "interleave"):
        mode = f"pcp2-{t.cp_strategy}"
    else:
        return words
    facts = scenario.model.facts
    regime = "latent" if facts.is_mla else ("kv<=tp/dcp" if facts.kv_heads <= t.tp // t.dcp else "kv>tp/dcp")
    decode = "eager" if scenario.serve.cuda_graph_decode == "disabled" else "graph"
    return Cell(family, regime, mode, backend, decode)  # type: ignore[arg-type]


def _topology_words(scenario: Scenario) -> str:
    t = scenario.topology
    parts = [f"tp {t.tp}"] + [f"{k} {v}" for k, v in (("dcp", t.dcp), ("attn_cp", t.attn_cp),
                                                       ("attn_dp", t.attn_dp), ("pp", t.pp)) if v != 1]
    if t.cp_strategy:
        parts.append(t.cp_strategy)
    gpus = t.gpus or t.tp * t.pp
    nodes = f", {t.nodes} nodes" if t.nodes > 1 else ""
    facts, backend = scenario.model.facts, scenario.serve.attention_backend or "default"
    return f"{', '.join(parts)} ({gpus} GPUs{nodes}); {facts.architecture}, {facts.kv_heads} KV heads, " \
           f"{backend} attention"


# ------------------------------------------------------------------------------ the matrix, pure
def support_matrix(release: Release, scenarios: Mapping[str, Scenario],
                   runs: Sequence[tuple[Scenario, ArchiveRun]]) -> SupportMatrix:
    """The matrix of `release` from the scenarios that could run (path -> parsed SGLang scenario of
    that release) and the published runs (the archived scenario, its verdicts). Pure."""
    by_cell: dict[Cell, list[ArchiveRun]] = {}
    wanted: dict[Cell, list[str]] = {}
    outside_runs: dict[str, list[ArchiveRun]] = {}
    outside_where: dict[str, Outside] = {}
    outside_paths: dict[str, list[str]] = {}
    for scenario, run in runs:
        where = locate(scenario)
        if isinstance(where, Cell):
            by_cell.setdefault(where, []).append(run)
        else:
            outside_runs.setdefault(scenario.name, []).append(run)
            outside_where.setdefault(scenario.name, where)
    for path, scenario in sorted(scenarios.items()):
        where = locate(scenario)
        if isinstance(where, Cell):
            wanted.setdefault(where, []).append(path)
        else:
            outside_paths.setdefault(scenario.name, []).append(path)
            outside_where[scenario.name] = where
    ran = _where_archives_ran(scenarios, runs)
    grid = [_entry(release, cell, by_cell.get(cell, []), wanted.get(cell, []), ran) for cell in cells()]
    outside = [_outside(name, outside_where[name], outside_runs.get(name, []), outside_paths.get(name, []))
               for name in sorted(outside_where)]
    return SupportMatrix(release.name, grid, outside)


def _where_archives_ran(scenarios: Mapping[str, Scenario], runs: Sequence[tuple[Scenario, ArchiveRun]]
                        ) -> Callable[[str], Cell | Outside | None]:
    """Where an archive `results/<scenario>/<run>` ran: by its own scenario where it is one of `runs`,
    else by the scenario of that name (an archived one first, then the folder's); None if neither."""
    exact = {run.archive: locate(s) for s, run in runs}
    named = {s.name: locate(s) for s in scenarios.values()} | {s.name: locate(s) for s, _ in runs}

    def ran(archive: str) -> Cell | Outside | None:
        parts = archive.split("/")
        return exact.get(archive) or (named.get(parts[1]) if len(parts) == 3 else None)

    return ran


def _entry(release: Release, cell: Cell, runs: list[ArchiveRun], paths: list[str],
           ran: Callable[[str], Cell | Outside | None] = lambda _: None) -> Entry:
    rule = ruled_out(release, cell)
    if rule is not None:
        rule = in_cell(rule, cell, ran)
    if runs:
        return Entry("run", cell, runs=tuple(sorted(runs, key=lambda r: r.archive)), rule=rule,
                     scenarios=tuple(paths))
    if rule is not None:
        return Entry("ruled out", cell, rule=rule, scenarios=tuple(paths))
    return Entry("not yet run", cell, scenarios=tuple(paths),
                 note="" if paths else GAPS.get(cell.family, "no scenario runs it yet: write one under "
                                                            "scenarios/qualification/"))


def _outside(name: str, where: Outside, runs: list[ArchiveRun], paths: list[str]) -> Entry:
    if runs:
        return Entry("run", where=where.words, runs=tuple(sorted(runs, key=lambda r: r.archive)),
                     scenarios=tuple(paths))
    if where.gpus > MAX_COLOCATED_RANKS:
        # Not SGLang's source: the machine's. Said as a rule so that the cell carries its reason.
        rule = RuledOut("more_ranks_than_colocated", f"needs {where.gpus} ranks; the GPU machine lends "
                        f"{LENT_GPUS} H200 and a server co-locates at most {MAX_COLOCATED_RANKS} ranks on it",
                        "", "observed", "")
        return Entry("ruled out", where=where.words, rule=rule, scenarios=tuple(paths))
    note = "" if where.gpus <= LENT_GPUS else f"runs co-located: {where.gpus} ranks on the lent GPU"
    return Entry("not yet run", where=where.words, scenarios=tuple(paths), note=note)


# ------------------------------------------------------------------------------ reading the folders
def read_inputs(release: Release, scenario_dir: Path, results: Iterable[Path],
                judged: Judge | None = None
                ) -> tuple[dict[str, Scenario], list[tuple[Scenario, ArchiveRun]], list[str]]:
    """(scenarios by path, runs, what was skipped and why). Scenarios: every `*.cps` under
    `scenario_dir` but its `defaults/`, SGLang of `release` only (a reference scenario is no SGLang
    evidence); one that does not parse is skipped and named. Runs: the newest archive per scenario
    and placement under each results folder (`cptest matrix`'s rows), SGLang of `release`, classified
    by the scenario.cps the archive holds; `judged` reads each archive's verdict as `matrix_rows`
    does."""
    from cptest.checks.archived import parse_archived
    from cptest.lang import parse_file
    from cptest.report import matrix_rows
    from cptest.store import archives_under

    skipped: list[str] = []
    scenarios: dict[str, Scenario] = {}
    for path in sorted(scenario_dir.rglob("*.cps")):
        rel = path.relative_to(scenario_dir)
        if rel.parts[0] == "defaults":
            continue
        shown = (Path(scenario_dir.name) / rel).as_posix()
        try:
            s = parse_file(path)
        except CptestError as e:
            skipped.append(f"{shown}: does not parse ({e.problems[0].message if e.problems else e})")
            continue
        if s.engine.kind == "sglang" and s.engine.release == release.name:
            scenarios[shown] = s
    runs: list[tuple[Scenario, ArchiveRun]] = []
    for folder in results:
        archives = archives_under(folder)
        for row in matrix_rows(archives, judged)[0]:
            if row["engine"] != "sglang":
                continue
            d: Path = row["dir"]
            shown = (Path(folder.name) / d.relative_to(folder)).as_posix()
            try:
                s = parse_archived(d)  # its includes as the run stored them
            except CptestError as e:
                skipped.append(f"{shown}: its scenario.cps does not parse ({e})")
                continue
            if s.engine.release != release.name:
                continue
            run = ArchiveRun(shown, row["scenario"], row["status"], dict(row["by"]), row["placement"])
            runs.append((s, run))
    return scenarios, runs, skipped


# ------------------------------------------------------------------------------ markdown
FAMILY_TITLES = {"llama": "Llama (LlamaForCausalLM)", "qwen3": "Qwen3 dense (Qwen3ForCausalLM)",
                 "qwen3-moe": "Qwen3-MoE (Qwen3MoeForCausalLM)",
                 "mla": "DeepSeek-style MLA (DeepseekV3ForCausalLM)"}
MARK = {"pass": "PASS", "fail": "FAIL", "unknown": "UNKNOWN"}


def citation(text: str) -> str:
    """A release table's `path:line` citation as a path in the wheel: relative to `sglang/srt/` unless
    it already starts at the wheel's root (`sglang/...`)."""
    parts = [p.strip() for p in text.split(";") if p.strip()]
    return "; ".join(p if p.startswith("sglang/") or p.startswith("(") else f"sglang/srt/{p}" for p in parts)


def _verdicts(run: ArchiveRun) -> str:
    order = [c for c in CHECKER_ORDER if c in run.contracts] + sorted(set(run.contracts) - set(CHECKER_ORDER))
    shown = ", ".join(f"{c} {MARK.get(run.contracts[c], run.contracts[c])}" for c in order)
    return f"{_placed(run, 'co-located: ')}**{MARK.get(run.status, run.status)}** ({shown})"


def _placed(run: ArchiveRun, label: str) -> str:
    """`label` for a co-located run, nothing for a physical one (whose cells read as they always did)."""
    return label if run.placement == "colocated" else ""


def _why(e: Entry) -> str:
    if e.state == "run":
        text = "; ".join(f"{_verdicts(r)}" for r in e.runs)
        if e.rule is not None:
            text += f"; rule `{e.rule.code}` ({_provenance(e.rule)}) applies: {md_inline(e.rule.reason)}"
        return text
    if e.state == "ruled out":
        assert e.rule is not None
        return f"ruled out, `{e.rule.code}` ({_provenance(e.rule)}): {md_inline(e.rule.reason)}"
    return md_inline(e.note) if e.note else "not yet run"


def _provenance(rule: RuledOut) -> str:
    """`observed` or `inferred`; for a rule observed in another cell, that cell too."""
    if not rule.observed_on:
        return rule.provenance
    return f"{rule.provenance} here; observed on " + "; ".join(f"`{w}`" for w in rule.observed_on.split("; "))


def _archives(e: Entry) -> str:
    return "<br>".join(f"`{r.archive}`{_placed(r, ' (co-located)')}" for r in e.runs)


def _source(e: Entry) -> str:
    if e.state == "run":
        return _archives(e)
    if e.state == "ruled out":
        assert e.rule is not None
        out = f"`{citation(e.rule.citation)}`" if e.rule.citation else ""
        if e.rule.evidence:
            out += ("; " if out else "") + md_inline(e.rule.evidence)
        return out
    return "<br>".join(f"`{p}`" for p in e.scenarios) or "-"


def render_support(m: SupportMatrix, sources: Sequence[str] = ("scenarios/", "results/")) -> str:
    """docs/support-matrix.md: deterministic (no clock), every cell filled."""
    c = m.counts()
    lines = [
        f"# Support matrix: SGLang {m.release} context parallelism on the lent machine",
        "",
        f"Generated by `cptest matrix --support -o docs/support-matrix.md` from {' x '.join(sources)} x "
        "the release knowledge in `cptest/engines/sglang/cells.py` (which reuses the rules of "
        "`releases.py`); "
        "do not edit by hand: `tests/report/test_support.py` fails when this file is stale.",
        "",
        "The grid: model family x KV-head regime x mode x attention backend x decode, on TP 2 (tiny "
        "synthetic weights with each family's head geometry). The machine lends one H200: a run there "
        "co-locates its ranks (docs/placement.md), and its cell says so. "
        "Each cell is **run** (the newest published archive of a scenario in the cell: its verdict and "
        "each contract's), **ruled out** (the rule, observed or inferred, and the SGLang source lines "
        "that rule it out here; paths in the release's wheel) or **not yet run** (the scenario that would "
        "run it, or why none can yet). A run is shown even where a rule applies: the rule is named "
        "beside it. A rule is *observed* only in the cell its cited archive ran (same family, KV regime, "
        "mode, backend and decode); in the other cells it rules out it is *inferred here*, and the cell "
        "where it was observed is named.",
        "",
        f"**Counts**: {c['grid cells']} grid cells: {c['run']} run, {c['ruled out']} ruled out, "
        f"{c['not yet run']} not yet run ({c['no scenario']} of them with no scenario that can run them "
        f"yet). {c['outside the grid']} scenarios outside the grid: {c['outside run']} run, "
        f"{c['outside ruled out']} ruled out, {c['outside not yet run']} not yet run.",
        "",
        "Regimes: `kv<=tp/dcp` every DCP group's ranks hold the same KV heads (docs/sglang.md §3; "
        "for PCP, dcp = 1), `kv>tp/dcp` they do not, `latent` MLA's one latent KV per token. "
        "Modes: `dcp2` = tp 2, dcp 2; `pcp2-zigzag` / `pcp2-interleave` = tp 2, attn_cp 2, "
        "`--enable-prefill-cp --cp-strategy`. Decode: `eager` = `--cuda-graph-backend-decode "
        "disabled` (per-step evidence), `graph` = the default CUDA-graph decode.",
    ]
    for family in dict.fromkeys(e.cell.family for e in m.grid if e.cell is not None):
        lines += ["", f"## {FAMILY_TITLES.get(family, family)}", "",
                  "| KV regime | mode | backend | decode | state | verdicts / why "
                  "| archive / source / scenario |",
                  "|---|---|---|---|---|---|---|"]
        for e in m.grid:
            if e.cell is None or e.cell.family != family:
                continue
            x = e.cell
            lines.append(f"| `{x.regime}` | {x.mode} | {x.backend} | {x.decode} | {e.state} | {_why(e)} | "
                         f"{_source(e)} |")
    lines += ["", "## Scenarios outside the grid", "",
              "SGLang scenarios (and their archives) that fall in no cell: other topologies, TP only, PCP "
              "with DCP.", "",
              "| scenario | topology | state | verdicts / why | archive / source |", "|---|---|---|---|---|"]
    for e in m.outside:
        names = sorted({r.scenario for r in e.runs} | {Path(p).stem for p in e.scenarios})
        src = _archives(e) or "<br>".join(f"`{p}`" for p in e.scenarios)
        lines.append(f"| {', '.join(names)} | {md_inline(e.where)} | {e.state} | {_why(e)} | {src or '-'} |")
    return "\n".join(lines) + "\n"


def as_json(m: SupportMatrix) -> dict[str, Any]:
    """The matrix as `cptest matrix --support --json` prints it (interface.SupportMatrixOut)."""

    def entry(e: Entry) -> dict[str, Any]:
        cell = None if e.cell is None else {"family": e.cell.family, "regime": e.cell.regime,
                                              "mode": e.cell.mode, "backend": e.cell.backend,
                                              "decode": e.cell.decode}
        r = e.rule
        rule = None if r is None else {"code": r.code, "reason": r.reason,
                                       "citation": citation(r.citation) if r.citation else "",
                                       "provenance": r.provenance, "evidence": r.evidence}
        return {"state": e.state, "cell": cell, "where": e.where, "scenarios": list(e.scenarios),
                "note": e.note, "rule": rule,
                "runs": [{"archive": r.archive, "scenario": r.scenario, "placement": r.placement,
                          "status": r.status, "contracts": dict(r.contracts)} for r in e.runs]}

    return {"release": m.release, "counts": m.counts(), "grid": [entry(e) for e in m.grid],
            "outside": [entry(e) for e in m.outside]}


__all__ = ["ArchiveRun", "Entry", "Outside", "SupportMatrix", "as_json", "citation", "locate", "read_inputs",
           "render_support", "support_matrix"]
