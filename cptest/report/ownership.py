"""Who wrote which K/V position: the ownership map of the HTML report, from the probe's `kv_written`.

The K/V space a position belongs to is a DCP group's (docs/architecture.md §9): within one group
every position of a request from 0 to its end should be written exactly once. Here every write is
counted, not judged: a *hole* is a position below the request's end that no rank of the group
wrote, a *double* one written more than once (by two ranks, or twice by one). The rows contract
(`cptest/contracts/rows.py`) is what decides pass or fail; this module only shows where.

Pure: reads `RoleEvidence` (what `checks.load` built with `evidence.read_records`), never a file.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from cptest.contracts.groups import groups
from cptest.evidence import Ranges, RoleEvidence, ranges_len, ranges_merge


@dataclass(frozen=True)
class RequestOwnership:
    rid: str
    end: int
    """One past the highest position any rank of the group wrote."""
    by_rank: dict[int, Ranges]
    """World rank -> the positions it wrote (merged)."""
    holes: Ranges
    doubles: Ranges


@dataclass(frozen=True)
class GroupOwnership:
    ranks: tuple[int, ...]
    """World ranks of the group, in DCP-rank order."""
    requests: tuple[RequestOwnership, ...]
    """In the order the group first wrote them."""

    @property
    def holes(self) -> int:
        return sum(ranges_len(r.holes) for r in self.requests)

    @property
    def doubles(self) -> int:
        return sum(ranges_len(r.doubles) for r in self.requests)

    def written(self, world: int) -> int:
        return sum(ranges_len(r.by_rank.get(world, [])) for r in self.requests)


@dataclass(frozen=True)
class Ownership:
    groups: tuple[GroupOwnership, ...]
    groups_from: str
    """"probe" (the engine's own groups) or "plan" (the planned degrees)."""
    truncated: tuple[int, ...]
    """Ranks whose evidence ends in a dropped half line: a hole may be the kill, not the engine."""


def ownership(ev: RoleEvidence) -> Ownership | str:
    """The ownership of every DCP group of a server, or why there is none to draw."""
    if not ev.ranks:
        return "no probe evidence from any rank (the probe was off, or no rank wrote its file)"
    if not any(r.steps for r in ev.ranks.values()):
        return "no Step records from any rank (the probe saw no forward step)"
    if not any(s.kv_written for r in ev.ranks.values() for s in r.steps):
        if all(s.replayed for r in ev.ranks.values() for s in r.steps if s.mode == "decode"):
            return ("no rank recorded a K/V write: the prefill writes were not seen and every decode step "
                    "was a CUDA-graph replay, inside which K/V writes are not observable (an eager run "
                    "records them)")
        return "no rank recorded a K/V write (kv_written empty in every step: an older probe or engine)"
    dcp_groups, source = groups(ev, "dcp")
    if not dcp_groups:
        dcp_groups = [[w] for w in sorted(ev.ranks)]
        source = "evidence"
    out = [_group(ev, g) for g in dcp_groups]
    truncated = tuple(w for w in sorted(ev.ranks) if ev.ranks[w].dropped)
    return Ownership(tuple(out), source, truncated)


def _group(ev: RoleEvidence, group: list[int]) -> GroupOwnership:
    writes: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    first: dict[str, tuple[int, int]] = {}
    for world in group:
        rank = ev.ranks.get(world)
        for step in rank.steps if rank is not None else ():
            for rid, rngs in step.kv_written.items():
                if rngs and (rid not in first or step.step < first[rid][0]):
                    first[rid] = (step.step, first[rid][1] if rid in first else len(first))
                writes[rid].extend((a, b, world) for a, b in rngs if b > a)
    requests = [_request(rid, writes[rid]) for rid in sorted(first, key=lambda r: first[r])]
    return GroupOwnership(tuple(group), tuple(requests))


def _request(rid: str, writes: list[tuple[int, int, int]]) -> RequestOwnership:
    end = max(b for _, b, _ in writes)
    count = np.zeros(end + 1, dtype=np.int32)
    by_rank: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for a, b, world in writes:
        count[max(a, 0)] += 1  # a difference array: coverage is its running sum
        count[b] -= 1
        by_rank[world].append((a, b))
    cover = np.cumsum(count)[:end]
    return RequestOwnership(
        rid=rid, end=end, by_rank={w: ranges_merge(r) for w, r in sorted(by_rank.items())},
        holes=_runs(cover == 0), doubles=_runs(cover > 1),
    )  # fmt: skip


def _runs(mask: np.ndarray) -> Ranges:
    """The half-open ranges where `mask` is true."""
    if not mask.any():
        return []
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


HOLE, DOUBLE = 3, 4
"""Cell codes of `matrix`, by priority: 0 past the request's end, 1 written by another rank, 2
written by this rank, 3 a hole, 4 a double write. A binned cell shows the highest it covers."""


def matrix(g: GroupOwnership, *, max_requests: int, max_columns: int) -> tuple[np.ndarray, int, int]:
    """(codes, positions per column, requests shown): one row per (request, rank of the group), one
    column per `positions per column` positions, each cell the highest code of `HOLE`'s list."""
    shown = g.requests[:max_requests]
    width = max((r.end for r in shown), default=1)
    per = max(1, -(-width // max_columns))
    columns = -(-width // per)
    out = np.zeros((len(shown) * len(g.ranks), columns), dtype=np.int8)
    for i, req in enumerate(shown):
        for k, world in enumerate(g.ranks):
            row = np.zeros(columns * per, dtype=np.int8)
            row[:req.end] = 1
            for a, b in req.by_rank.get(world, []):
                row[a:b] = 2
            for a, b in req.holes:
                row[a:b] = HOLE
            for a, b in req.doubles:
                for x, y in req.by_rank.get(world, []):
                    if x < b and a < y:
                        row[max(a, x):min(b, y)] = DOUBLE
            out[i * len(g.ranks) + k] = row.reshape(columns, per).max(axis=1)
    return out, per, len(shown)
