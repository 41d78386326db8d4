"""Specification of cptest/run/runner.py: run_plan end to end against the fake engine."""

from __future__ import annotations

import io
import json
import re
import signal
import sys
from pathlib import Path

import pytest

from cptest.errors import RunError
from cptest.evidence import Lifecycle, ProbeNote, ProcessSample, RequestResult, ServerInfo, read_records
from cptest.outline import Logger, TerminalSink
from cptest.plan.model import Colocation, FaultPlan, Plan, ServerPlan
from cptest.probe import runtime
from cptest.run import runner
from cptest.run.process import Interrupted, ProcessLauncher
from cptest.run.runner import RunOptions, run_plan
from cptest.run.supervisor import GpuQueryUnavailable, GpuReading

from conftest import alive, fake_server, free_port, make_plan, requests  # isort: skip


def no_gpu() -> GpuReading:
    raise GpuQueryUnavailable("nvidia-smi not found on PATH; GPU memory not sampled")


OPTS = RunOptions(sample_interval_s=0.2, gpu_query=no_gpu, ready_poll_s=0.1, gpu_settle_s=0.5)


def run(plan: Plan, tmp_path: Path, opts: RunOptions = OPTS) -> tuple[runner.RunOutcome, Path, str]:
    out = io.StringIO()
    outcome = run_plan(
        plan,
        tmp_path / "archive",
        launcher=ProcessLauncher(),
        log=Logger([TerminalSink(out)]),
        options=opts,
    )
    return outcome, tmp_path / "archive", out.getvalue()


def events(archive: Path, role: str = "main") -> list[Lifecycle]:
    return [
        r for r in read_records(archive / "evidence" / role / "runner.jsonl")[0] if isinstance(r, Lifecycle)
    ]


def every_pid(archive: Path, role: str = "main") -> list[int]:
    records = read_records(archive / "evidence" / role / "runner.jsonl")[0]
    return sorted(
        {
            p["pid"]
            for r in records
            if isinstance(r, ProcessSample)
            for p in r.procs
            if p.get("scope") == "tree"
        }
    )


