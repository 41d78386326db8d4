"""The checker registry: contract family name -> `check(archive, expectation) -> Verdict`.

Every checker shares that signature (style.md rule 6) and runs inside `guarded`, which turns an
exception into `unknown` carrying the exception text: a crashing checker never reads as pass, and
never hides the other checkers' verdicts.
"""

from __future__ import annotations

from collections.abc import Callable

from cptest.checks import capacity, generation, graph, launch, log, rows, serving, shutdown
from cptest.checks.load import Archive
from cptest.checks.verdict import Verdict, apply_expectation, unknown
from cptest.errors import did_you_mean, one_of
from cptest.plan.model import Expectation

Checker = Callable[[Archive, Expectation], Verdict]

CHECKERS: dict[str, Checker] = {
    "launch": launch.check,
    "rows": rows.check,
    "capacity": capacity.check,
    "generation": generation.check,
    "graph": graph.check,
    "serving": serving.check,
    "shutdown": shutdown.check,
    "log": log.check,
}


def guarded(archive: Archive, expect: Expectation, checkers: dict[str, Checker] | None = None) -> Verdict:
    """Run the checker `expect` names and apply `expect_violation`; never raises."""
    table = CHECKERS if checkers is None else checkers
    fn = table.get(expect.checker)
    if fn is None:
        near = did_you_mean(expect.checker, table)
        raw = unknown(
            expect.checker,
            f"no checker named {expect.checker!r} (known: {one_of(sorted(table))}"
            + (f"; did you mean {near!r}?)" if near else ")"),
        )
    else:
        try:
            raw = fn(archive, expect)
            if raw.checker != expect.checker:
                raw = raw.model_copy(update={"checker": expect.checker})
        except Exception as e:  # the guard is the point: a crash is unknown, with its text
            raw = unknown(expect.checker, f"checker crashed: {type(e).__name__}: {e}", error=type(e).__name__)
    return apply_expectation(raw, expect.expect_violation, expect.source)
