"""capacity transitions: the KV pool's accounting holds at every sample while it fills and drains.

    expect { capacity transitions peak >= 0.9 together within 0 }

`capacity` judges the pool at one instant; this judges it through a run (docs/language.md,
"Capacity transitions"), from each rank's `PoolSample` records (written by the probe at scheduler
iterations, `cptest.probe.pool_hooks`), against what the plan says:

- **logical == group x physical, at every sample**: the allocator's token space (`total`) equals
  the DCP group size times the rank's pool rows (`KvPool.rows`), and the scheduler's own logical
  capacity (`scheduler_total`, where recorded) equals it too. Both SGLang releases cptest knows
  promise this for the allocator (the pinned release's `mem_cache/kv_cache_configurator.py:1563-1566`, the
  pool-stats observer `managers/scheduler.py:2005`), and so does the reference engine. A sample
  whose figures are out of range (free above the total, negative use) fails too.
- **the pool was exercised**: some sample held at least `peak` of the total in use; otherwise the
  transitions were not observed (unknown: the workload's doing, not the engine's).
- **no rows leaked after drain**: each rank's last sample is the drained scheduler (nothing running
  or waiting) with no token in use; tokens the prefix cache keeps (`evictable`) are reported apart,
  they are reusable, not leaked. A last sample that is not drained is unknown (the drain was not
  seen); a drained one with tokens in use fails.
- **admission at the limit is queued, not crashed**: some sample had a request waiting while at
  least `peak` of the pool was in use (else unknown: the limit was never met), and every request of
  the workload was answered (`error` fails; a timeout or a request not sent is indeterminate,
  unknown).
- **the group moves together**: the ranks of each DCP group that sampled the same scheduler
  iteration (same `step`, both busy or both drained) report the same use within `slack` tokens.
  The default is 0: every rank of an SGLang server runs the same scheduler on the same broadcast
  requests, and the reference's ranks count their blocks from the same step messages, so any
  difference is an accounting bug. No common iteration in a group is unknown.

Missing samples (a rank without any, no KvPool, no runner records) are unknown with the reason,
never fail.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import field_validator

from cptest.contracts.base import Contract, Declared, Params, PlanContext, Syntax, Written, invalid, number
from cptest.contracts.groups import all_ranks, groups
from cptest.evidence import Evidence, PoolSample, RoleEvidence
from cptest.values import describe
from cptest.verdict import Verdict, failed, passed, unknown

NAME = "capacity_transitions"
DEFAULT_PEAK = 0.9
SHOWN = 5
"""Violations listed in the verdict's figures (all are counted)."""


class CapacityTransitionsExpect(Declared):
    peak: float = DEFAULT_PEAK
    """The share of the logical pool some sample must have in use (`peak >= 0.9`)."""
    slack: int = 0
    """Tokens the members of a DCP group may differ by at one scheduler iteration (`together within N`)."""

    @field_validator("peak", mode="before")
    @classmethod
    def _peak(cls, x: Any) -> Any:
        return DEFAULT_PEAK if x is None else number("capacity transitions peak", x, 0.0, 1.0, lo_open=True)

    @field_validator("slack", mode="before")
    @classmethod
    def _slack(cls, x: Any) -> Any:
        if x is None:
            return 0
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise invalid("capacity transitions 'together within' takes whole tokens",
                          expected="an integer >= 0", found=describe(x))
        return x


class CapacityTransitionsParams(Params):
    kind: Literal["capacity_transitions"] = "capacity_transitions"
    peak: float = DEFAULT_PEAK
    slack: int = 0
    group_size: int
    """The DCP degree: the allocator's token space is this many times the rank's pool rows."""


def resolve(expect: CapacityTransitionsExpect, ctx: PlanContext) -> CapacityTransitionsParams:
    return CapacityTransitionsParams(peak=expect.peak, slack=expect.slack, group_size=ctx.degrees.dcp)


def check(evidence: Evidence, p: CapacityTransitionsParams) -> Verdict:
    ev = evidence.role(p.role)
    ranks = all_ranks(ev, NAME)
    if isinstance(ranks, Verdict):
        return ranks
    no_samples = [w for w in ranks if not ev.ranks[w].pool_samples]
    if no_samples:
        w = no_samples[0]
        notes = [n.message for n in ev.ranks[w].notes if "pool sample" in n.message]
        why = f" ({notes[0]})" if notes else ""
        return unknown(NAME, f"no pool_sample record from rank {w} of {ev.role}{why}",
                       missing_ranks=no_samples)
    no_pool = [w for w in ranks if not ev.ranks[w].kv_pools]
    if no_pool:
        return unknown(NAME, f"no KvPool record from rank {no_pool[0]} of {ev.role}: the physical rows "
                       "to compare the logical total with are unknown", missing_ranks=no_pool)

    fails: list[str] = []
    unknowns: list[str] = []
    per_rank: dict[str, dict[str, Any]] = {}
    for w in ranks:
        rows = ev.ranks[w].kv_pools[-1].rows
        per_rank[str(w)] = _rank(w, ev.ranks[w].pool_samples, rows, p, fails, unknowns)
    samples = [s for w in ranks for s in ev.ranks[w].pool_samples]
    top = max(s.used / s.total for s in samples if s.total > 0) if any(s.total > 0 for s in samples) else 0.0
    if top < p.peak:
        unknowns.append(f"the pool peaked at {top:.3f} of its logical total, below the declared {p.peak:g}: "
                        "the workload never filled it (a `fill_drain` workload sizes it to)")
    queued = [s for s in samples if s.waiting > 0 and s.total > 0 and s.used >= p.peak * s.total]
    if not queued:
        unknowns.append(f"no sample had a request waiting with at least {p.peak:g} of the pool in use: "
                        "admission at the limit was not exercised")
    requests = _requests(ev, fails, unknowns)
    together = _together(ev, p.slack, fails, unknowns)
    figures: dict[str, Any] = {
        "peak": round(top, 6), "declared_peak": p.peak, "group_size": p.group_size, "slack": p.slack,
        "samples": len(samples), "queued_at_limit": len(queued), "per_rank": per_rank,
        "requests": requests, "groups": together,
        "violations": fails[:SHOWN], "violation_count": len(fails),
    }
    if fails:
        more = f"; and {len(fails) - 1} more" if len(fails) > 1 else ""
        return failed(NAME, fails[0] + more, **figures)
    if unknowns:
        figures["not_judged"] = unknowns
        return unknown(NAME, unknowns[0], **figures)
    return passed(NAME, f"{len(samples)} pool samples over {len(ranks)} rank(s): logical == "
                  f"{p.group_size} x rows at each, peak {top:.3f} >= {p.peak:g}, {len(queued)} with "
                  "requests queued at the limit, drained to 0 tokens in use, group members equal at every "
                  "common step", **figures)


