"""launch: the server became ready (accepted), or failed to launch for the declared reason (rejected).

    expect { launch accepted }
    expect { launch rejected matching "does not support --enable-prefill-cp" }

Evidence: the role's Lifecycle `ready` / `launch_failed` events, and for a rejection every log of
the role (plus the `launch_failed` reason, which carries the log tail the runner saw).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import field_validator

from cptest.contracts import patterns
from cptest.contracts.base import Contract, Declared, Params, PlanContext, Syntax, Written, invalid
from cptest.evidence import Evidence
from cptest.verdict import Verdict, failed, passed, unknown

NAME = "launch"


class LaunchExpect(Declared):
    accepted: bool
    matching: str | None = None
    """rejected only: a regex the rejection message (log) must match."""

    @field_validator("matching")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        problem = patterns.check(v) if v is not None else None
        if problem is not None:
            raise invalid(problem, found=v[:80] if v else None)
        return v


class LaunchParams(Params):
    kind: Literal["launch"] = "launch"
    accepted: bool = True
    match: str | None = None


def resolve(expect: LaunchExpect, ctx: PlanContext) -> LaunchParams:
    return LaunchParams(accepted=expect.accepted, match=expect.matching)


def check(evidence: Evidence, p: LaunchParams) -> Verdict:
    role = p.role
    ev = evidence.role(role)
    if ev.runner is None:
        return unknown(NAME, f"no runner evidence for {role} (evidence/{role}/runner.jsonl missing)")
    ready = ev.runner.events("ready")
    failed_ev = ev.runner.events("launch_failed")
    if p.accepted:
        if ready:
            return passed(
                NAME,
                f"{role} became ready after {ready[0].detail.get('after_s')} s",
                ready_after_s=ready[0].detail.get("after_s"),
            )
        if failed_ev:
            d = failed_ev[0].detail
            return failed(
                NAME,
                f"{role} failed to launch (status {d.get('status')}): {d.get('reason', '')}"
                f"; see {ev.log_file(0)}",
                status=d.get("status"),
                launch_reason=d.get("reason"),
            )
        return unknown(NAME, f"neither ready nor launch_failed recorded for {role} (run interrupted?)")
    pattern = p.match
    if ready:
        return failed(
            NAME,
            f"{role} launched although a rejection was expected",
            ready_after_s=ready[0].detail.get("after_s"),
        )
    if not failed_ev:
        return unknown(NAME, f"no launch_failed recorded for {role}; cannot tell a rejection from a hang")
    d = failed_ev[0].detail
    if not pattern:
        return passed(NAME, f"{role} was rejected (status {d.get('status')})", status=d.get("status"))
    haystack = ev.log_text + "\n" + str(d.get("reason", ""))
    if not ev.logs and not d.get("reason"):
        return unknown(
            NAME,
            f"{role} was rejected but no logs of {role} exist to match {pattern!r}",
            status=d.get("status"),
        )
    try:
        m = patterns.search(pattern, haystack)
    except patterns.PatternTimeout as err:
        return unknown(NAME, f"{role} was rejected, but {err}", status=d.get("status"))
    if m:
        line = haystack[haystack.rfind("\n", 0, m.start()) + 1 :].split("\n", 1)[0]
        return passed(
            NAME,
            f"{role} was rejected as expected: {line.strip()}",
            status=d.get("status"),
            matched=line.strip(),
        )
    return failed(
        NAME,
        f"{role} failed to launch, but no log line matches {pattern!r}: "
        f"{d.get('reason', '')}; see {ev.log_file(0)}",
        status=d.get("status"),
        launch_reason=d.get("reason"),
    )


def _accepted(c: list[Any]) -> Written:
    return Written(NAME, {"accepted": True})


def _rejected(c: list[Any]) -> Written:
    return Written(NAME, {"accepted": False, "matching": str(c[0]) if c[0] is not None else None})


def _write(key: str, v: Mapping[str, Any], show: Callable[[Any], str]) -> str:
    if v["accepted"]:
        return "launch accepted"
    return "launch rejected" + (f" matching {show(v['matching'])}" if v.get("matching") is not None else "")


SYNTAX = Syntax("launch", {"launch_accepted": _accepted, "launch_rejected": _rejected}, _write)

CONTRACT = Contract(NAME, 10, LaunchExpect, LaunchParams, resolve, check, SYNTAX, dumped_when_absent=True,
                    examples=("launch accepted", 'launch rejected matching "rejected|error"'))
