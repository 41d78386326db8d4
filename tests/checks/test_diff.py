"""Specifications of cptest/checks/diff.py: evidence differences between two archives."""

from __future__ import annotations

from pathlib import Path

from cptest.checks.diff import diff
from tests.test_store import finished_run


def test_diff_of_identical_runs_is_empty(tmp_path: Path) -> None:
    assert diff(finished_run(tmp_path, "a"), finished_run(tmp_path, "b")).same


def test_diff_reports_outputs_and_capacity_and_respects_logprob_tolerance(tmp_path: Path) -> None:
    a = finished_run(tmp_path, "a")
    b = finished_run(tmp_path, "b", ids=(1, 3), lps=(-0.1, -0.25), rows=90)
    rep = diff(a, b, {"logprob": 0.1})
    what = {e.what: e.within for e in rep.entries}
    assert what == {
        "main request 0 output_ids": False,
        "main request 0 max logprob diff": True,
        "main rank 0 kv_pool rows": False,
        "main rank 0 max_total_num_tokens": False,
    }
    assert not rep.same
