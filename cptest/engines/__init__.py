"""engines: what cptest knows about the engines it launches, behind one protocol (`base.Engine`).

`engine_for(kind, release)` is the only place that tells SGLang from the reference engine; the
plan asks the engine it gets for argv, process titles and the facts contracts are judged with.
"""

from __future__ import annotations

from cptest.engines.protocol import ColocatedLaunch, Engine, ServerLaunch
from cptest.engines.reference import ReferenceEngine
from cptest.engines.sglang.engine import SGLangEngine
from cptest.engines.sglang.releases import get_release
from cptest.errors import PlanError


def engine_for(kind: str, release: str) -> Engine:
    """The engine a scenario names. Raises PlanError for an SGLang release cptest has no table for
    (naming the known ones and the closest)."""
    if kind == "reference":
        return ReferenceEngine()
    return SGLangEngine(get_release(release))


def colocated_launch(kind: str, release: str) -> ColocatedLaunch | None:
    """What the engine needs to co-locate ranks (`Engine.colocated`), or None for an SGLang release
    cptest has no table of: a run or an archive of such a release goes on without the engine's lines."""
    try:
        return engine_for(kind, release).colocated()
    except PlanError:
        return None


__all__ = ["ColocatedLaunch", "Engine", "ServerLaunch", "colocated_launch", "engine_for"]
