"""Specifications of cptest/verdict.py: merging verdicts and declared violations."""

from __future__ import annotations

import json

import pytest

from cptest.verdict import ScenarioVerdict, Verdict, apply_expectation, merge, scenario_verdict


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


def test_a_physical_verdict_json_has_no_placement_and_a_colocated_one_says_so() -> None:
    # Archives made before placements existed hold no `placement`: their verdict.json must re-derive
    # byte for byte, so the physical default is left out.
    v = scenario_verdict("dcp2", "sglang", "0.5.17", [Verdict(checker="rows", status="pass")])
    assert "placement" not in json.loads(v.to_json())
    colocated = scenario_verdict("dcp2", "sglang", "0.5.17", v.verdicts, placement="colocated")
    assert json.loads(colocated.to_json())["placement"] == "colocated"
    assert ScenarioVerdict.from_json(colocated.to_json()) == colocated
    assert ScenarioVerdict.from_json(v.to_json()).placement == "physical"
