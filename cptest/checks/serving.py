"""serving: enough requests completed and none hung.

params: {"completed_min": int, "of": int, "role": "main"}

Every planned request must have an outcome record (ok, error, timeout, not_sent); a planned request
without one hung (fail), unless the runner's evidence was truncated or the run was interrupted
(unknown). A timeout is indeterminate (style.md rule 7): with fewer than `completed_min` completed
and some timeouts the verdict is unknown; with enough completed, timeouts do not matter.
"""

from __future__ import annotations

from cptest.checks.load import Archive
from cptest.checks.verdict import Verdict, failed, passed, unknown
from cptest.plan.model import Expectation

NAME = "serving"


def check(archive: Archive, expect: Expectation) -> Verdict:
    p = expect.params
    role = p.get("role", "main")
    need = int(p.get("completed_min", 0))
    ev = archive.role(role).runner
    if ev is None:
        return unknown(NAME, f"no runner evidence for {role} (evidence/{role}/runner.jsonl missing)")
    planned = [r.index for r in archive.plan.workload.requests]
    of = int(p.get("of") or len(planned))
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
