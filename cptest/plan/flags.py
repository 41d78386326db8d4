"""A scenario's pass-through flags against its SGLang release's flag table, each problem positioned
at the part of the `flag` statement it is about (the flag, or the value).

The language stage knows no release (docs/architecture.md §2), so the arity and value type of a
flag are judged here; `cptest validate`, `cptest lint` and `plan` (so `run` and `suite`, before
anything launches) all report these, as bad input: exit 2.
"""

from __future__ import annotations

from cptest.engines.sglang.argv import passthrough_problems
from cptest.engines.sglang.releases import get_release
from cptest.errors import PlanError, Problem
from cptest.scenario import Scenario


def flag_problems(scenario: Scenario) -> list[Problem]:
    """Every pass-through flag the scenario's release cannot take as written; empty for an engine
    without a flag table, and for an unknown release (`plan` names that at the engine statement)."""
    if scenario.engine.kind != "sglang":
        return []
    try:
        release = get_release(scenario.engine.release)
    except PlanError:
        return []
    serve, out = scenario.serve, []
    for i, f in enumerate(serve.extra_flags):
        for found in passthrough_problems(release, f[0], tuple(f[1:])):
            span = serve.field_spans.get(f"flag:{i}:{found.part}") or serve.where(f"flag:{i}")
            out.append(Problem(span, found.message))
    return out


__all__ = ["flag_problems"]
