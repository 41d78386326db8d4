"""Specifications of cptest/checks/verdict.py, registry.py and the check entry points."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cptest.checks as checks
from cptest.checks import check, check_loaded, load_archive
from cptest.checks.registry import guarded
from cptest.checks.synthetic import make_plan, server_plan, write_archive
from cptest.checks.verdict import Verdict, apply_expectation, merge
from cptest.errors import EvidenceError
from cptest.evidence import Lifecycle
from cptest.plan.model import Expectation


def test_merge_keeps_the_worst() -> None:
    assert merge(["pass", "unknown", "pass"]) == "unknown"
    assert merge(["unknown", "fail", "pass"]) == "fail"
    assert merge([]) == "pass"


def test_merge_raises_on_a_status_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="'passed'"):
        merge(["pass", "passed"])


def test_expected_violation_observed_passes_and_keeps_its_figures() -> None:
    raw = Verdict(checker="rows", status="fail", figures={"position": 4}, reason="position 4 written twice")
    assert apply_expectation(raw, True, "a.cps:3:1") == Verdict(
        checker="rows",
        status="pass",
        figures={"position": 4},
        expect_violation=True,
        source="a.cps:3:1",
        reason="violation expected and observed: position 4 written twice",
    )


def test_expected_violation_that_does_not_happen_fails() -> None:
    raw = Verdict(checker="rows", status="pass", reason="ok")
    assert apply_expectation(raw, True, "").status == "fail"
    assert apply_expectation(raw.model_copy(update={"status": "unknown"}), True, "").status == "unknown"


def _archive(tmp_path: Path, expectations: list[Expectation], engine: str = "sglang"):
    plan = make_plan(server_plan(engine=engine), expectations)
    finished = [Lifecycle(event="ready", detail={"after_s": 1.0}), Lifecycle(event="shutdown_done")]
    write_archive(tmp_path, plan, runner={"main": finished})
    return load_archive(tmp_path)


def test_crashing_checker_is_unknown_with_the_exception_text(tmp_path: Path) -> None:
    def boom(archive, expect):
        raise KeyError("rows")

    v = guarded(_archive(tmp_path, []), Expectation(checker="x"), {"x": boom})
    assert (v.status, v.reason) == ("unknown", "checker crashed: KeyError: 'rows'")


def test_unknown_checker_name_is_unknown_with_a_suggestion(tmp_path: Path) -> None:
    v = guarded(_archive(tmp_path, []), Expectation(checker="capacty"))
    assert v.status == "unknown" and "did you mean 'capacity'?" in v.reason


def test_scenario_verdict_is_the_worst_and_counts_each_status(tmp_path: Path) -> None:
    sv = check_loaded(
        _archive(
            tmp_path,
            [
                Expectation(checker="launch", params={"accepted": True}),
                Expectation(checker="serving", params={"completed_min": 1}),
            ],
        )
    )
    assert (sv.status, sv.counts, sv.exit_code) == ("fail", {"pass": 1, "unknown": 0, "fail": 1}, 1)


def test_reference_engine_results_are_labelled_and_do_not_qualify_sglang(tmp_path: Path) -> None:
    sv = check_loaded(_archive(tmp_path, [], engine="reference"))
    assert sv.engine == "reference" and not sv.qualifies_sglang


def test_verdict_json_is_reproduced_exactly_from_the_evidence(tmp_path: Path) -> None:
    _archive(tmp_path, [Expectation(checker="launch", params={"accepted": True}, source="s.cps:2:3")])
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
