"""What the reports show, drawn out of an archive's typed evidence and plan: per-step rows, the K/V
rows each rank holds over the run, latencies, request outcomes and lifecycle events, and where the
ranks ran when they were co-located.

Pure: reads the `Evidence` and `Plan` that `checks.load` built with `evidence.read_records` (never
a file). Each view is either its data or a string saying plainly why the archive has none (a
reference engine without a probe, a fault run that stopped before any step, an older evidence
version), never an exception for what an archive lacks.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from cptest.contracts.groups import groups
from cptest.evidence import Evidence, RoleEvidence, ranges_len
from cptest.plan.model import Plan

ROLES = ("main", "baseline", "control", "eager")


# ---------------------------------------------------------------- rows per rank per step
@dataclass(frozen=True)
class RankSteps:
    world: int
    step: list[int]
    mode: list[str]
    rows_in: list[int]
    attn: list[int | None]
    ffn: list[int | None]
    logits: list[int | None]

    def total(self, values: list[int | None]) -> int | None:
        seen = [v for v in values if v is not None]
        return sum(seen) if seen else None

    def modes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for m in self.mode:
            out[m] = out.get(m, 0) + 1
        return dict(sorted(out.items()))


def rows(ev: RoleEvidence) -> list[RankSteps] | str:
    if not ev.ranks:
        return "no probe evidence from any rank (the probe was off, or no rank wrote its file)"
    out = []
    for world in sorted(ev.ranks):
        steps = sorted(ev.ranks[world].steps, key=lambda s: s.step)
        if steps:
            out.append(RankSteps(world, [s.step for s in steps], [s.mode for s in steps],
                                 [s.rows_in for s in steps], [s.attn_rows for s in steps],
                                 [s.ffn_rows for s in steps], [s.logits_rows for s in steps]))  # fmt: skip
    if not out:
        return "no Step records from any rank: a run that stopped before its first forward has none"
    return out


# ---------------------------------------------------------------- capacity
@dataclass(frozen=True)
class RankCapacity:
    world: int
    pool_rows: int | None
    allocator_size: int | None
    max_total_num_tokens: int | None
    context_len: int | None


@dataclass(frozen=True)
class Timeline:
    label: str
    step: list[int]
    held: list[int]
    limit: int | None
    """The rows it may hold: a rank's pool rows, a group's logical token space."""


@dataclass(frozen=True)
class Capacity:
    ranks: list[RankCapacity]
    server_info_tokens: int | None
    timelines: list[Timeline] = field(default_factory=list)
    timeline_absent: str | None = None


def capacity(ev: RoleEvidence) -> Capacity | str:
    ranks = []
    for world in sorted(ev.ranks):
        r = ev.ranks[world]
        pool = r.kv_pools[-1] if r.kv_pools else None
        cap = r.capacities[-1] if r.capacities else None
        ranks.append(RankCapacity(
            world, pool.rows if pool else None, pool.allocator_size if pool else None,
            cap.max_total_num_tokens if cap else None, cap.context_len if cap else None))
    info = ev.runner.server_info[-1].info if ev.runner and ev.runner.server_info else {}
    tokens = info.get("max_total_num_tokens")
    tokens = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None
    if not any(r.pool_rows or r.max_total_num_tokens for r in ranks) and tokens is None:
        return "no KvPool or Capacity record from any rank and no max_total_num_tokens in /server_info"
    held = _held(ev)
    if isinstance(held, str):
        measured = _measured(ev)
        return Capacity(ranks, tokens, measured, timeline_absent=None if measured else held)
    pools = {r.world: r.pool_rows for r in ranks}
    lines = [Timeline(f"rank {w}", s, h, pools.get(w)) for w, (s, h) in sorted(held.items())]
    dcp_groups, _ = groups(ev, "dcp")
    for g in dcp_groups:
        if len(g) < 2 or not all(w in held for w in g):
            continue
        total: dict[int, int] = defaultdict(int)
        for w in g:
            for s, h in zip(*held[w], strict=True):
                total[s] += h
        limit = next((r.allocator_size or r.max_total_num_tokens for r in ranks if r.world == g[0]), None)
        lines.append(Timeline(f"DCP group {g}", sorted(total), [total[s] for s in sorted(total)], limit))
    return Capacity(ranks, tokens, lines + _measured(ev))


def _measured(ev: RoleEvidence) -> list[Timeline]:
    """Tokens in use as each rank's pool samples measured them: the allocator's own count, in
    its logical token space: handed out and not evictable by the radix cache."""
    return [Timeline(f"rank {w} in use (pool samples)", [s.step for s in r.pool_samples],
                     [s.used for s in r.pool_samples], r.pool_samples[-1].total)
            for w, r in sorted(ev.ranks.items()) if r.pool_samples]


def _held(ev: RoleEvidence) -> dict[int, tuple[list[int], list[int]]] | str:
    """World rank -> (steps, K/V rows it holds for live requests after each step). A request holds
    its rows from its first step to its last one on any rank of the server: an estimate from what
    the probe saw, since frees (and what the radix cache keeps) are not recorded."""
    last: dict[str, int] = {}
    for r in ev.ranks.values():
        for s in r.steps:
            for rid in s.seq_positions or s.kv_written:
                last[rid] = max(last.get(rid, s.step), s.step)
    if not any(s.kv_written for r in ev.ranks.values() for s in r.steps):
        return "no rank recorded a K/V write, so the rows held over time are unknown"
    out = {}
    for world in sorted(ev.ranks):
        steps = sorted(ev.ranks[world].steps, key=lambda s: s.step)
        live: dict[str, int] = {}
        xs, ys = [], []
        for s in steps:
            for rid, rngs in s.kv_written.items():
                live[rid] = live.get(rid, 0) + ranges_len(rngs)
            xs.append(s.step)
            ys.append(sum(live.values()))
            for rid in [rid for rid in live if last.get(rid, s.step) <= s.step]:
                del live[rid]
        if xs:
            out[world] = (xs, ys)
    return out


# ---------------------------------------------------------------- latency
@dataclass(frozen=True)
class Latency:
    role: str
    ttft: list[float]
    tpot: list[float]
    e2e: list[float]
    ok: int
    total: int


def latency(evidence: Evidence) -> list[Latency] | str:
    out = []
    for role in ROLES:
        runner = evidence.role(role).runner
        if runner is None or not runner.requests:
            continue
        ok = [r for r in runner.requests if r.status == "ok"]
        out.append(Latency(role, sorted(r.ttft_s for r in ok if r.ttft_s is not None),
                           sorted(r.tpot_s for r in ok if r.tpot_s is not None),
                           sorted(r.e2e_s for r in ok if r.e2e_s is not None), len(ok), len(runner.requests)))
    if not out:
        return "no request records from any server (the run stopped before its workload)"
    if not any(x.ttft or x.tpot for x in out):
        return "no request completed with timings, so there is no latency to show"
    return out


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted `values` (None when empty)."""
    if not values:
        return None
    k = min(len(values) - 1, max(0, -(-len(values) * q // 100) - 1))
    return values[int(k)]


# ---------------------------------------------------------------- requests and lifecycle
@dataclass(frozen=True)
class RequestSpan:
    index: int
    sent_at: float
    e2e: float | None
    ttft: float | None
    status: str
    error: str


@dataclass(frozen=True)
class Event:
    t: float
    event: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class Outcomes:
    requests: list[RequestSpan]
    events: list[Event]
    faults: int

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.requests:
            out[r.status] = out.get(r.status, 0) + 1
        return dict(sorted(out.items()))


def outcomes(ev: RoleEvidence) -> Outcomes | str:
    if ev.runner is None:
        return f"no runner evidence for {ev.role} (evidence/{ev.role}/runner.jsonl missing)"
    reqs = [RequestSpan(r.index, r.sent_at, r.e2e_s, r.ttft_s, r.status, r.error)
            for r in sorted(ev.runner.requests, key=lambda r: r.index)]
    events = [Event(e.t, e.event, e.detail) for e in ev.runner.lifecycle]
    if not reqs and not events:
        return "no request or lifecycle record: the runner wrote nothing before it stopped"
    return Outcomes(reqs, events, sum(1 for e in events if e.event == "fault"))


# ---------------------------------------------------------------- co-located placement
COLOCATED_TIMINGS = ("Co-located: the ranks shared GPUs and their collectives went over sockets, so these "
                     "figures are not speed measurements.")
"""The note beside any throughput, latency or startup figure of a co-located archive."""


@dataclass(frozen=True)
class ColocatedServer:
    """How one co-located server's ranks were placed, in words for a report."""

    role: str
    rank_gpus: list[tuple[int, int]]
    """(world rank, physical GPU) for each rank."""
    ranks_per_gpu: int
    transport: str
    env: list[str]
    """`NAME=value` the placement added to every node's environment."""
    node_env: list[str]
    """`node k: NAME=value, ...` for what differs between nodes (each node's host id)."""
    flags: list[str]
    mem_fraction: str
    """Each rank's memory fraction and its basis, e.g. `0.25 (the scenario's mem_fraction 0.5 / 2 ...)`."""


@dataclass(frozen=True)
class ColocatedPlacement:
    servers: list[ColocatedServer]
    cannot_judge: list[str]
    """What evidence of co-located ranks says nothing about (every server's, once each)."""


def placement(plan: Plan | None) -> ColocatedPlacement | None:
    """The co-located servers of `plan` and what they cannot judge; None when every server (or the
    plan, being unreadable) has one rank per GPU as far as the plan says."""
    if plan is None:
        return None
    placed = [(s.role, s.colocation) for s in plan.servers() if s.colocation is not None]
    if not placed:
        return None
    servers: list[ColocatedServer] = []
    cannot: dict[str, None] = {}
    for role, c in placed:
        fraction = "none" if c.mem_fraction is None else f"{c.mem_fraction:g}"
        servers.append(ColocatedServer(
            role=role, rank_gpus=list(enumerate(c.rank_gpus)), ranks_per_gpu=c.ranks_per_gpu,
            transport=c.transport, env=[f"{k}={v}" for k, v in c.env.items()],
            node_env=[f"node {n}: " + ", ".join(f"{k}={v}" for k, v in e.items())
                      for n, e in enumerate(c.node_env) if e],
            flags=list(c.flags), mem_fraction=f"{fraction} ({c.mem_fraction_basis})"))
        cannot.update(dict.fromkeys(c.cannot_judge))
    return ColocatedPlacement(servers, list(cannot))