def test_a_clean_run_records_the_whole_lifecycle_of_main_and_baseline(tmp_path: Path) -> None:
    main, base = free_port(), free_port()
    plan = make_plan(
        fake_server("main", main, "--token-delay", "0.002"), baseline=fake_server("baseline", base), n=6
    )
    outcome, archive, text = run(plan, tmp_path)
    assert outcome.main.ready and outcome.baseline is not None and outcome.baseline.ready
    assert outcome.main.workload.completed == 6 and outcome.baseline.workload.completed == 6
    assert outcome.main.all_exited and outcome.main.exits[0].status == 0
    # The runner writes evidence and logs only; the scenario and the plan are the store's phase 0.
    assert not (archive / "plan.json").exists() and not (archive / "scenario.cps").exists()
    assert "The server is fired up" in (archive / "logs" / "main-node0.log").read_text()
    assert (archive / "logs" / "baseline-node0.log").exists()
    for role in ("main", "baseline"):
        names = [e.event for e in events(archive, role)]
        assert names == [
            "launched",
            "ready",
            "workload_done",
            "shutdown_begin",
            "signal",
            "exited",
            "shutdown_done",
            "teardown",
        ]
        records = read_records(archive / "evidence" / role / "runner.jsonl")[0]
        assert len([r for r in records if isinstance(r, RequestResult) and r.status == "ok"]) == 6
        assert [r for r in records if isinstance(r, ServerInfo)][0].info["tp_size"] == 2
        phases = [r.phase for r in records if isinstance(r, ProcessSample)]
        assert phases[0] == "before" and "running" in phases and phases[-1] == "after"
        assert any(isinstance(r, ProbeNote) and "nvidia-smi" in r.message for r in records)
    # CPTEST_PROBE_DIR reached the engine: its rank file is in the role's evidence folder
    steps = (archive / "evidence" / "main" / "rank0.jsonl").read_text().splitlines()
    assert len(steps) == 6 * 4
    log = [json.loads(x) for x in (archive / "evidence" / "cptest.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "step_end" and e["title"].startswith("main workload") for e in log)
    assert "(finished: shutting down main server" in text
    exited = next(e for e in events(archive) if e.event == "exited")
    assert exited.detail["status"] == 0 and exited.detail["after_s_since_signal"] >= 0
    assert alive(every_pid(archive)) == [] and alive(every_pid(archive, "baseline")) == []


def test_a_rejected_launch_is_a_recorded_result_and_skips_the_baseline(tmp_path: Path) -> None:
    plan = make_plan(
        fake_server("main", free_port(), "--reject", "dcp does not support prefill cp"),
        baseline=fake_server("baseline", free_port()),
    )
    outcome, archive, _ = run(plan, tmp_path)
    assert not outcome.main.ready and outcome.baseline is None
    assert outcome.main.launch_failed["status"] == 1
    assert "does not support prefill cp" in outcome.main.launch_failed["reason"]
    failed = next(e for e in events(archive) if e.event == "launch_failed")
    assert failed.detail["status"] == 1 and "does not support" in failed.detail["reason"]
    assert outcome.skipped == ["baseline skipped: the main server did not become ready"]
    assert not (archive / "evidence" / "baseline" / "runner.jsonl").exists()


def test_a_server_that_never_becomes_ready_times_out(tmp_path: Path) -> None:
    plan = make_plan(fake_server("main", free_port(), "--ready-after", "100", ready_timeout_s=1.0))
    outcome, archive, _ = run(plan, tmp_path)
    names = [e.event for e in events(archive)]
    assert names[:3] == ["launched", "timeout", "launch_failed"]
    assert next(e for e in events(archive) if e.event == "timeout").detail == {"what": "ready"}
    assert outcome.main.launch_failed["status"] is None
    assert alive(every_pid(archive)) == []


def test_killing_a_rank_mid_workload_fails_the_rest_and_leaves_nothing(tmp_path: Path) -> None:
    fault = FaultPlan(
        index=0, action="kill", target="rank", rank=1, process_title="sglang::scheduler_TP1", after_requests=2
    )
    plan = make_plan(
        fake_server("main", free_port(), "--token-delay", "0.02", shutdown_timeout_s=10),
        n=8,
        concurrency=1,
        faults=[fault],
    )
    outcome, archive, _ = run(plan, tmp_path)
    w = outcome.main.workload
    assert w.completed in (2, 3) and w.completed + w.failed == 8  # the in-flight one may still finish
    evs = events(archive)
    f = next(e for e in evs if e.event == "fault")
    assert f.detail["trigger"] == "after 2 requests" and f.detail["title"] == "sglang::scheduler_TP1"
    exited = next(e for e in evs if e.event == "exited")
    assert exited.detail["status"] == -signal.SIGKILL  # it killed itself after its rank, as SGLang does
    # The shutdown signals only a server still alive when it begins. On a loaded host the server's own
    # SIGKILL can come after the workload's last failed request: then it was signalled, and says so.
    signalled = [e for e in evs if e.event == "signal" and e.t > f.t]
    assert (exited.detail["after_s_since_signal"] is None) == (not signalled)
    assert outcome.main.all_exited is True
    assert alive(every_pid(archive)) == []


def test_a_fault_counted_in_decode_steps_tightens_the_main_probes_copy_bound_alone(tmp_path: Path) -> None:
    """The injector counts decode steps in rank 0's file: the main server's probe is told to write
    them within IDLE_S (`faults.probe_env`); the baseline, which faces no fault, keeps its default."""
    fault = FaultPlan(index=0, action="sigterm", target="server", after_decode_steps=100_000)
    plan = make_plan(fake_server("main", free_port()), baseline=fake_server("baseline", free_port()),
                     n=2, faults=[fault])
    _, archive, _ = run(plan, tmp_path)
    assert f"probe copy bound {runtime.IDLE_S!r} s" in (archive / "logs" / "main-node0.log").read_text()
    assert "probe copy bound" not in (archive / "logs" / "baseline-node0.log").read_text()


def test_a_server_ignoring_sigterm_is_recorded_as_a_shutdown_timeout_and_killed(tmp_path: Path) -> None:
    plan = make_plan(fake_server("main", free_port(), "--ignore-sigterm", shutdown_timeout_s=0.5), n=1)
    outcome, archive, _ = run(plan, tmp_path)
    assert outcome.main.all_exited is False
    names = [e.event for e in events(archive)]
    assert names[-3:] == ["timeout", "shutdown_done", "teardown"]
    done = next(e for e in events(archive) if e.event == "shutdown_done")
    assert done.detail["all_exited"] is False
    teardown = next(e for e in events(archive) if e.event == "teardown")
    assert teardown.detail["leftover_pids"] == [] and teardown.detail["killed"]
    assert outcome.main.exits[0].status == -signal.SIGKILL
    assert alive(every_pid(archive)) == []


def test_sigterm_to_cptest_records_interrupted_tears_down_and_exits_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object) -> None:
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(runner, "_record_server_info", interrupted)
    plan = make_plan(fake_server("main", free_port()), baseline=fake_server("baseline", free_port()))
    with pytest.raises(RunError) as info:
        run(plan, tmp_path)
    assert info.value.exit_code == 3 and "SIGTERM" in str(info.value)
    archive = tmp_path / "archive"
    evs = events(archive)
    assert [e.event for e in evs] == ["launched", "ready", "interrupted", "teardown"]
    assert evs[2].detail == {"reason": "SIGTERM"}
    assert evs[3].detail["leftover_pids"] == []
    assert alive(every_pid(archive)) == []


def test_ctrl_c_is_reraised_as_keyboard_interrupt_after_teardown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def ctrl_c(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "_record_server_info", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        run(make_plan(fake_server("main", free_port())), tmp_path)
    evs = events(tmp_path / "archive")
    assert evs[-2].detail == {"reason": "SIGINT"} and evs[-1].event == "teardown"


def test_the_engine_env_carries_the_probe_dir_only_when_the_plan_probes(tmp_path: Path) -> None:
    plan = make_plan(fake_server("main", free_port(), probe=False), reqs=requests(1))
    run(plan, tmp_path)
    assert not (tmp_path / "archive" / "evidence" / "main" / "rank0.jsonl").exists()


def _colocated(server: ServerPlan, follower_argv: list[str]) -> ServerPlan:
    """`server` with a co-located follower node 1 running `follower_argv`."""
    follower = server.nodes[0].model_copy(update={"node_rank": 1, "argv": follower_argv,
                                                  "port": server.nodes[0].port + 1})
    colocation = Colocation(rank_gpus=[0, 0], ranks_per_gpu=2, transport="sockets", env={},
                            node_env=[{}, {}], flags=[], mem_fraction=None, mem_fraction_basis="none")
    return server.model_copy(update={"nodes": [server.nodes[0], follower], "colocation": colocation})


def test_a_colocated_node_0_starts_after_its_followers_checked_their_ports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # On one host node 0 binds the ports an attention-DP follower checks: the follower goes first.
    monkeypatch.setattr(runner, "_ports_checked", lambda server: re.compile(r"ports checked"))
    follower = [sys.executable, "-c", "import time; time.sleep(1.5); print('ports checked', flush=True); "
                "time.sleep(600)"]
    plan = make_plan(_colocated(fake_server("main", free_port()), follower), n=2)
    outcome, archive, _ = run(plan, tmp_path)
    launched = [e for e in events(archive) if e.event == "launched"]
    assert [e.detail["node"] for e in launched] == [1, 0]
    assert launched[1].t - launched[0].t >= 1.4  # node 0 waited for the follower's line
    assert outcome.main.ready and outcome.main.workload.completed == 2
    assert alive(every_pid(archive)) == []


def test_sglangs_colocated_servers_gate_node_0_on_the_followers_port_check() -> None:
    server = _colocated(fake_server("main", 30000), ["python3"]).model_copy(
        update={"engine": "sglang", "release": "0.5.17"})
    line = runner._ports_checked(server)
    assert line is not None and line.search("[2026-12-05 04:23:31] server_args=ServerArgs(model_path='m')")
    assert runner._ports_checked(server.model_copy(update={"colocation": None})) is None
    assert runner._ports_checked(server.model_copy(update={"engine": "reference", "release": "fake"})) is None
