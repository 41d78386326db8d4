"""launch: the server became ready (accepted) or failed to launch for the declared reason (rejected).

params: {"accepted": bool, "match": regex | None, "role": "main" (optional)}. Evidence: the role's
Lifecycle `ready` / `launch_failed` events, and for a rejection every log of the role (plus the
`launch_failed` reason, which carries the tail the runner saw).
"""

from __future__ import annotations

import re

from cptest.checks.load import Archive
from cptest.checks.verdict import Verdict, failed, passed, unknown
from cptest.plan.model import Expectation

NAME = "launch"


def check(archive: Archive, expect: Expectation) -> Verdict:
    p = expect.params
    role = p.get("role", "main")
    ev = archive.role(role)
    if ev.runner is None:
        return unknown(NAME, f"no runner evidence for {role} (evidence/{role}/runner.jsonl missing)")
    ready = ev.runner.events("ready")
    failed_ev = ev.runner.events("launch_failed")
    accepted = bool(p.get("accepted", True))
    if accepted:
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
                f"; see logs/{role}-node0.log",
                status=d.get("status"),
                launch_reason=d.get("reason"),
            )
        return unknown(NAME, f"neither ready nor launch_failed recorded for {role} (run interrupted?)")
    pattern = p.get("match")
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
    m = re.search(pattern, haystack, re.MULTILINE)
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
        f"{d.get('reason', '')}; see logs/{role}-node0.log",
        status=d.get("status"),
        launch_reason=d.get("reason"),
    )
