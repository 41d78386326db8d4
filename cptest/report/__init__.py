"""report: verdicts -> report.md, junit.xml, and a matrix over many archives (jinja2 templates).

`render(archive_dir | ScenarioVerdict, plan=None) -> str` (markdown), `render_junit(verdict) -> str`
(one testcase per checker: fail -> <failure>, unknown -> <error>, since unknown is not a finding),
`render_matrix(archive_dirs) -> str` (scenario x verdict table with the engine label, for the
README). Rendering is pure and deterministic: no timestamps, input order kept, matrix sorted.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from cptest.contracts import CONTRACTS
from cptest.plan.model import Plan
from cptest.report import views
from cptest.report.text import md_block, md_inline, xml_attr, xml_text
from cptest.store import Layout, existing_file, require_plain
from cptest.verdict import ScenarioVerdict, merge, read_verdict

__all__ = ["Judge", "render", "render_junit", "render_matrix"]

Judge = Callable[[Path], "tuple[ScenarioVerdict, str | None] | None"]
"""How the matrix reads an archive's verdict: the verdict and, for a re-analysis beside the seal, a
label naming it and the seal; None for an archive that holds no verdict (`not checked`). The CLI
gives `pipeline.judge`, which recomputes the verdict from the evidence and refuses a tampered
archive; without one, verdict.json is read as it is (a library caller's own archives)."""

STATUS_MARK = {"pass": "PASS", "fail": "FAIL", "unknown": "UNKNOWN"}


def _cell(value: Any) -> str:
    """One markdown table cell or heading: one line, untrusted text shown as text (`text.md_inline`)."""
    return md_inline(value)


def _finalize_xml(value: Any) -> Any:
    # Every `{{ }}` of an XML template: characters XML 1.0 forbids become visible text, before
    # autoescape. Markup (a filter's own escaped output) is already clean.
    return value if isinstance(value, Markup) else xml_text("" if value is None else value)


def _figures(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, indent=2, default=str)


@functools.cache
def _env(autoescape: bool, xml: bool = False) -> jinja2.Environment:
    """The templates' environment: markdown (`autoescape` off; untrusted text through the `cell`
    and `md` filters), HTML (`autoescape`), XML (`xml`: autoescape, and what XML 1.0 forbids
    replaced in every output, `xattr` for attributes)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("cptest.report", "templates"),
        autoescape=autoescape or xml,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        **({"finalize": _finalize_xml} if xml else {}),
    )
    env.filters["cell"] = _cell
    env.filters["md"] = md_block
    env.filters["xattr"] = xml_attr
    env.filters["figures"] = _figures
    env.filters["model_words"] = model_words
    env.globals["mark"] = STATUS_MARK
    return env


def model_words(pin: Any) -> str:
    """A plan's model in a line: its path or hub id (and revision), or, for weights cptest writes
    itself, the architecture and the geometry that decides them."""
    g = getattr(pin, "synthetic", None)
    if g is not None:
        heads = f"{g.heads} heads, {g.kv_heads} KV head{'s' if g.kv_heads != 1 else ''}"
        parts = [f"{g.layers} layers", f"hidden {g.hidden}", heads]
        if g.kv_lora_rank is not None:
            parts.append(f"kv_lora {g.kv_lora_rank}, rope {g.qk_rope_head_dim}")
        elif g.head_dim is not None:
            parts.append(f"head_dim {g.head_dim}")
        extra = {k: v for k, v in g.model_dump().items() if k in ("experts", "experts_per_tok") and v}
        parts += [f"{k} {v}" for k, v in extra.items()]
        return f"synthetic {pin.architecture} ({', '.join(parts)}, vocab {g.vocab}, seed {g.seed})"
    where = pin.path or pin.id or ""
    return f"{where}@{pin.revision}" if pin.id and pin.revision else where


def _load(source: Path | str | ScenarioVerdict, plan: Plan | None) -> tuple[ScenarioVerdict, Plan | None]:
    if isinstance(source, ScenarioVerdict):
        return source, plan
    from cptest.checks.load import load_plan

    require_plain(Path(source))
    layout = Layout(Path(source))
    verdict = read_verdict(layout.verdict)
    if plan is None and existing_file(layout.plan):
        plan = load_plan(Path(source))
    return verdict, plan


def render(source: Path | str | ScenarioVerdict, plan: Plan | None = None) -> str:
    """report.md for an archive directory (reads verdict.json and plan.json) or a verdict and plan.
    A co-located archive says so near the top, with where its ranks ran and what that cannot judge."""
    verdict, plan = _load(source, plan)
    placed = views.placement(plan)
    return _env(False).get_template("report.md.j2").render(
        v=verdict, plan=plan, placed=placed, colocated=verdict.placement == "colocated" or placed is not None)


def render_junit(source: Path | str | ScenarioVerdict) -> str:
    verdict, _ = _load(source, None)
    return _env(True, xml=True).get_template("junit.xml.j2").render(v=verdict)


def render_matrix(archives: Iterable[Path | str], judged: Judge | None = None) -> str:
    """Markdown table: one row per scenario, engine and placement, from its newest archive (archive
    names start with their UTC time; older ones are counted in `older`, never mixed in), with
    per-checker statuses. A co-located row says so in its engine cell (`sglang, co-located`): it
    judges semantics, never speed, so it never stands in for a physical run or hides one. A
    generation cell shows the teacher-forced figures next to its status (main |Δlogprob| p99 / the
    control's floor); one judged by the free-running contract of older plans is marked † and
    explained under the table. An archive without verdict.json shows `not checked`. A row whose
    verdict is a re-analysis beside the seal says so in its archive cell, naming the seal."""
    rows, checkers = matrix_rows(archives, judged)
    legacy = any(r.get("legacy") for r in rows)
    return _env(False).get_template("matrix.md.j2").render(rows=rows, checkers=checkers, legacy=legacy,
                                                            superseded=any(r["older"] for r in rows))


def matrix_rows(archives: Iterable[Path | str], judged: Judge | None = None
                ) -> tuple[list[dict[str, Any]], list[str]]:
    """The matrix's rows (newest archive per scenario, engine and placement: `scenario`, `engine`,
    `placement`, `status`, `by` checker, `dir`, `older`, generation `notes`, and `analysis`, the
    label of a re-analysis whose verdict the row shows) and its checkers in the registry's order
    (`render_matrix`). Each verdict is `judged`'s (see `Judge`). Physical rows come before
    co-located ones of the same scenario."""
    newest: dict[tuple[str, str, str], dict[str, Any]] = {}
    older: dict[tuple[str, str, str], int] = {}
    checkers: dict[str, None] = {}
    for a in archives:
        d = Path(a)
        found = (judged or _as_archived)(d)
        if found is None:
            row: dict[str, Any] = {"scenario": d.parent.name, "engine": "?", "status": "not checked",
                                   "placement": _planned_placement(d), "by": {}, "dir": d, "analysis": None}
        else:
            v, label = found
            by: dict[str, str] = {}
            for x in v.verdicts:
                by[x.checker] = x.status if x.checker not in by else _worse(by[x.checker], x.status)
                if x.expect_violation and x.status == "pass":
                    # A declared no-go that was observed: a valid result, but not "the contract holds".
                    by[x.checker] = "pass (no-go seen)"
                checkers.setdefault(x.checker, None)
            row = {"scenario": v.scenario, "engine": v.engine, "placement": v.placement, "status": v.status,
                   "by": by, "dir": d, "analysis": label}
            gen = next((x for x in v.verdicts if x.checker == "generation"), None)
            if gen is not None:
                note, row["legacy"] = _generation_note(gen.figures)
                row["notes"] = {"generation": note}
        key = _matrix_key(row)
        if key in newest:
            older[key] = older.get(key, 0) + 1
            if row["dir"].name < newest[key]["dir"].name:
                continue
        newest[key] = row
    rows = sorted(newest.values(), key=lambda r: (r["scenario"], r["engine"], r["placement"] != "physical"))
    for r in rows:
        r["older"] = older.get(_matrix_key(r), 0)
    # The registry's order; what is no contract (`run`, `evidence`) after, as first seen.
    rank = {name: i for i, name in enumerate(CONTRACTS)}
    return rows, sorted(checkers, key=lambda c: rank.get(c, len(rank)))


def _as_archived(d: Path) -> tuple[ScenarioVerdict, str | None] | None:
    """verdict.json as it is, None when there is none (a link or FIFO in its place: IntegrityError
    naming it)."""
    p = Layout(d).verdict
    return (read_verdict(p), None) if existing_file(p) else None


def _matrix_key(row: dict[str, Any]) -> tuple[str, str, str]:
    # A co-located archive never supersedes a physical one of its scenario, nor the other way round.
    return (row["scenario"], row["engine"], row["placement"])


def _planned_placement(archive: Path) -> str:
    """The placement of an archive without a verdict, from its plan.json (physical when unreadable:
    such a row says `not checked` anyway)."""
    from cptest.checks.load import load_plan
    from cptest.errors import CptestError

    try:
        return load_plan(archive).placement
    except CptestError:
        return "physical"


def _generation_note(figures: dict[str, Any]) -> tuple[str, bool]:
    """(what the generation cell adds to its status, whether the older free-running contract judged it)."""
    bounds = figures.get("bounds")
    if not bounds:
        return " †", True
    logprob = next((b for b in bounds if str(b.get("bound", "")).startswith("logprob")), None)
    if logprob is None or logprob.get("measured") is None:
        return "", False
    stat = str(logprob["bound"]).split()[1]
    text = f" ({stat} {logprob['measured']:.3g}"
    if logprob.get("floor") is not None:
        ratio = logprob.get("ratio")
        text += f" / floor {logprob['floor']:.3g}" + (f" = {ratio:.2g}x" if ratio is not None else "")
    return text + ")", False


def _worse(a: str, b: str) -> str:
    return merge([a, b])
