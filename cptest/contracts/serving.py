"""serving: enough requests completed and none hung.

    expect { serving all_complete }      expect { serving completed >= 32 of 64 }

Every planned request must have an outcome record (ok, error, timeout, not_sent); a planned request
without one hung (fail), unless the runner's evidence was truncated or the run was interrupted
(unknown). A timeout is indeterminate: with fewer than `completed_min` completed
and some timeouts the verdict is unknown; with enough completed, timeouts do not matter (the
style guide's rule: a request that timed out is indeterminate, not failed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import ValidationInfo, model_validator

from cptest.contracts.base import Contract, Declared, Params, PlanContext, Syntax, Written, invalid
from cptest.evidence import Evidence
from cptest.values import describe
from cptest.verdict import Verdict, failed, passed, unknown

NAME = "serving"


class ServingExpect(Declared):
    all_complete: bool = False
    completed: int | None = None
    of: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _counts(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict) or data.get("all_complete"):
            return data
        done, of = data.get("completed"), data.get("of")
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (done, of)):
            raise invalid("serving counts must be integers >= 0", found=f"{describe(done)} of {describe(of)}")
        if done > of:
            raise invalid(f"serving expects {done} completed of only {of}", expected=f"completed <= {of}")
        requests = (info.context or {}).get("requests")
        if requests is not None and of != requests:
            raise invalid(f"serving counts 'of {of}' but the workload sends {requests} requests",
                          expected=f"of {requests}")
        return data


class ServingParams(Params):
    kind: Literal["serving"] = "serving"
    completed_min: int
    of: int | None = None
    """The planned request count the minimum is out of (for the message)."""


def resolve(expect: ServingExpect, ctx: PlanContext) -> ServingParams:
    if expect.all_complete:
        return ServingParams(completed_min=ctx.requests, of=ctx.requests)
    return ServingParams(completed_min=expect.completed or 0, of=expect.of or ctx.requests)


def check(evidence: Evidence, p: ServingParams) -> Verdict:
    role = p.role
    need = p.completed_min
    ev = evidence.role(role).runner
    if ev is None:
        return unknown(NAME, f"no runner evidence for {role} (evidence/{role}/runner.jsonl missing)")
    planned = evidence.requests
    of = p.of or len(planned)
    by_index = {r.index: r for r in ev.requests}
    counts = {s: 0 for s in ("ok", "error", "timeout", "not_sent")}
    for r in by_index.values():
        counts[r.status] += 1
    hung = [i for i in planned if i not in by_index]
    figures = {
        "planned": len(planned),
        "of": of,
        "completed_min": need,
        **counts,
        "no_outcome": len(hung),
        "first_no_outcome": hung[0] if hung else None,
    }
    if hung:
        failed_launch = ev.events("launch_failed")
        if failed_launch and not ev.events("ready"):
            return failed(
                NAME, f"the {role} server never became ready (launch failed): none of {len(planned)} "
                "planned request(s) was sent", **figures,
            )  # fmt: skip
        if ev.dropped or ev.events("interrupted"):
            return unknown(
                NAME,
                f"{len(hung)} request(s) have no outcome (first: {hung[0]}), but the run was "
                "interrupted or its evidence truncated",
                **figures,
            )
        return failed(
            NAME, f"{len(hung)} request(s) hung: no outcome recorded (first: request {hung[0]})", **figures
        )
    if counts["ok"] >= need:
        return passed(
            NAME,
            f"{counts['ok']} of {len(planned)} completed (>= {need}); "
            f"{counts['error']} error(s), {counts['timeout']} timeout(s)",
            **figures,
        )
    if counts["timeout"]:
        return unknown(
            NAME,
            f"{counts['ok']} completed < {need}, and {counts['timeout']} timed out (indeterminate)",
            **figures,
        )
    first_err = next((r for r in ev.requests if r.status == "error"), None)
    return failed(
        NAME,
        f"{counts['ok']} completed < {need} of {of}"
        + (f"; first error (request {first_err.index}): {first_err.error}" if first_err else ""),
        **figures,
    )


def _completed(c: list[Any]) -> Written:
    return Written(NAME, {"all_complete": False, "completed": c[0], "of": c[1]})


def _all(c: list[Any]) -> Written:
    return Written(NAME, {"all_complete": True})


def _write(key: str, v: Mapping[str, Any], show: Callable[[Any], str]) -> str:
    if v["all_complete"]:
        return "serving all_complete"
    return f"serving completed >= {show(v['completed'])} of {show(v['of'])}"


SYNTAX = Syntax("serving", {"serving_completed": _completed, "serving_all": _all}, _write)

CONTRACT = Contract(NAME, 60, ServingExpect, ServingParams, resolve, check, SYNTAX, absence_based=True,
                    dumped_when_absent=True, examples=("serving all_complete", "serving completed >= 4 of 8"))
