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


def test_sglangs_own_wait_for_a_busy_port_is_unknown(tmp_path: Path) -> None:
    died = fake_server("main", free_port(), "--reject",
                       "ValueError: port_base at 30051 is not available in 30 seconds. port_base is used by "
                       "a process already.")
    got = judged(with_expectations(make_plan(died), True), tmp_path)
    assert got["_status"][0] == "unknown"
    assert got["launch"][0] == "unknown" and "(port_in_use)" in got["launch"][1]
    assert "port_base at 30051 is not available" in got["launch"][1]


def test_an_engine_that_refuses_its_launch_for_its_own_reasons_still_fails(tmp_path: Path) -> None:
    refused = fake_server("main", free_port(), "--reject", "dcp does not support prefill cp")
    got = judged(with_expectations(make_plan(refused), True), tmp_path)
    assert got["launch"][0] == "fail" and "run" not in got


def test_an_import_error_that_ends_the_launch_is_the_installs_gap_not_the_engines(tmp_path: Path) -> None:
    ended = fake_server("main", free_port(), "--reject",
                        "kernel import\nImportError: FlashAttention-4 CUTE is not available.")
    got = judged(with_expectations(make_plan(ended), True), tmp_path)
    assert got["_status"][0] == "unknown"
    assert got["launch"][0] == "unknown" and "(package_missing)" in got["launch"][1]
    assert "FlashAttention-4 CUTE is not available" in got["launch"][1]


@pytest.mark.parametrize("log, cause", [
    # SGLang's start-up notes an optional model module it skips: not what ended the launch.
    ("Ignore import error when loading sglang.srt.models.inkling: No module named 'helion'\n"
     "RuntimeError: CUDA error: invalid argument\n", None),
    # An import error handled on the way to another exception is that exception's failure.
    ("ModuleNotFoundError: No module named 'cutlass'\n\nDuring handling of the above exception\n"
     "ValueError: head_dim 80 is not supported\n", None),
    # A qualified exception name counts as much as a builtin one.
    ("ImportError: cannot import name 'x'\n\nDuring handling of the above exception\n"
     "torch.OutOfMemoryError: CUDA out of memory.\n", None),
    ("ModuleNotFoundError: No module named 'cutlass'\n\nDuring handling of the above exception\n"
     "ImportError: FlashAttention-4 CUTE is not available.\n\nReceived sigquit from a child process.\n",
     "ImportError: FlashAttention-4 CUTE is not available."),
])
def test_only_an_import_error_printed_last_is_a_missing_package(log: str, cause: str | None) -> None:
    from cptest.checks.infrastructure import SIGNATURES

    pattern = dict(SIGNATURES)["package_missing"]
    found = pattern.search(log)
    assert (found[0] if found else None) == cause
