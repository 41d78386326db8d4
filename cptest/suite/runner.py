"""Run a suite: plan everything, then start each scenario as its own `cptest run` where it fits.

Each scenario is a child `python -m cptest run FILE --json --placement .. --gpus .. --cpus .. --ports ..`
in its own session: its signal handling, teardown guarantees, reaper and archive are exactly a lone
run's, and one scenario's crash cannot take another down. The child plans what the suite planned:
the placement the suite decided is passed explicitly, never left to the child's `auto`. The suite
only schedules, watches and summarises. SIGINT/SIGTERM to the suite send SIGTERM to every child
(each then tears its engines down and still archives an `unknown` verdict), wait for them, and end
with exit 3.

The suite's own record goes to `<results>/_suites/<UTC time>/` (a `_` folder: `cptest matrix`
leaves it out, the archives themselves are under `<results>/<scenario>/`):
    suite.json   the machine, per scenario its demand (with its placement: physical or co-located),
                 the ports, GPUs and CPUs granted, start and end, exit code, verdict and archive;
                 wall time and GPU-seconds of the whole
    summary.md   the matrix of the suite's archives
    index.html   the same with a link to each scenario's report.html (`cptest report DIR --html`)
    runs/<name>.log, runs/<name>.json   each child's console and its `--json` verdict
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from cptest.errors import CptestError, ScenarioError
from cptest.outline import Logger
from cptest.report.text import md_inline
from cptest.suite.demand import Demand, demand_of
from cptest.suite.machine import Machine
from cptest.suite.schedule import Granted, Pool, next_to_start
from cptest.verdict import EXIT_CODES, SEVERITY

POLL_S = 0.5
HEARTBEAT_S = 30.0
STOP_GRACE_S = 120.0
"""After SIGTERM, how long a child gets to tear down and archive before it is killed."""


@dataclass
class Entry:
    """One scenario of the suite, from planning to its verdict."""

    file: Path
    name: str
    demand: Demand | None = None
    not_run: str | None = None
    granted: Granted | None = None
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    status: str | None = None
    archive: str | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return str(self.file)

    def record(self, t0: float) -> dict[str, Any]:
        g = self.granted
        return {
            "file": str(self.file), "scenario": self.name, "status": self.status, "exit_code": self.exit_code,
            "archive": self.archive, "not_run": self.not_run,
            "demand": asdict(self.demand) if self.demand else None,
            "placement": g.placement.model_dump(mode="json") if g else None,
            "started_s": round(self.started - t0, 3) if self.started is not None else None,
            "ended_s": round(self.ended - t0, 3) if self.ended is not None else None,
            "duration_s": round(self.ended - self.started, 3) if self.started and self.ended else None,
        }  # fmt: skip


@dataclass(frozen=True)
class SuiteResult:
    folder: Path
    entries: list[Entry]
    wall_s: float
    exit_code: int
    record: dict[str, Any]


def scenarios_in(folder: Path) -> list[Path]:
    """The .cps files directly in `folder`, sorted: its `defaults/` and other subfolders are not
    scenarios. The one reading of a folder of scenarios (suite, validate, fmt, lint)."""
    return sorted(f for f in folder.glob("*.cps") if f.is_file())


def scenario_files(paths: Sequence[Path]) -> list[Path]:
    """The .cps files named, and those directly in the folders named (`scenarios_in`). Raises
    ScenarioError for a path that is neither."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out.extend(scenarios_in(p))
        elif p.is_file():
            out.append(p)
        else:
            raise ScenarioError(f"{p}: no such scenario file or folder")
    seen: set[Path] = set()
    return [f for f in out if not (f.resolve() in seen or seen.add(f.resolve()))]