def _rank(w: int, samples: list[PoolSample], rows: int, p: CapacityTransitionsParams,
          fails: list[str], unknowns: list[str]) -> dict[str, Any]:
    """Judge one rank's samples (logical size, ranges, drain); its figures."""
    want = rows * p.group_size
    for s in samples:
        if s.total != want:
            fails.append(f"rank {w} step {s.step}: the allocator's total is {s.total} tokens, expected "
                         f"{p.group_size} x {rows} rows = {want}")
        if s.scheduler_total is not None and s.scheduler_total != s.total:
            fails.append(f"rank {w} step {s.step}: the scheduler counts a logical total of "
                         f"{s.scheduler_total} tokens, the allocator {s.total}")
        if not 0 <= s.free <= s.total or s.used < 0:
            fails.append(f"rank {w} step {s.step}: free {s.free}, evictable {s.evictable} of {s.total}: "
                         f"{s.used} tokens in use is impossible")
    last = samples[-1]
    if not last.idle:
        unknowns.append(f"rank {w}'s last sample (step {last.step}) has {last.running} running and "
                        f"{last.waiting} waiting: the drain was not observed")
    elif last.used != 0:
        fails.append(f"rank {w}: {last.used} tokens still in use after drain (free {last.free}, evictable "
                     f"{last.evictable or 0} of {last.total}): leaked rows")
    return {"samples": len(samples), "rows": rows, "total": last.total,
            "peak_used": max(s.used for s in samples), "last_used": last.used,
            "last_evictable": last.evictable, "drained": last.idle}


def _requests(ev: RoleEvidence, fails: list[str], unknowns: list[str]) -> dict[str, int] | None:
    """Every request answered: an error fails (admission must queue or refuse, not crash)."""
    if ev.runner is None:
        unknowns.append(f"no runner records of {ev.role}: whether requests were answered is unknown")
        return None
    counts: dict[str, int] = {}
    for r in ev.runner.requests:
        counts[r.status] = counts.get(r.status, 0) + 1
    errors = [r for r in ev.runner.requests if r.status == "error"]
    if errors:
        fails.append(f"request {errors[0].index} failed while the pool filled: {errors[0].error[:200]}"
                     + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
    lost = counts.get("timeout", 0) + counts.get("not_sent", 0)
    if lost:
        unknowns.append(f"{lost} request(s) timed out or were not sent: indeterminate")
    return counts


def _together(ev: RoleEvidence, slack: int, fails: list[str], unknowns: list[str]) -> list[dict[str, Any]]:
    """The members of each DCP group at the iterations they all sampled."""
    out = []
    for members in groups(ev, "dcp")[0]:
        if len(members) < 2:
            continue
        at: list[dict[tuple[int, bool], PoolSample]] = []
        for w in members:
            by: dict[tuple[int, bool], PoolSample] = {}
            for s in ev.ranks[w].pool_samples if w in ev.ranks else []:
                by[(s.step, s.idle)] = s  # the last sample of that iteration
            at.append(by)
        common = sorted(set.intersection(*(set(b) for b in at)))
        worst = 0
        for key in common:
            used = [b[key].used for b in at]
            spread = max(used) - min(used)
            worst = max(worst, spread)
            if spread > slack:
                fails.append(f"DCP group {members} at step {key[0]}: ranks hold {used} tokens, "
                             f"{spread} apart (allowed {slack})")
        if not common:
            unknowns.append(f"DCP group {members}: no scheduler iteration sampled by every member")
        out.append({"members": members, "common_samples": len(common), "largest_spread": worst})
    return out


def _read(c: list[Any]) -> Written:
    return Written(NAME, {"peak": c[0], "slack": c[1]})


def _write(key: str, v: Mapping[str, Any], show: Callable[[Any], str]) -> str:
    body = "capacity transitions"
    if v["peak"] is not None:
        body += f" peak >= {show(v['peak'])}"
    if v["slack"] is not None:
        body += f" together within {show(v['slack'])}"
    return body


SYNTAX = Syntax("capacity", {"capacity_transitions": _read}, _write)

CONTRACT = Contract(NAME, 35, CapacityTransitionsExpect, CapacityTransitionsParams, resolve, check, SYNTAX,
                    examples=("capacity transitions peak >= 0.9",))
