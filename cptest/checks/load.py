"""Read an archive directory into typed evidence: the only code in `checks/` that touches files.

Where the files are is `cptest.store.Layout`'s business; how a file is read is
`cptest.evidence.read_records`'. A missing file is *recorded* as missing (checkers then say
unknown); a malformed line is an `EvidenceError` naming file and line, except a truncated last line
(a rank killed mid-write), which is dropped and counted.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from cptest.errors import EvidenceError, Problem, Span
from cptest.evidence import (
    Capacity,
    Geometry,
    GpuSample,
    Graph,
    KvPool,
    Lifecycle,
    LogLine,
    ProbeNote,
    ProcessSample,
    Record,
    RequestResult,
    ServerInfo,
    Step,
    read_records,
)
from cptest.plan.model import Plan, ServerPlan
from cptest.store import Layout


@dataclass
class RankEvidence:
    """Probe records of one world rank, split by kind, in file order."""

    world: int
    geometry: list[Geometry] = field(default_factory=list)
    kv_pools: list[KvPool] = field(default_factory=list)
    capacities: list[Capacity] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    graphs: list[Graph] = field(default_factory=list)
    notes: list[ProbeNote] = field(default_factory=list)
    other: list[Record] = field(default_factory=list)
    dropped: int = 0
    """Truncated trailing lines dropped (the rank died mid-write)."""


@dataclass
class RunnerEvidence:
    """Runner records of one server, split by kind, in file order."""

    requests: list[RequestResult] = field(default_factory=list)
    processes: list[ProcessSample] = field(default_factory=list)
    gpu: list[GpuSample] = field(default_factory=list)
    server_info: list[ServerInfo] = field(default_factory=list)
    lifecycle: list[Lifecycle] = field(default_factory=list)
    log_lines: list[LogLine] = field(default_factory=list)
    other: list[Record] = field(default_factory=list)
    dropped: int = 0

    def events(self, name: str) -> list[Lifecycle]:
        return [e for e in self.lifecycle if e.event == name]


@dataclass
class RoleEvidence:
    """Everything observed about one server (main or baseline)."""

    role: str
    ranks: dict[int, RankEvidence] = field(default_factory=dict)
    runner: RunnerEvidence | None = None
    """None when `runner.jsonl` is missing."""
    logs: dict[int, str] = field(default_factory=dict)
    """Node rank -> the engine's stdout+stderr."""
    missing: list[str] = field(default_factory=list)
    """Archive-relative paths that should exist and do not."""

    @property
    def log_text(self) -> str:
        return "\n".join(self.logs[k] for k in sorted(self.logs))


@dataclass
class Archive:
    """A loaded archive. Pure data: checkers read only this."""

    dir: Path
    plan: Plan
    roles: dict[str, RoleEvidence]

    def server(self, role: str) -> ServerPlan | None:
        return self.plan.main if role == "main" else self.plan.baseline

    def role(self, role: str) -> RoleEvidence:
        return self.roles.get(role) or RoleEvidence(role=role, missing=[f"evidence/{role}/"])


_RANK_SLOTS: dict[type, str] = {
    Geometry: "geometry",
    KvPool: "kv_pools",
    Capacity: "capacities",
    Step: "steps",
    Graph: "graphs",
    ProbeNote: "notes",
}
_RUNNER_SLOTS: dict[type, str] = {
    RequestResult: "requests",
    ProcessSample: "processes",
    GpuSample: "gpu",
    ServerInfo: "server_info",
    Lifecycle: "lifecycle",
    LogLine: "log_lines",
}


def load_rank(path: Path, world: int) -> RankEvidence:
    records, dropped = read_records(path)
    ev = RankEvidence(world=world, dropped=dropped)
    buckets: dict[str, list] = defaultdict(list)
    for r in records:
        buckets[_RANK_SLOTS.get(type(r), "other")].append(r)
    for name, items in buckets.items():
        setattr(ev, name, items)
    return ev


def load_runner(path: Path) -> RunnerEvidence:
    records, dropped = read_records(path)
    ev = RunnerEvidence(dropped=dropped)
    buckets: dict[str, list] = defaultdict(list)
    for r in records:
        buckets[_RUNNER_SLOTS.get(type(r), "other")].append(r)
    for name, items in buckets.items():
        setattr(ev, name, items)
    return ev


def load_role(layout: Layout, server: ServerPlan) -> RoleEvidence:
    role = server.role
    ev = RoleEvidence(role=role)
    for world, path in layout.rank_files(role).items():
        ev.ranks[world] = load_rank(path, world)
    for world in range(server.world_size):
        if world not in ev.ranks and server.probe:
            ev.missing.append(layout.relative(layout.rank_file(role, world)))
    runner = layout.runner_file(role)
    if runner.is_file():
        ev.runner = load_runner(runner)
    else:
        ev.missing.append(layout.relative(runner))
    for node in server.nodes:
        p = layout.log(role, node.node_rank)
        if p.is_file():
            ev.logs[node.node_rank] = p.read_text(encoding="utf-8", errors="replace")
        else:
            ev.missing.append(layout.relative(p))
    return ev


def load_plan(root: Path) -> Plan:
    path = Layout(root).plan
    if not path.is_file():
        raise EvidenceError(
            Problem(
                Span(str(path), 1, 1),
                "archive has no plan.json",
                hint="is this an archive directory (results/<scenario>/<time>-<hash>/)?",
            )
        )
    try:
        return Plan.model_validate_json(path.read_text(encoding="utf-8"))
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise EvidenceError(Problem(Span(str(path), 1, 1), f"bad plan at {loc}: {first['msg']}")) from None


def load_archive(dir: Path | str) -> Archive:
    """Load `dir`. Raises EvidenceError when plan.json is missing or any evidence line is malformed."""
    root = Path(dir)
    layout = Layout(root)
    plan = load_plan(root)
    roles = {"main": load_role(layout, plan.main)}
    if plan.baseline is not None:
        roles["baseline"] = load_role(layout, plan.baseline)
    return Archive(dir=root, plan=plan, roles=roles)
