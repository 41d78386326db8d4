"""The rids cptest gives the requests it sends, so that rank-local evidence (keyed by rid) tells the
workload's requests from the teacher-forced scoring's and from the engine's own (its warm-up and
health checks, which carry the engine's generated rids).

Each server sees each rid once: the workload's indexes are unique, and scoring sends one request
per completed workload request after the workload has ended."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Literal

Origin = Literal["workload", "scoring", "engine"]
ORIGINS: tuple[Origin, ...] = ("workload", "scoring", "engine")

# The forms that name the workload's request i: the one the driver sends, and those earlier drivers
# and test fixtures used (`cptest-main-<i>`, `<i>`).
_WORKLOAD = re.compile(r"^(?:cptest-)?(?:(?:main|baseline)-)?(\d+)$")
_SCORING = re.compile(r"^cptest-score-(\d+)$")


def workload_rid(index: int) -> str:
    """The rid of the workload's request `index`."""
    return f"cptest-{index}"


def scoring_rid(index: int) -> str:
    """The rid of the teacher-forced scoring request for workload request `index`."""
    return f"cptest-score-{index}"


def workload_index(rid: str) -> int | None:
    """The index of the workload's request that `rid` names; None for any other request."""
    m = _WORKLOAD.match(rid)
    return int(m.group(1)) if m else None


def origin(rid: str) -> Origin:
    """Who sent the request that `rid` names."""
    if workload_index(rid) is not None:
        return "workload"
    if _SCORING.match(rid):
        return "scoring"
    return "engine"


def count_by_origin(rids: Iterable[str]) -> dict[Origin, int]:
    """How many of `rids` each origin sent (every origin present, zeros included)."""
    counts = Counter(origin(r) for r in rids)
    return {o: counts.get(o, 0) for o in ORIGINS}


def origin_note(counts: dict[Origin, int]) -> str:
    """`(4 workload, 4 scoring, 2 the engine's own)`, or, where no rid is cptest's (archives made
    before cptest named its requests), what the count then holds."""
    if counts["workload"] == 0 and counts["scoring"] == 0:
        return "(workload, scoring and the engine's own alike: no rid is cptest's)"
    workload, scoring, engine = counts["workload"], counts["scoring"], counts["engine"]
    return f"({workload} workload, {scoring} scoring, {engine} the engine's own)"