def plan_entries(files: list[Path], machine: Machine, *, engine: str | None, gpu_present: bool,
                 pool: Pool, ignore_lint: bool = False, placement_mode: str = "auto",
                 rank_mem_fraction: float | None = None) -> list[Entry]:
    """Parse and plan every file first: a suite with bad input launches nothing (every problem of
    every file is reported together, exit 2). A scenario that cannot run here (lint findings, an
    SGLang plan without a GPU, more than the machine has) is kept with the reason, `not_run`.
    `placement_mode` is `cptest run`'s `--placement`; `auto` decides per scenario from the GPUs the
    suite may use, and the decision is in each entry's `Demand.placement`."""
    from cptest import pipeline
    from cptest.plan.model import Placement

    entries, problems = [], []
    smallest = min(machine.gpus.values(), default=0)
    for f in files:
        try:
            prepared = pipeline.prepare(f, engine=engine, gpu_present=gpu_present,
                                        placement=Placement(rank_mem_fraction=rank_mem_fraction),
                                        placement_mode=placement_mode, gpus_here=len(machine.gpus) or None)
        except CptestError as e:
            problems.extend(e.problems)
            continue
        entry = Entry(f, prepared.plan.scenario, demand_of(prepared.scenario, prepared.plan, smallest))
        entry.not_run = pool.never_fits(entry.demand)
        try:
            pipeline.runnable(prepared, gpu_present=gpu_present, ignore_lint=ignore_lint)
        except CptestError as e:
            entry.not_run = "; ".join(p.message for p in e.problems)
        entries.append(entry)
    if problems:
        raise ScenarioError(problems)
    return entries


def colocated_line(entries: list[Entry], placement_mode: str, gpus: int) -> str | None:
    """The suite's first line when any scenario's ranks are co-located (a run says so first: what
    co-located evidence cannot show is in docs/placement.md, "What it cannot show"), else None."""
    names = [e.name for e in entries if e.demand is not None and e.demand.placement == "colocated"]
    if not names:
        return None
    why = ("--placement colocated" if placement_mode == "colocated"
           else f"the suite has {gpus} GPU(s), fewer than their servers have ranks")
    return (f"cptest: co-located placement for {len(names)} of {len(entries)} scenario(s) ({why}): "
            f"{', '.join(names)}; each rank runs as its own local node process (an SGLang server's ranks "
            "sharing GPUs), and their verdicts and reports are labelled co-located and say nothing about "
            "speed (docs/placement.md)")


def child_argv(entry: Entry, granted: Granted, *, results: Path, engine: str | None,
               ignore_lint: bool, launcher: str, baseline_cache: Path | None = None,
               models: Path | None = None, rank_mem_fraction: float | None = None) -> list[str]:
    """The child `cptest run` of `entry` where it was granted: its placement mode is given
    explicitly, so the child plans what the suite planned whatever GPUs it sees."""
    p = granted.placement
    argv = [sys.executable, "-m", "cptest", "run", str(entry.file), "--json", "--results", str(results),
            "--ports", f"{p.main_port},{p.baseline_port}", "--launcher", launcher, "--placement", p.mode]
    if rank_mem_fraction is not None:
        argv += ["--rank-mem-fraction", str(rank_mem_fraction)]
    if p.gpus:
        argv += ["--gpus", ",".join(map(str, p.gpus))]
    if p.cpus:
        argv += ["--cpus", ",".join(map(str, p.cpus))]
    if engine:
        argv += ["--engine", engine]
    if ignore_lint:
        argv.append("--ignore-lint")
    argv += ["--baseline-cache", str(baseline_cache)] if baseline_cache else ["--no-baseline-cache"]
    if models is not None:
        argv += ["--models", str(models)]
    return argv


