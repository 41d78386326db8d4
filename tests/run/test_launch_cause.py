"""A launch that fails for an infrastructure reason preflight could not see (the port taken after
its check, say) is judged unknown with the cause, not as the engine's failure (checks.infrastructure)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from cptest import pipeline
from cptest.contracts.launch import LaunchParams
from cptest.contracts.serving import ServingParams
from cptest.outline import Logger, TerminalSink
from cptest.plan.model import Plan
from cptest.run.process import ProcessLauncher
from cptest.run.runner import RunOptions

from conftest import fake_server, free_port, make_plan  # isort: skip
from test_runner import OPTS  # isort: skip


def judged(plan: Plan, tmp_path: Path) -> dict[str, tuple[str, str]]:
    outcome = pipeline.run_scenario(plan, tmp_path / "archive", ProcessLauncher(), scenario_text="",
                                    log=Logger([TerminalSink(io.StringIO())]),
                                    run_options=RunOptions(**{**OPTS.__dict__}))
    return {v.checker: (v.status, v.reason) for v in outcome.verdict.verdicts} | {
        "_status": (outcome.verdict.status, "")}


def with_expectations(plan: Plan, accepted: bool) -> Plan:
    return plan.model_copy(update={"expectations": [LaunchParams(accepted=accepted),
                                                    ServingParams(completed_min=6, of=6)]})


@pytest.mark.parametrize("accepted", [True, False])
def test_a_port_taken_after_preflight_is_unknown_not_a_launch_failure_or_a_rejection(
        tmp_path: Path, accepted: bool) -> None:
    died = fake_server("main", free_port(), "--reject", "OSError: [Errno 98] Address already in use")
    got = judged(with_expectations(make_plan(died), accepted), tmp_path)
    assert got["_status"][0] == "unknown"
    assert got["launch"][0] == "unknown" and "(port_in_use)" in got["launch"][1]
    assert got["serving"][0] == "unknown"  # never sent: the run's absence, not the engine's failure
    assert got["run"][0] == "unknown" and "Address already in use" in got["run"][1]


def test_an_engine_that_refuses_its_launch_for_its_own_reasons_still_fails(tmp_path: Path) -> None:
    refused = fake_server("main", free_port(), "--reject", "dcp does not support prefill cp")
    got = judged(with_expectations(make_plan(refused), True), tmp_path)
    assert got["launch"][0] == "fail" and "run" not in got
