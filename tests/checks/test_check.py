"""Specifications of cptest/checks: the guard around each checker, the scenario verdict, loading."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

import cptest.checks as checks
from cptest.checks import check, check_loaded, guarded, load_archive
from cptest.contracts import CONTRACTS, CapacityParams, Expectation, LaunchParams, ServingParams
from cptest.errors import EvidenceError
from cptest.evidence import Lifecycle
from cptest.plan.upgrade import PLAN_VERSION
from cptest.testing.archives import PINNED_LOG_PATTERNS, colocate, make_plan, server_plan, write_archive


def _archive(tmp_path: Path, expectations: list[Expectation], engine: str = "sglang"):
    plan = make_plan(server_plan(engine=engine), expectations)
    finished = [Lifecycle(event="ready", detail={"after_s": 1.0}), Lifecycle(event="shutdown_done")]
    write_archive(tmp_path, plan, runner={"main": finished})
    return load_archive(tmp_path)


def test_crashing_checker_is_unknown_with_the_exception_text(tmp_path: Path, monkeypatch) -> None:
    def boom(evidence, expect):
        raise KeyError("rows")

    monkeypatch.setitem(CONTRACTS, "launch", dataclasses.replace(CONTRACTS["launch"], check=boom))
    v = guarded(_archive(tmp_path, []).evidence, LaunchParams(source="s.cps:2:3"))
    assert (v.status, v.reason, v.checker) == ("unknown", "checker crashed: KeyError: 'rows'", "launch")


def test_an_unknown_contract_in_a_plan_is_an_evidence_error_with_a_suggestion(tmp_path: Path) -> None:
    _archive(tmp_path, [LaunchParams()])
    plan = json.loads((tmp_path / "plan.json").read_text())
    plan["expectations"][0]["kind"] = "capacty"
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(EvidenceError, match="bad plan at expectations.0") as err:
        load_archive(tmp_path)
    assert err.value.problems[0].hint == "did you mean 'capacity'?"


def test_a_version_1_plan_is_upgraded_when_read(tmp_path: Path) -> None:
    # Archives made before the expectations were typed keep being checkable.
    _archive(tmp_path, [])
    plan = json.loads((tmp_path / "plan.json").read_text())
    plan["plan_version"] = 1
    plan["expectations"] = [
        {"checker": "capacity", "params": {"multiplier": 2.0, "tolerance": 0.0}, "expect_violation": True,
         "source": "s.cps:9:5"},
        {"checker": "launch", "params": {"accepted": True, "match": None}, "expect_violation": False,
         "source": ""},
    ]
    plan["main"]["geometry"] = [dict(g, moe_dp_rank=0, moe_ep_rank=0) for g in plan["main"]["geometry"]]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    loaded = load_archive(tmp_path).plan
    capacity, launch = loaded.expectations
    assert isinstance(capacity, CapacityParams) and capacity.multiplier == 2.0 and capacity.expect_violation
    assert capacity.log_patterns.source == "sglang 0.5.17 release table (added when reading a version 1 plan)"
    assert capacity.log_patterns.kv_allocated == PINNED_LOG_PATTERNS.kv_allocated
    assert isinstance(launch, LaunchParams) and launch.accepted and loaded.plan_version == PLAN_VERSION


def test_scenario_verdict_is_the_worst_and_counts_each_status(tmp_path: Path) -> None:
    sv = check_loaded(
        _archive(
            tmp_path,
            [
                LaunchParams(accepted=True),
                ServingParams(completed_min=1),
            ],
        )
    )
    assert (sv.status, sv.counts, sv.exit_code) == ("fail", {"pass": 1, "unknown": 0, "fail": 1}, 1)


def test_reference_engine_results_are_labelled_and_do_not_qualify_sglang(tmp_path: Path) -> None:
    sv = check_loaded(_archive(tmp_path, [], engine="reference"))
    assert sv.engine == "reference" and not sv.qualifies_sglang


def test_a_colocated_archive_is_labelled_colocated_and_a_physical_one_is_not(tmp_path: Path) -> None:
    finished = [Lifecycle(event="ready", detail={"after_s": 1.0}), Lifecycle(event="shutdown_done")]
    for name, main in (("physical", server_plan(world=2, dcp=2)),
                       ("colocated", colocate(server_plan(world=2, dcp=2)))):
        write_archive(tmp_path / name, make_plan(main, [LaunchParams()]), runner={"main": finished})
        sv = check(tmp_path / name)
        assert sv.placement == name
        assert ('"placement": "colocated"' in sv.to_json()) == (name == "colocated")


def test_verdict_json_is_reproduced_exactly_from_the_evidence(tmp_path: Path) -> None:
    _archive(tmp_path, [LaunchParams(accepted=True, source="s.cps:2:3")])
    first = check(tmp_path).to_json()
    assert check(tmp_path).to_json() == first
    assert checks.ScenarioVerdict.from_json(first).to_json() == first


def test_malformed_evidence_line_is_an_evidence_error_naming_the_line(tmp_path: Path) -> None:
    plan = make_plan(server_plan(), [])
    write_archive(
        tmp_path,
        plan,
        runner={"main": ['{"kind": "lifecycle", "event": 3}', '{"kind": "lifecycle", "event": "x"}']},
    )
    with pytest.raises(EvidenceError, match=r"runner.jsonl:1:1: bad evidence record at lifecycle.event"):
        load_archive(tmp_path)


def test_missing_plan_is_an_evidence_error(tmp_path: Path) -> None:
    with pytest.raises(EvidenceError, match="no plan.json"):
        load_archive(tmp_path)


def test_newer_evidence_schema_is_refused(tmp_path: Path) -> None:
    plan = make_plan(server_plan(), [])
    write_archive(tmp_path, plan, runner={"main": ['{"v": 9, "kind": "lifecycle", "event": "x"}', ""]})
    with pytest.raises(EvidenceError, match="newer than this cptest"):
        load_archive(tmp_path)


def test_checks_import_no_clock_processes_or_network() -> None:
    banned = {"time", "subprocess", "docker", "socket", "httpx", "cptest.run", "multiprocessing"}
    for path in Path(checks.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in names if m.split(".")[0] in banned or m.startswith("cptest.run")}, path.name


def test_a_colocated_followers_log_is_judged_up_to_where_its_ranks_ended() -> None:
    from cptest.checks.load import split_follower_log
    from cptest.engines import engine_for

    ended = engine_for("sglang", "0.5.17").colocated().follower_ranks_ended
    assert ended is not None
    log = ("[t] Registered forward hook\n"
           "[t] Scheduler or DataParallelController 10177 terminated with 0\n"
           "[t] ERROR:    Traceback (most recent call last):\n"
           "AttributeError: 'NoneType' object has no attribute 'server_args'\n")
    kept, tail = split_follower_log(log, ended)
    assert kept.endswith("terminated with 0\n") and "Traceback" not in kept and tail == 2
    # A follower whose ranks never ended (killed, or still running) is judged whole.
    running = log.replace("terminated", "ran")
    assert split_follower_log(running, ended) == (running, 0)
    assert engine_for("reference", "builtin").colocated().follower_ranks_ended is None