def run_suite(files: list[Path], machine: Machine, *, results: Path, log: Logger, engine: str | None = None,
              gpu_present: bool, models: Path | None = None, jobs: int | None = None,
              ignore_lint: bool = False, launcher: str = "process", now: datetime | None = None,
              baseline_cache: Path | None = None, placement_mode: str = "auto",
              rank_mem_fraction: float | None = None) -> SuiteResult:
    from cptest.suite.port_claims import try_claim

    pool = Pool(machine, jobs, claim=try_claim)
    entries = plan_entries(files, machine, engine=engine, gpu_present=gpu_present, pool=pool,
                           ignore_lint=ignore_lint, placement_mode=placement_mode,
                           rank_mem_fraction=rank_mem_fraction)
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    folder = results / "_suites" / stamp
    (folder / "runs").mkdir(parents=True, exist_ok=True)
    first = colocated_line(entries, placement_mode, len(machine.gpus))
    if first:
        log.info(first)
    log.info(f"suite of {len(entries)} scenario(s) on {machine.describe()}; record {folder}")
    for e in entries:
        if e.not_run:
            e.status, e.exit_code = "unknown", EXIT_CODES["unknown"]
            log.warning(f"{e.name}: not run: {e.not_run}")
    waiting = [e for e in entries if not e.not_run]
    running: list[Entry] = []
    t0 = time.monotonic()
    stopping: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    last_beat = t0
    try:
        while waiting or running:
            if stopping:
                break
            for key, _, granted in next_to_start(pool, [(e.key, e.demand) for e in waiting]):
                e = next(x for x in waiting if x.key == key)
                waiting.remove(e)
                _start(e, granted, folder, results=results, engine=engine, ignore_lint=ignore_lint,
                       launcher=launcher, baseline_cache=baseline_cache, models=models,
                       rank_mem_fraction=rank_mem_fraction)
                running.append(e)
                log.info(f"start {e.name}: {_where(granted)} "
                         f"({len(running)} running, {len(waiting)} waiting)")
            for e in [x for x in running if x.proc is not None and x.proc.poll() is not None]:
                running.remove(e)
                pool.release(e.key)
                _finish(e, folder)
                log.info(f"done  {e.name}: {(e.status or '?').upper()} in {e.ended - e.started:.0f} s "
                         f"(exit {e.exit_code}) {e.archive or ''}")
            if time.monotonic() - last_beat >= HEARTBEAT_S and running:
                last_beat = time.monotonic()
                now_s = time.monotonic()
                log.info("running: " + ", ".join(f"{e.name} {now_s - e.started:.0f} s" for e in running)
                         + f"; waiting {len(waiting)}; done {sum(1 for e in entries if e.ended)}")
            time.sleep(POLL_S)
        if stopping:
            log.error(f"{signal.Signals(stopping[0]).name}: stopping {len(running)} running scenario(s) "
                      f"(each archives what it gathered); {len(waiting)} not started")
            _stop(running, folder)
            for e in waiting:
                e.status, e.exit_code, e.not_run = "unknown", EXIT_CODES["unknown"], "suite interrupted"
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _stop([e for e in running if e.proc is not None and e.proc.poll() is None], folder)
        for hold in pool.held.values():  # the servers are down: their port slots go back
            hold.release()
        pool.held.clear()
    wall = time.monotonic() - t0
    code = _worst(entries)
    if stopping:
        code = 3
    record = _record(entries, machine, t0, wall, jobs)
    (folder / "suite.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (folder / "summary.md").write_text(_summary(entries, record), encoding="utf-8")
    from cptest.report.html import render_suite_html

    (folder / "index.html").write_text(render_suite_html(folder), encoding="utf-8")
    return SuiteResult(folder, entries, wall, code, record)


def _where(g: Granted) -> str:
    p = g.placement
    gpus = f"GPU {','.join(map(str, g.gpus))}" if g.gpus else "no GPU"
    cpus = f"CPUs {_ranges(g.cpus)}" if g.cpus else "any CPU"
    return f"{_mode_word(p.mode)}, {gpus}, {cpus}, ports {p.main_port}/{p.baseline_port}"


def _mode_word(mode: str) -> str:
    return "co-located" if mode == "colocated" else mode


def _ranges(ids: Sequence[int]) -> str:
    out, ids = [], sorted(ids)
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def _start(e: Entry, granted: Granted, folder: Path, **kw: Any) -> None:
    e.granted = granted
    argv = child_argv(e, granted, **kw)
    out = (folder / "runs" / f"{e.name}.json").open("wb")
    err = (folder / "runs" / f"{e.name}.log").open("wb")
    with out, err:
        # Its own session: Ctrl-C on the terminal reaches the suite only, which stops children in order.
        e.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                  start_new_session=True, env={**os.environ, "NO_COLOR": "1"})
    e.started = time.monotonic()


