"""checks: evidence in an archive -> verdicts. Pure: reads only the archive; no clock, network or processes.

Entry points: `check(archive_dir) -> ScenarioVerdict` and `check_loaded(archive) -> ScenarioVerdict`.
The scenario status is the worst of its checkers' (fail > unknown > pass); `ScenarioVerdict.exit_code`
is what `cptest check` returns (0 pass, 1 fail, 3 unknown). Results of the `reference` engine are
labelled `engine: reference` and never count as SGLang evidence.
"""

from __future__ import annotations

from pathlib import Path

from cptest.checks.load import Archive, load_archive
from cptest.checks.registry import CHECKERS, guarded
from cptest.checks.verdict import EXIT_CODES, ScenarioVerdict, Verdict, merge, scenario_verdict

__all__ = [
    "CHECKERS",
    "EXIT_CODES",
    "Archive",
    "ScenarioVerdict",
    "Verdict",
    "check",
    "check_loaded",
    "load_archive",
    "merge",
]


def check_loaded(archive: Archive) -> ScenarioVerdict:
    """Verdicts of every expectation of the plan, in plan order, and their worst."""
    plan = archive.plan
    verdicts = [guarded(archive, e) for e in plan.expectations]
    return scenario_verdict(plan.scenario, plan.main.engine, plan.main.release, verdicts)


def check(archive_dir: Path | str) -> ScenarioVerdict:
    """Load `archive_dir` and check it. Raises EvidenceError for an unreadable archive."""
    return check_loaded(load_archive(archive_dir))
