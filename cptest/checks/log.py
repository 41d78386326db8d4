"""log: a pattern is present in (or absent from) the logs of a role.

params: {"pattern": regex, "present": bool, "role": "main" (optional)}. Missing logs are unknown:
an absent line in a log that does not exist proves nothing.
"""

from __future__ import annotations

import re

from cptest.checks.load import Archive
from cptest.checks.verdict import Verdict, failed, passed, unknown
from cptest.plan.model import Expectation

NAME = "log"


def check(archive: Archive, expect: Expectation) -> Verdict:
    p = expect.params
    role = p.get("role", "main")
    pattern = p["pattern"]
    present = bool(p.get("present", True))
    ev = archive.role(role)
    if not ev.logs:
        return unknown(NAME, f"no logs of {role} in the archive (logs/{role}-node*.log)")
    missing = [m for m in ev.missing if m.startswith("logs/")]
    rx = re.compile(pattern, re.MULTILINE)
    for node in sorted(ev.logs):
        text = ev.logs[node]
        m = rx.search(text)
        if m:
            line = text[text.rfind("\n", 0, m.start()) + 1 :].split("\n", 1)[0].strip()
            where = f"logs/{role}-node{node}.log"
            if present:
                return passed(NAME, f"{pattern!r} found in {where}: {line}", file=where, line=line)
            return failed(
                NAME, f"{pattern!r} should be absent but {where} has: {line}", file=where, line=line
            )
    if missing:
        return unknown(NAME, f"{pattern!r} not found, and {', '.join(missing)} is missing", missing=missing)
    if present:
        return failed(NAME, f"{pattern!r} not found in any log of {role}")
    return passed(NAME, f"{pattern!r} absent from every log of {role}")