def _finish(e: Entry, folder: Path) -> None:
    assert e.proc is not None
    e.ended = time.monotonic()
    e.exit_code = e.proc.returncode
    try:
        out = json.loads((folder / "runs" / f"{e.name}.json").read_text(encoding="utf-8") or "null")
    except (OSError, ValueError):
        out = None
    if isinstance(out, dict) and "causes" in out:  # preflight: nothing launched, the cause in one line
        e.status = "unknown"
        e.not_run = "; ".join(f"{c['message']} ({c['remedy']})" for c in out["causes"])
    elif isinstance(out, dict) and "status" in out:
        e.status, e.archive = out["status"], out.get("archive")
    else:  # the child stopped before a verdict (bad input at run time, lint, a crash of cptest)
        e.status = "unknown"
        e.not_run = e.not_run or f"cptest run exited {e.exit_code} without a verdict; see runs/{e.name}.log"


def _stop(running: list[Entry], folder: Path) -> None:
    for e in running:
        if e.proc is not None and e.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                e.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for e in running:
        if e.proc is None:
            continue
        try:
            e.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(e.proc.pid, signal.SIGKILL)
            e.proc.wait()
        if e.ended is None:
            _finish(e, folder)


def _worst(entries: list[Entry]) -> int:
    statuses = [e.status or "unknown" for e in entries]
    if not statuses:
        return 0
    worst = max(statuses, key=lambda s: SEVERITY.get(s, SEVERITY["unknown"]))
    return EXIT_CODES.get(worst, 3)


def _record(entries: list[Entry], machine: Machine, t0: float, wall: float,
            jobs: int | None) -> dict[str, Any]:
    busy = sum((e.demand.gpus if e.demand else 0) * ((e.ended or 0) - (e.started or 0))
               for e in entries if e.started)
    return {
        "suite_version": 1,
        "machine": {"gpus": {str(g): m for g, m in sorted(machine.gpus.items())}, "cpus": list(machine.cpus),
                    "client_cpus": list(machine.client_cpus)},
        "jobs": jobs,
        "wall_s": round(wall, 3),
        "gpu_seconds_held": round(len(machine.gpus) * wall, 1),
        "gpu_seconds_busy": round(busy, 1),
        "scenarios": [e.record(t0) for e in entries],
        "counts": {s: sum(1 for e in entries if e.status == s) for s in ("pass", "fail", "unknown")},
    }


def _summary(entries: list[Entry], record: dict[str, Any]) -> str:
    lines = [f"# Suite: {len(entries)} scenario(s), wall {record['wall_s']:.0f} s, "
             f"{record['gpu_seconds_held']:.0f} GPU-seconds held", "",
             "| scenario | verdict | exit | started (s) | duration (s) | placement | archive |",
             "|---|---|---|---|---|---|---|"]
    for e, r in zip(entries, record["scenarios"], strict=True):
        mode = _mode_word(e.demand.placement) if e.demand else "not planned"
        where = _where(e.granted) if e.granted else f"{mode}: {e.not_run or ''}"
        # `where` may be why it did not run: lint's or the planner's words, quoting the scenario.
        lines.append(f"| {md_inline(e.name)} | {(e.status or '?').upper()} | {e.exit_code} | "
                     f"{r['started_s']} | {r['duration_s']} | {md_inline(where)} | "
                     f"{md_inline(e.archive or '')} |")
    return "\n".join(lines) + "\n"
