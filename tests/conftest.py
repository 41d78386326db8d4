"""Session-wide test setup."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

FAST_PATHS = (
    "lang/", "plan/", "checks/", "contracts/", "engines/", "probe/",
    "report/test_render.py", "report/test_support.py", "report/test_text.py", "report/test_startup.py",
    "test_store.py", "test_evidence.py", "test_analyses.py", "test_tamper.py", "test_publish.py",
    "test_scenario.py", "test_topology.py", "test_verdict.py", "test_cli_interface.py",
    "test_console.py", "test_paths.py", "test_log.py", "test_layering.py", "test_target_plan.py",
    "test_doc_citations.py", "test_readme.py", "test_code_comments.py", "test_archived_includes.py",
    "test_rerun_plan_changes.py",
)
"""The fast tier (`pytest -m fast`): the language, the plan, the contracts and checks, the archive and
the CLI's interface, all in-process. Everything else (launchers, servers, end-to-end runs, the
browser, Docker, Slurm) is `slow`; so is a test in these paths marked `@pytest.mark.slow`."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        where = Path(str(item.path)).resolve().relative_to(TESTS).as_posix()
        fast = where.startswith(FAST_PATHS) and item.get_closest_marker("slow") is None
        item.add_marker(pytest.mark.fast if fast else pytest.mark.slow)


def pytest_configure(config: object) -> None:
    # Every `cptest run` a test starts (in process or as a child) keeps and reuses baselines in a
    # cache that lives as long as this session, never in the user's ~/.cache: a test must not be
    # answered from a baseline that an earlier session or another checkout stored.
    os.environ["CPTEST_BASELINE_CACHE"] = tempfile.mkdtemp(prefix="cptest-baselines-")
