"""report: verdicts -> report.md, junit.xml, and a matrix over many archives (jinja2 templates).

`render(archive_dir | ScenarioVerdict, plan=None) -> str` (markdown), `render_junit(verdict) -> str`
(one testcase per checker: fail -> <failure>, unknown -> <error>, since unknown is not a finding),
`render_matrix(archive_dirs) -> str` (scenario x verdict table with the engine label, for the
README). Rendering is pure and deterministic: no timestamps, input order kept, matrix sorted.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jinja2

from cptest.plan.model import Plan
from cptest.store import Layout
from cptest.verdict import ScenarioVerdict, merge

__all__ = ["render", "render_junit", "render_matrix"]

STATUS_MARK = {"pass": "PASS", "fail": "FAIL", "unknown": "UNKNOWN"}


def _cell(value: Any) -> str:
    """One markdown table cell: no newlines, pipes escaped."""
    return str(value).replace("\n", " ").replace("|", "\\|")


def _figures(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, indent=2, default=str)


@functools.cache
def _env(autoescape: bool) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("cptest.report", "templates"),
        autoescape=autoescape,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["cell"] = _cell
    env.filters["figures"] = _figures
    env.globals["mark"] = STATUS_MARK
    return env


def _load(source: Path | str | ScenarioVerdict, plan: Plan | None) -> tuple[ScenarioVerdict, Plan | None]:
    if isinstance(source, ScenarioVerdict):
        return source, plan
    layout = Layout(Path(source))
    verdict = ScenarioVerdict.from_json(layout.verdict.read_text(encoding="utf-8"))
    if plan is None and layout.plan.is_file():
        plan = Plan.model_validate_json(layout.plan.read_text(encoding="utf-8"))
    return verdict, plan


def render(source: Path | str | ScenarioVerdict, plan: Plan | None = None) -> str:
    """report.md for an archive directory (reads verdict.json and plan.json) or a verdict and plan."""
    verdict, plan = _load(source, plan)
    return _env(False).get_template("report.md.j2").render(v=verdict, plan=plan)


def render_junit(source: Path | str | ScenarioVerdict) -> str:
    verdict, _ = _load(source, None)
    return _env(True).get_template("junit.xml.j2").render(v=verdict)


def render_matrix(archives: Iterable[Path | str]) -> str:
    """Markdown table: one row per archive (scenario, engine, status, per-checker statuses, archive),
    sorted by scenario then archive name. An archive without verdict.json shows `not checked`."""
    rows = []
    checkers: dict[str, None] = {}
    for a in archives:
        d = Path(a)
        p = Layout(d).verdict
        if not p.is_file():
            rows.append(
                {"scenario": d.parent.name, "engine": "?", "status": "not checked", "by": {}, "dir": d}
            )
            continue
        v = ScenarioVerdict.from_json(p.read_text(encoding="utf-8"))
        by: dict[str, str] = {}
        for x in v.verdicts:
            by[x.checker] = x.status if x.checker not in by else _worse(by[x.checker], x.status)
            if x.expect_violation and x.status == "pass":
                # A declared no-go that was observed: a valid result, but not "the contract holds".
                by[x.checker] = "pass (no-go seen)"
            checkers.setdefault(x.checker, None)
        rows.append({"scenario": v.scenario, "engine": v.engine, "status": v.status, "by": by, "dir": d})
    rows.sort(key=lambda r: (r["scenario"], r["dir"].name))
    return _env(False).get_template("matrix.md.j2").render(rows=rows, checkers=list(checkers))


def _worse(a: str, b: str) -> str:
    return merge([a, b])
