"""log: a pattern is present in (or absent from) the logs of a role.

    expect { log contains "DCP enabled, dcp_size=2" }      expect { log absent "Traceback" }

Missing logs are unknown: an absent line in a log that does not exist proves nothing. The pattern is
searched with a time limit (`cptest.contracts.patterns`): one that backtracks catastrophically on a
log is unknown, never a hang of `cptest check`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import field_validator

from cptest.contracts import patterns
from cptest.contracts.base import Contract, Declared, Params, PlanContext, Syntax, Written, invalid
from cptest.evidence import Evidence
from cptest.verdict import Verdict, failed, passed, unknown

NAME = "log"


class LogExpect(Declared):
    mode: Literal["contains", "absent"]
    pattern: str

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        problem = patterns.check(v)
        if problem is not None:
            raise invalid(problem, found=v[:80])
        return v


class LogParams(Params):
    kind: Literal["log"] = "log"
    pattern: str
    present: bool = True


def resolve(expect: LogExpect, ctx: PlanContext) -> LogParams:
    return LogParams(pattern=expect.pattern, present=expect.mode == "contains")


def check(evidence: Evidence, p: LogParams) -> Verdict:
    role = p.role
    pattern = p.pattern
    present = p.present
    ev = evidence.role(role)
    if not ev.logs:
        return unknown(NAME, f"no logs of {role} in the archive (logs/{role}-node*.log)")
    missing = [m for m in ev.missing if m.startswith("logs/")]
    for node in sorted(ev.logs):
        text = ev.logs[node]
        try:
            m = patterns.search(pattern, text)
        except patterns.PatternTimeout as err:
            return unknown(NAME, f"{err} on {ev.log_file(node)}", timeout_s=err.timeout_s)
        if m:
            line = text[text.rfind("\n", 0, m.start()) + 1 :].split("\n", 1)[0].strip()
            where = ev.log_file(node)
            if present:
                return passed(NAME, f"{pattern!r} found in {where}: {line}", file=where, line=line)
            return failed(
                NAME, f"{pattern!r} should be absent but {where} has: {line}", file=where, line=line
            )
    apart = _set_apart(ev.follower_tails)
    if missing:
        return unknown(NAME, f"{pattern!r} not found, and {', '.join(missing)} is missing", missing=missing)
    if present:
        return failed(NAME, f"{pattern!r} not found in any log of {role}{apart}")
    return passed(NAME, f"{pattern!r} absent from every log of {role}{apart}",
                  **({"follower_lines_not_judged": {str(k): v for k, v in sorted(ev.follower_tails.items())}}
                     if ev.follower_tails else {}))


def _set_apart(tails: dict[int, int]) -> str:
    """What of a co-located server's logs was not searched, for the reason."""
    if not tails:
        return ""
    which = ", ".join(f"node {k}'s last {n} line(s)" for k, n in sorted(tails.items()))
    return (f" (not searched: {which}, written by the follower node's own launcher after its ranks had "
            "ended: the co-located placement's, not the server's; docs/placement.md)")


def _contains(c: list[Any]) -> Written:
    return Written(NAME, {"mode": "contains", "pattern": str(c[0])})


def _absent(c: list[Any]) -> Written:
    return Written(NAME, {"mode": "absent", "pattern": str(c[0])})


def _write(key: str, v: Mapping[str, Any], show: Callable[[Any], str]) -> str:
    return f"log {v['mode']} {show(v['pattern'])}"


SYNTAX = Syntax("log", {"log_contains": _contains, "log_absent": _absent}, _write)

CONTRACT = Contract(NAME, 80, LogExpect, LogParams, resolve, check, SYNTAX, repeatable=True,
                    absence_based=True, dumped_when_absent=True, qualifier="mode",
                    examples=('log contains "DCP enabled"', 'log absent "Traceback"'))
