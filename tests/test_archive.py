"""Specifications of cptest/archive.py."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from cptest.archive import archive_dir, begin, collect_environment, diff, finish, verify
from cptest.checks import check
from cptest.checks.synthetic import make_plan, rank_id, server_plan, write_archive, write_jsonl
from cptest.evidence import Capacity, KvPool, Lifecycle, RequestResult
from cptest.plan_model import Expectation

ENV = {"python": "3.11", "reasons": {}}
EXPECT = [Expectation(checker="launch", params={"accepted": True}, source="s.cps:3:3")]


def _req(i: int, ids: list[int], lps: list[float]) -> RequestResult:
    return RequestResult(
        index=i,
        prompt_len=2,
        max_new_tokens=2,
        prompt_sha256="x",
        status="ok",
        output_ids=ids,
        output_logprobs=lps,
    )


def _run(tmp_path: Path, name: str = "a", *, ids=(1, 2), lps=(-0.1, -0.2), rows: int = 100) -> Path:
    plan = make_plan(server_plan(), EXPECT)
    d = tmp_path / name
    begin(d, "scenario synthetic {}\n", plan, environment=ENV)
    write_jsonl(
        d / "evidence/main/runner.jsonl",
        [Lifecycle(event="ready", detail={"after_s": 1.0}), _req(0, list(ids), list(lps))],
    )
    write_jsonl(
        d / "evidence/main/rank0.jsonl",
        [KvPool(rank=rank_id(0), rows=rows), Capacity(rank=rank_id(0), max_total_num_tokens=rows)],
    )
    (d / "logs/main-node0.log").write_text("ready\n")
    finish(d, check(d), plan)
    return d


def test_archive_dir_names_utc_time_and_short_hash() -> None:
    now = datetime(2025, 3, 4, 5, 6, 7, tzinfo=timezone(timedelta(hours=2)))
    assert archive_dir("results", "dcp4", "abcdef0123456789", now) == Path(
        "results/dcp4/20250304T030607Z-abcdef01"
    )


def test_archive_dir_refuses_a_naive_time() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        archive_dir("r", "s", "0" * 64, datetime(2025, 1, 1))


def test_begin_writes_plan_scenario_and_a_first_manifest(tmp_path: Path) -> None:
    d = tmp_path / "x"
    m = begin(d, "text", make_plan(server_plan()), environment=ENV, includes={"inc/defaults.cps": "d"})
    assert (m["phase"], sorted(m["files"])) == ("begun", ["inc/defaults.cps", "plan.json", "scenario.cps"])
    assert json.loads((d / "manifest.json").read_text())["environment"] == ENV


def test_finished_archive_verifies_clean_and_lists_every_file(tmp_path: Path) -> None:
    d = _run(tmp_path)
    assert verify(d) == []
    files = json.loads((d / "manifest.json").read_text())["files"]
    assert {
        "verdict.json",
        "report.md",
        "junit.xml",
        "evidence/main/rank0.jsonl",
        "logs/main-node0.log",
    } <= set(files)


def test_verify_names_a_changed_a_missing_and_an_extra_file(tmp_path: Path) -> None:
    d = _run(tmp_path)
    (d / "logs/main-node0.log").write_text("tampered\n")
    (d / "report.md").unlink()
    (d / "notes.txt").write_text("x")
    msgs = [p.message for p in verify(d)]
    assert msgs == [
        "logs/main-node0.log changed since the run",
        "notes.txt is not in the manifest (added after the run?)",
        "report.md is listed in the manifest but missing",
    ]


def test_verify_flags_an_unfinished_archive(tmp_path: Path) -> None:
    d = tmp_path / "x"
    begin(d, "t", make_plan(server_plan()), environment=ENV)
    assert "phase 'begun'" in verify(d)[0].message


def test_check_reproduces_verdict_json_exactly(tmp_path: Path) -> None:
    d = _run(tmp_path)
    assert check(d).to_json() == (d / "verdict.json").read_text()
    assert "timestamp" not in (d / "verdict.json").read_text()


def test_diff_of_identical_runs_is_empty(tmp_path: Path) -> None:
    assert diff(_run(tmp_path, "a"), _run(tmp_path, "b")).same


def test_diff_reports_outputs_and_capacity_and_respects_logprob_tolerance(tmp_path: Path) -> None:
    a = _run(tmp_path, "a")
    b = _run(tmp_path, "b", ids=(1, 3), lps=(-0.1, -0.25), rows=90)
    rep = diff(a, b, {"logprob": 0.1})
    what = {e.what: e.within for e in rep.entries}
    assert what == {
        "main request 0 output_ids": False,
        "main request 0 max logprob diff": True,
        "main rank 0 kv_pool rows": False,
        "main rank 0 max_total_num_tokens": False,
    }
    assert not rep.same


def test_collect_environment_gives_null_with_a_reason_for_absent_facts(tmp_path: Path) -> None:
    env = collect_environment(repo_root=tmp_path)
    assert env["cptest"] and env["python"]
    assert env["flake_lock_sha256"] is None and "no flake.lock" in env["reasons"]["flake_lock_sha256"]
    for key in ("torch", "cuda", "gpus", "driver", "sglang"):
        assert env[key] is not None or key in env["reasons"]


def test_write_archive_and_begin_share_one_layout(tmp_path: Path) -> None:
    plan = make_plan(server_plan(), EXPECT)
    finished_run = [Lifecycle(event="ready"), Lifecycle(event="shutdown_done")]
    write_archive(tmp_path / "w", plan, runner={"main": finished_run})
    # write_archive writes no manifest: judged as evidence, not as a finished archive.
    assert check(tmp_path / "w", require_finished=False).status == "pass"
    assert check(tmp_path / "w").status == "unknown"
