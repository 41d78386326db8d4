"""engines: what cptest knows about the engines it launches, behind one protocol (`base.Engine`).

`engine_for(kind, release)` is the only place that tells SGLang from the reference engine; the
plan asks the engine it gets for argv, process titles and the facts contracts are judged with.
"""

from __future__ import annotations

from cptest.engines.protocol import Engine, ServerLaunch
from cptest.engines.reference import ReferenceEngine
from cptest.engines.sglang.engine import SGLangEngine
from cptest.engines.sglang.releases import get_release


def engine_for(kind: str, release: str) -> Engine:
    """The engine a scenario names. Raises PlanError for an SGLang release cptest has no table for
    (naming the known ones and the closest)."""
    if kind == "reference":
        return ReferenceEngine()
    return SGLangEngine(get_release(release))


__all__ = ["Engine", "ServerLaunch", "engine_for"]
