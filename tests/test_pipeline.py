"""Specifications of cptest/pipeline.py: a whole run driven without the CLI, against the fake engine."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cptest import pipeline, store
from cptest.contracts import LaunchParams, ServingParams
from cptest.errors import RunError, ScenarioError
from cptest.outline import Logger, TerminalSink
from cptest.plan.model import Plan
from cptest.run.process import ProcessLauncher
from cptest.run.runner import RunOptions
from cptest.run.supervisor import GpuQueryUnavailable, GpuReading
from tests.run.conftest import fake_server, free_port, make_plan

ENV = {"python": "3.11", "reasons": {}}


def no_gpu() -> GpuReading:
    raise GpuQueryUnavailable("no GPU in this test")


OPTS = RunOptions(sample_interval_s=0.2, gpu_query=no_gpu, ready_poll_s=0.1, gpu_settle_s=0.5)


def fake_plan(*args: str) -> Plan:
    plan = make_plan(fake_server("main", free_port(), *args), n=4)
    return plan.model_copy(update={"expectations": [
        LaunchParams(accepted=True, source="fake.cps:3:5"),
        ServingParams(completed_min=4, of=4, source="fake.cps:4:5"),
    ]})


def run(plan: Plan, out: Path) -> pipeline.Outcome:
    log = Logger([TerminalSink(io.StringIO())])
    return pipeline.run_scenario(plan, out, ProcessLauncher(), scenario_text="scenario fake {}\n", log=log,
                                 environment=ENV, run_options=OPTS)


def test_a_run_is_archived_checked_and_finished_without_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "results" / "fake" / "run"
    outcome = run(fake_plan(), out)
    assert (outcome.exit_code, outcome.verdict.status) == (0, "pass")
    assert [v.checker for v in outcome.verdict.verdicts] == ["launch", "serving"]
    assert store.verify(out) == []
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["phase"] == "finished" and manifest["environment"]["python"] == "3.11"
    assert (out / "scenario.cps").read_text() == "scenario fake {}\n"
    # Re-checking the archive gives the verdict the run wrote, byte for byte.
    recheck = pipeline.check_archive(out, integrity=False)
    assert not recheck.differs and recheck.exit_code == 0


def test_a_server_that_dies_during_launch_is_a_finished_archive_with_a_failed_launch(tmp_path: Path) -> None:
    out = tmp_path / "run"
    outcome = run(fake_plan("--reject", "no such model"), out)
    assert outcome.verdict.status == "fail" and outcome.exit_code == 1
    assert outcome.verdict.verdicts[0].status == "fail"
    assert store.is_finished(store.Layout(out))


def test_check_archive_says_when_the_stored_verdict_differs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run(fake_plan(), out)
    (out / "verdict.json").write_text("{}\n")
    recheck = pipeline.check_archive(out, integrity=False)
    assert recheck.differs and recheck.exit_code == 1 and recheck.against == out / "verdict.json"
    # --write never re-seals an edited archive: it is refused, and nothing is written.
    with pytest.raises(store.IntegrityError, match="verdict.json changed since the run"):
        pipeline.check_archive(out, write=True, integrity=False)
    assert not (out / "analyses").exists() and (out / "verdict.json").read_text() == "{}\n"
    assert [p.message for p in store.verify(out)] == ["verdict.json changed since the run"]


def test_check_archive_checks_integrity_unless_told_not_to(tmp_path: Path) -> None:
    # A library caller gets what `cptest check` does: the fake plan's scenario ("scenario fake {}")
    # compiles to no such plan, so the default refuses it; only an explicit integrity=False judges it.
    out = tmp_path / "run"
    run(fake_plan(), out)
    with pytest.raises(store.IntegrityError) as err:
        pipeline.check_archive(out)
    assert err.value.exit_code == 3 and "integrity check failed" in err.value.render()
    assert pipeline.check_archive(out, integrity=False).exit_code == 0


def test_a_rerun_plans_from_the_archived_scenario_and_an_archive_without_one_is_bad_input(
        tmp_path: Path) -> None:
    # The fake plan's archive holds no real scenario: a rerun has nothing to plan from (exit 2),
    # and nothing is launched or archived. tests/test_rerun_portable.py reruns a real one.
    first = tmp_path / "first"
    run(fake_plan(), first)
    log = Logger([TerminalSink(io.StringIO())])
    with pytest.raises(ScenarioError) as err:
        pipeline.rerun(first, tmp_path / "results", ProcessLauncher(), log=log, now=datetime.now(UTC),
                       environment=ENV, run_options=OPTS)
    assert err.value.exit_code == 2 and "scenario.cps:1:1" in err.value.render()
    assert not (tmp_path / "results").exists()


def test_an_unreadable_scenario_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        pipeline.prepare(tmp_path / "missing.cps", gpu_present=False)


def test_include_names_keep_the_scenario_resolvable_in_the_archive(tmp_path: Path) -> None:
    # Under their own folder (D45), by their path relative to the scenario, `..` spelled `@up`.
    scenario = tmp_path / "suite" / "a.cps"
    inside = tmp_path / "suite" / "defaults" / "tiny.cps"
    assert pipeline.include_name(inside, scenario) == "includes/defaults/tiny.cps"
    assert pipeline.include_name(tmp_path / "elsewhere" / "x.cps", scenario) == "includes/@up/elsewhere/x.cps"
    assert pipeline.include_name(tmp_path / "suite" / "logs" / "main-node0.log", scenario) == (
        "includes/logs/main-node0.log")


PCP_DCP = """cptest 1
scenario pcp_dcp {
  engine sglang "0.5.17"
  model synthetic qwen3 { layers 2 hidden 64 heads 4 kv_heads 2 head_dim 16 vocab 128 intermediate 128 }
  topology { gpus 2 tp 2 dcp 2 attn_cp 2 cp_strategy zigzag }
  baseline { tp 1 }
  workload { requests 2 concurrency 1 prompt_tokens 16 output_tokens 2 }
  expect { generation tokens_agree >= 0.9 vs baseline }
}
"""


def test_a_finding_of_an_inferred_rule_warns_and_the_run_goes_ahead(tmp_path: Path) -> None:
    # 0.5.23 splits every architecture's prefill; Llama's head shards then differ across CP partners.
    path = tmp_path / "llama_zigzag.cps"
    path.write_text(PCP_DCP.replace("qwen3", "llama").replace("dcp 2 attn_cp 2", "attn_cp 2")
                    .replace("scenario pcp_dcp", "scenario llama_zigzag").replace("kv_heads 2", "kv_heads 1")
                    .replace('sglang "0.5.17"', 'sglang "0.5.23"'))
    prepared = pipeline.prepare(path, gpu_present=True)
    assert [(f.code, f.blocks) for f in prepared.findings] == [("llama_pcp_silent", False)]
    pipeline.runnable(prepared, gpu_present=True, ignore_lint=False)  # a hypothesis: running tests it


def test_check_before_spending_stops_on_lint_findings_and_on_sglang_without_a_gpu(tmp_path: Path) -> None:
    path = tmp_path / "pcp_dcp.cps"
    path.write_text(PCP_DCP)
    prepared = pipeline.prepare(path, gpu_present=True)
    assert prepared.engine == "sglang" and [f.code for f in prepared.findings][:1] == ["pcp_with_dcp"]
    with pytest.raises(pipeline.LintFindings) as err:
        pipeline.runnable(prepared, gpu_present=True, ignore_lint=False)
    assert err.value.exit_code == 1
    pipeline.runnable(prepared, gpu_present=True, ignore_lint=True)  # the user's explicit choice
    forced = pipeline.prepare(path, engine="sglang", gpu_present=False)
    with pytest.raises(RunError, match="no GPU here") as err:
        pipeline.runnable(forced, gpu_present=False, ignore_lint=True)
    assert err.value.exit_code == 3


def test_without_a_gpu_an_sglang_scenario_is_planned_for_the_reference_engine(tmp_path: Path) -> None:
    path = tmp_path / "pcp_dcp.cps"
    path.write_text(PCP_DCP)
    prepared = pipeline.prepare(path, gpu_present=False)
    assert (prepared.engine, prepared.plan.main.engine, prepared.findings) == ("reference", "reference", ())
    assert prepared.notes and "reference engine" in prepared.notes[0]
