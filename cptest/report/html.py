"""report.html: one self-contained page per archive, and an index page per suite.

`render_html(archive_dir, verdict=None, plan=None) -> str` reads the archive through the readers
the checks use (`checks.load.load_archive`, `store.read_manifest`, `verdict.read_verdict`) and
renders `templates/report.html.j2`: where a co-located archive's ranks ran and what that cannot
judge (first, and beside its latencies), the verdicts with the scenario line each expectation came
from, the K/V ownership map, rows per rank per step, capacity over the run, latencies, request
outcomes against lifecycle events and faults, the environment and pins, the scenario itself.
`render_suite_html(suite_dir) -> str` renders a suite's `suite.json` with a link to each
scenario's report.

The page is jinja2 with autoescape on: every text of an archive is escaped; the only markup not
escaped is the SVG matplotlib wrote (`plots`, which escapes its text itself). No script, no font,
no request: a Content-Security-Policy forbids anything but inline styles and data: images, so a
report opened from disk shows the same thing offline and can run nothing that an archive smuggled in.

Never raises for what an archive lacks: each section is built inside `_section`, and a missing
file, an older evidence version, a reference engine without a probe or a fault run without rows
becomes a sentence saying so. Deterministic: no clock, input order kept, SVG made reproducible.
An archive with a link or a FIFO in it is still an IntegrityError (exit 3), as for every command.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from markupsafe import Markup

from cptest.checks.load import Archive, load_archive, load_plan
from cptest.errors import CptestError
from cptest.plan.model import Plan
from cptest.report import STATUS_MARK, _env, views
from cptest.report import ownership as own
from cptest.store import Layout, existing_file, read_file, read_manifest, require_plain
from cptest.verdict import ScenarioVerdict, read_verdict

__all__ = ["render_html", "render_suite_html"]


@dataclass
class Section:
    """One part of the page: its figures and tables, or `absent` saying why the archive has none."""

    id: str
    title: str
    absent: str | None = None
    svgs: list[Markup] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: Any = None


def _section(id: str, title: str, build: Callable[[Section], None]) -> Section:
    s = Section(id, title)
    try:
        build(s)
    except Exception as e:  # a report must always render: the failure is shown where the picture was
        s.absent = f"could not be drawn: {type(e).__name__}: {e}"
        s.svgs.clear()
    return s


def render_html(source: Path | str, verdict: ScenarioVerdict | None = None, plan: Plan | None = None) -> str:
    """report.html of the archive at `source`. `verdict` and `plan` are the ones being written when
    the archive is finished; otherwise they are read from verdict.json and plan.json."""
    root = Path(source)
    require_plain(root)
    layout = Layout(root)
    if verdict is None and existing_file(layout.verdict):
        verdict = read_verdict(layout.verdict)
    problem = None
    archive: Archive | None = None
    try:
        archive = load_archive(root)
        plan = plan or archive.plan
    except CptestError as e:
        problem = _first_line(e)
        if plan is None:
            try:
                plan = load_plan(root)
            except CptestError:
                plan = None
    scenario_text = read_file(layout.scenario) if existing_file(layout.scenario) else None
    manifest = read_manifest(layout)
    role = archive.evidence.role("main") if archive else None
    absent = f"the evidence could not be read: {problem}" if problem else None

    def needs_role(build: Callable[[Section, Any], None]) -> Callable[[Section], None]:
        def wrapped(s: Section) -> None:
            if role is None:
                s.absent = absent or "no evidence"
            else:
                build(s, role)
        return wrapped

    placed = views.placement(plan)
    colocated = placed is not None or (verdict is not None and verdict.placement == "colocated")
    sections = [
        _section("ownership", "K/V ownership map", needs_role(_ownership)),
        _section("rows", "Rows per rank per step", needs_role(_rows)),
        _section("capacity", "Capacity", needs_role(_capacity)),
        _section("latency", "Latency", lambda s: _latency(s, archive, absent, colocated)),
        _section("outcomes", "Requests, lifecycle and faults",
                 needs_role(lambda s, r: _outcomes(s, r, plan))),
    ]
    return _env(True).get_template("report.html.j2").render(
        v=verdict, plan=plan, sections=sections, manifest=_manifest(manifest, plan), servers=_servers(plan),
        scenario_lines=scenario_text.splitlines() if scenario_text is not None else None,
        missing=[m for r in (archive.evidence.roles.values() if archive else ()) for m in r.missing],
        notes=_probe_notes(role), problem=problem, name=plan.scenario if plan else root.name,
        placed=placed, colocated=colocated,
    )  # fmt: skip


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# ---------------------------------------------------------------- sections
def _ownership(s: Section, role: Any) -> None:
    from cptest.report import plots

    o = own.ownership(role)
    if isinstance(o, str):
        s.absent = o
        return
    dcp = max(len(g.ranks) for g in o.groups)
    drawn = o.groups if dcp > 1 else o.groups[:1]
    if dcp == 1:
        s.notes.append("No DCP: every rank keeps the whole K/V of each request in its own pool, so the map "
                       f"shows rank {o.groups[0].ranks[0]}'s writes only; the table counts every rank's.")
    for k, g in enumerate(drawn[:4]):
        picture, per, shown = plots.ownership(g, f"ownership-{k}")
        s.svgs.append(Markup(picture))
        if shown < len(g.requests):
            s.notes.append(f"Group {list(g.ranks)}: the first {shown} of {len(g.requests)} requests are "
                           "drawn; the counts below are over all of them.")
    if len(drawn) > 4:
        s.notes.append(f"{len(drawn) - 4} more DCP groups are counted below but not drawn.")
    if o.truncated:
        s.notes.append(f"The evidence of rank(s) {list(o.truncated)} ends in a half-written line (killed "
                       "mid-write?): holes near the end may be the kill, not the engine.")
    s.notes.append(f"Groups from the {o.groups_from}.")
    s.data = [{"ranks": list(g.ranks), "requests": len(g.requests), "holes": g.holes, "doubles": g.doubles,
               "written": {w: g.written(w) for w in g.ranks},
               "first_holes": [(r.rid, a, b) for r in g.requests for a, b in r.holes][:5],
               "first_doubles": [(r.rid, a, b) for r in g.requests for a, b in r.doubles][:5]}
              for g in o.groups]  # fmt: skip


def _rows(s: Section, role: Any) -> None:
    from cptest.report import plots

    r = views.rows(role)
    if isinstance(r, str):
        s.absent = r
        return
    s.svgs.append(Markup(plots.rows(r, "rows")))
    s.data = [{"world": x.world, "steps": len(x.step), "modes": x.modes(), "rows_in": sum(x.rows_in),
               "attn": x.total(x.attn), "ffn": x.total(x.ffn), "logits": x.total(x.logits)} for x in r]


def _capacity(s: Section, role: Any) -> None:
    from cptest.report import plots

    c = views.capacity(role)
    if isinstance(c, str):
        s.absent = c
        return
    s.data = c
    if c.timeline_absent:
        s.notes.append(f"No timeline: {c.timeline_absent}.")
    elif c.timelines:
        s.svgs.append(Markup(plots.capacity(c, "capacity")))
        s.notes.append("K/V rows held after each forward step, estimated from the probe's writes: a request "
                       "holds its rows from its first step to its last (frees and the radix cache are not "
                       "recorded). A DCP group's line is the sum of its ranks, against its logical token "
                       "space. Lines marked 'pool samples' are measured: the tokens each rank's allocator "
                       "had in use at its scheduler's iterations, in the logical token space.")


def _latency(s: Section, archive: Archive | None, absent: str | None, colocated: bool = False) -> None:
    from cptest.report import plots

    if archive is None:
        s.absent = absent or "no evidence"
        return
    lat = views.latency(archive.evidence)
    if isinstance(lat, str):
        s.absent = lat
        return
    if colocated:
        s.notes.append(views.COLOCATED_TIMINGS)
    s.svgs.append(Markup(plots.latency(lat, "latency")))
    s.notes.append("Inter-token latency is each request's mean time per output token (tpot): the runner "
                   "records per-request figures, not every token's arrival.")
    s.data = [{"role": x.role, "ok": x.ok, "total": x.total,
               "rows": [(name, *(_fmt(views.percentile(vals, q)) for q in (50, 90, 99, 100)))
                        for name, vals in (("TTFT", x.ttft), ("TPOT", x.tpot), ("end to end", x.e2e))]}
              for x in lat]  # fmt: skip


def _outcomes(s: Section, role: Any, plan: Plan | None) -> None:
    from cptest.report import plots

    faults = [f.model_dump(mode="json", exclude_none=True) for f in plan.faults] if plan else []
    o = views.outcomes(role)
    if isinstance(o, str):
        s.absent = o
        s.data = {"faults": faults, "events": [], "counts": {}, "errors": []}
        return
    if o.requests:
        s.svgs.append(Markup(plots.outcomes(o, "outcomes")))
    else:
        s.notes.append("No request was recorded (the workload did not start).")
    if faults and not o.faults:
        s.notes.append("A fault was planned but no fault event was recorded.")
    errors: dict[str, list[int]] = {}
    for r in o.requests:
        if r.error:
            errors.setdefault(r.error, []).append(r.index)
    s.data = {"faults": faults, "counts": o.counts(),
              "events": [(f"{e.t:.3f}", e.event, json.dumps(e.detail, sort_keys=True, default=str)[:400])
                         for e in o.events],
              "errors": sorted(errors.items(), key=lambda kv: kv[1][0])}  # fmt: skip


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.4g}"


# ---------------------------------------------------------------- the rest of the page
def _manifest(manifest: dict[str, Any] | None, plan: Plan | None) -> dict[str, Any]:
    """The pins and the machine as the finished manifest has them: `store.finish` carries both over
    from the first manifest (pins from the plan when it has none), so the page a run writes and the
    one `check --write` writes again are the same. Not the phase or the file hashes: they change
    when the archive is finished, after this page is rendered."""
    manifest = manifest or {}
    pins = manifest.get("pins")
    if not isinstance(pins, dict) and plan is not None:
        pins = plan.pins.model_dump(mode="json")
    environment = manifest.get("environment")
    return {"pins": _flat(pins) if isinstance(pins, dict) else None,
            "environment": _flat(environment) if isinstance(environment, dict) and environment else None}


def _flat(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """A nested JSON value as (dotted key, text) rows."""
    if isinstance(value, dict):
        return [row for k in sorted(value, key=str) for row in _flat(value[k], f"{prefix}{k}.")]
    key = prefix[:-1] if prefix else "(value)"
    return [(key, value if isinstance(value, str) else json.dumps(value, default=str))]


def _servers(plan: Plan | None) -> list[dict[str, Any]]:
    if plan is None:
        return []
    out = []
    for sv in plan.servers():
        degrees = sv.topology.model_dump(mode="json", exclude_none=True)
        out.append({"role": sv.role, "engine": sv.engine, "release": sv.release, "world": sv.world_size,
                    "degrees": ", ".join(f"{k}={v}" for k, v in sorted(degrees.items())),
                    "eager": sv.eager, "probe": sv.probe})
    return out


def _probe_notes(role: Any) -> list[tuple[str, str, str]]:
    if role is None:
        return []
    return [(str(w), n.level, n.message) for w in sorted(role.ranks) for n in role.ranks[w].notes
            if n.level != "info"][:50]


# ---------------------------------------------------------------- suites
def render_suite_html(folder: Path | str) -> str:
    """index.html of a suite's folder (`<results>/_suites/<time>/`): one row per scenario with its
    verdict and a relative link to its archive's report.html, where that archive is found here."""
    folder = Path(folder)
    record = json.loads(read_file(folder / "suite.json"))
    rows = []
    for e in record.get("scenarios") or []:
        archive = _find_archive(folder, e)
        report = archive / "report.html" if archive else None
        href = _relative(report, folder) if report and existing_file(report) else None
        why = None
        if e.get("archive") and archive is None:
            why = "archive not found on this machine"
        elif archive is not None and href is None:
            why = ("no report.html (an archive made before cptest wrote one: "
                   "`cptest report DIR --html -o FILE`)")
        rows.append({"name": str(e.get("scenario") or e.get("file") or "?"),
                     "status": str(e.get("status") or "?"), "exit": e.get("exit_code"),
                     "duration": e.get("duration_s"), "href": href,
                     "archive": str(e.get("archive") or ""), "why": why or e.get("not_run")})  # fmt: skip
    return _env(True).get_template("suite.html.j2").render(
        rows=rows, record=record, folder=folder.name, mark=STATUS_MARK)


def _relative(path: Path, folder: Path) -> str:
    """A link from `folder` to `path` that a browser can only read as a relative path: `./` in
    front of a name that could otherwise start a scheme (`javascript:`)."""
    rel = Path(os.path.relpath(path, folder)).as_posix()
    return rel if rel.startswith(".") else f"./{rel}"


def _find_archive(folder: Path, entry: dict[str, Any]) -> Path | None:
    """The scenario's archive: as recorded, else under the suite's results folder by the same name
    (a results tree moved or copied since the suite ran)."""
    recorded = entry.get("archive")
    if not recorded:
        return None
    candidates = [Path(recorded), folder.parent.parent / str(entry.get("scenario", "")) / Path(recorded).name]
    return next((c for c in candidates if c.is_dir() and not c.is_symlink()), None)
