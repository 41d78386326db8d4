"""latency: a percentile of the requests' latency stays within a bound.

    expect { latency ttft p99 <= 5s }      expect { latency e2e max <= 30s }

The runner times every request it sends (`RequestResult`): `ttft` the time to the first token,
`tpot` the time per output token after it, `e2e` the whole request. The statistic is the nearest
rank (a latency that occurred) over the requests that completed with the figure, each timed-out
request counted as slower than all of them: a stall hidden in a timeout still moves the tail. A
statistic that falls on a timed-out request is unknown (a timeout is indeterminate, as in `serving`);
errors and unsent requests are `serving`'s to judge, not latencies. On co-located ranks the times
were taken with ranks sharing a GPU: a bound they exceed says nothing of the engine's speed
(docs/placement.md), so that is unknown, while one they meet still holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import ValidationInfo, field_validator

from cptest.contracts.base import Contract, Declared, Params, PlanContext, Syntax, Written, choice, invalid
from cptest.contracts.parity import nearest_rank
from cptest.evidence import Evidence
from cptest.values import Duration, Ident, describe
from cptest.verdict import Verdict, failed, passed, unknown

NAME = "latency"
METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}
"""A metric as written -> the `RequestResult` field that holds it."""
STATS = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "max": 1.0}


class LatencyExpect(Declared):
    metric: Literal["ttft", "tpot", "e2e"]
    stat: Literal["p50", "p90", "p99", "max"]
    limit_s: float

    @field_validator("metric", "stat", mode="before")
    @classmethod
    def _word(cls, v: Any, info: ValidationInfo) -> Any:
        what, words = ("metric", METRICS) if info.field_name == "metric" else ("statistic", STATS)
        return choice(f"latency {what}", v, words)

    @field_validator("limit_s", mode="before")
    @classmethod
    def _limit(cls, v: Any) -> Any:
        if not isinstance(v, Duration):
            raise invalid("a latency bound is a duration", expected="a duration (500ms, 5s, 2m)",
                          found=describe(v))
        if not 0 < v.seconds < math.inf:
            raise invalid("a latency bound must be > 0", found=f"{v.seconds:g}s")
        return v.seconds


class LatencyParams(Params):
    kind: Literal["latency"] = "latency"
    metric: Literal["ttft", "tpot", "e2e"]
    stat: Literal["p50", "p90", "p99", "max"]
    limit_s: float


def resolve(expect: LatencyExpect, ctx: PlanContext) -> LatencyParams:
    return LatencyParams(metric=expect.metric, stat=expect.stat, limit_s=expect.limit_s)


def check(evidence: Evidence, p: LatencyParams) -> Verdict:
    server = evidence.role(p.role)
    ev = server.runner
    bound = f"{p.metric} {p.stat} <= {p.limit_s:g}s"
    if ev is None:
        return unknown(NAME, f"no runner evidence for {p.role} (evidence/{p.role}/runner.jsonl missing)")
    field = METRICS[p.metric]
    timed = sorted(v for r in ev.requests if r.status == "ok" and (v := getattr(r, field)) is not None)
    timeouts = sum(r.status == "timeout" for r in ev.requests)
    figures: dict[str, Any] = {"bound": bound, "timed": len(timed), "timeouts": timeouts}
    if not timed:
        return unknown(NAME, f"no completed request of {p.role} has a {p.metric} time", **figures)
    measured = nearest_rank([*timed, *[math.inf] * timeouts], STATS[p.stat])
    if math.isinf(measured):
        return unknown(NAME, f"the {p.stat} falls among the {timeouts} timed-out request(s) (indeterminate)",
                       **figures)
    figures["measured_s"] = round(measured, 6)
    said = f"{p.metric} {p.stat} {measured:.3g}s over {len(timed)} request(s)"
    if measured <= p.limit_s:
        return passed(NAME, f"{said} <= {p.limit_s:g}s", **figures)
    if server.placement == "colocated":
        return unknown(NAME, f"{said} > {p.limit_s:g}s, but the ranks ran co-located (times taken with ranks "
                       "sharing a GPU are no speed measurement)", **figures)
    return failed(NAME, f"{said} > {p.limit_s:g}s", **figures)


def _read(c: list[Any]) -> Written:
    metric, stat, limit = c
    return Written(NAME, {"metric": Ident(metric), "stat": Ident(stat), "limit_s": limit},
                   {"metric": metric, "stat": stat})


def _write(key: str, v: Mapping[str, Any], show: Callable[[Any], str]) -> str:
    return f"latency {v['metric']} {v['stat']} <= {show(v['limit_s'])}"


SYNTAX = Syntax("latency", {"latency": _read}, _write)

CONTRACT = Contract(NAME, 65, LatencyExpect, LatencyParams, resolve, check, SYNTAX, repeatable=True,
                    qualifier="metric", examples=("latency ttft p99 <= 5s", "latency e2e max <= 120s"))
