"""Specifications of cptest/contracts/{launch,serving,shutdown,graph,log}.py."""

from __future__ import annotations

from pathlib import Path

from cptest.checks import check_loaded, load_archive
from cptest.contracts import Expectation, GraphParams, LaunchParams, LogParams, ServingParams, ShutdownParams
from cptest.evidence import GpuProcessUse, GpuSample, Graph, Lifecycle, ProcessSample, RequestResult, Step
from cptest.plan.model import ServerPlan
from cptest.testing.archives import colocate, make_plan, rank_id, server_plan, write_archive
from cptest.verdict import Verdict


def _one(
    tmp_path: Path,
    expect: Expectation,
    runner: list,
    *,
    ranks=None,
    logs=None,
    world: int = 1,
    requests: int = 2,
    main: ServerPlan | None = None,
) -> Verdict:
    plan = make_plan(main or server_plan(world=world), [expect], requests=requests)
    events = {r.event for r in runner if isinstance(r, Lifecycle)}
    if not events & {"interrupted", "shutdown_done", "launch_failed"}:
        runner = [*runner, Lifecycle(event="shutdown_done", detail={"all_exited": True})]  # a finished run
    write_archive(tmp_path, plan, ranks={"main": ranks or {}}, runner={"main": runner}, logs=logs)
    return check_loaded(load_archive(tmp_path)).verdicts[0]


def test_a_run_killed_before_it_finished_is_unknown_not_a_hang(tmp_path: Path) -> None:
    plan = make_plan(server_plan(), [ServingParams(completed_min=2)],
                     requests=2)  # fmt: skip
    write_archive(tmp_path, plan, runner={"main": [Lifecycle(event="ready", detail={"after_s": 1.0})]})
    sv = check_loaded(load_archive(tmp_path))
    assert sv.status == "unknown"
    assert [(v.checker, v.status) for v in sv.verdicts] == [("serving", "unknown"), ("run", "unknown")]
    assert sv.verdicts[0].reason.startswith("run unfinished: ")
    assert "no shutdown record" in sv.verdicts[1].reason


def test_a_violation_seen_before_the_run_stopped_still_fails(tmp_path: Path) -> None:
    # The launch was expected to be rejected, yet the server became ready before cptest was killed.
    plan = make_plan(server_plan(), [REJECT])
    killed = [Lifecycle(event="ready", detail={"after_s": 2.0}),
              Lifecycle(event="interrupted", detail={"reason": "SIGKILL"})]  # fmt: skip
    write_archive(tmp_path, plan, runner={"main": killed})
    sv = check_loaded(load_archive(tmp_path))
    assert [(v.checker, v.status) for v in sv.verdicts] == [("launch", "fail"), ("run", "unknown")]
    assert sv.status == "fail" and "interrupted (SIGKILL)" in sv.verdicts[1].reason


def test_a_traceback_in_the_log_of_an_interrupted_run_is_unknown(tmp_path: Path) -> None:
    # Tearing an engine down mid-run prints tracebacks: they prove nothing about the engine.
    plan = make_plan(server_plan(), [LogParams(pattern="Traceback", present=False)])  # fmt: skip
    killed = [Lifecycle(event="interrupted", detail={"reason": "SIGTERM"})]
    write_archive(tmp_path, plan, runner={"main": killed},
                  logs={"main-node0.log": "Traceback (most recent call last):\n"})  # fmt: skip
    sv = check_loaded(load_archive(tmp_path))
    assert [(v.checker, v.status) for v in sv.verdicts] == [("log", "unknown"), ("run", "unknown")]


def test_a_run_killed_during_its_baseline_is_unknown(tmp_path: Path) -> None:
    plan = make_plan(server_plan(), [ServingParams(completed_min=0)],
                     requests=0)  # fmt: skip
    plan = plan.model_copy(update={"baseline": plan.main.model_copy(update={"role": "baseline"})})
    main = [Lifecycle(event="ready", detail={"after_s": 1.0}), Lifecycle(event="shutdown_done")]
    write_archive(tmp_path, plan, runner={"main": main, "baseline": [Lifecycle(event="launched")]})
    sv = check_loaded(load_archive(tmp_path))
    assert sv.status == "unknown" and "the baseline server has no shutdown record" in sv.verdicts[-1].reason


# ---------------------------------------------------------------- launch
REJECT = LaunchParams(accepted=False, match="does not support")
FAILED = Lifecycle(event="launch_failed", detail={"status": 1, "after_s": 3.0, "reason": "exit 1"})


def test_expected_rejection_with_matching_log_passes(tmp_path: Path) -> None:
    v = _one(tmp_path, REJECT, [FAILED], logs={"main-node0.log": "x\nValueError: PCP does not support DCP\n"})
    assert v == Verdict(
        checker="launch",
        status="pass",
        figures={"status": 1, "matched": "ValueError: PCP does not support DCP"},
        reason="main was rejected as expected: ValueError: PCP does not support DCP",
    )


def test_rejection_for_another_reason_fails(tmp_path: Path) -> None:
    v = _one(tmp_path, REJECT, [FAILED], logs={"main-node0.log": "CUDA out of memory\n"})
    assert v.status == "fail" and "no log line matches" in v.reason


def test_launch_expected_rejected_but_ready_fails(tmp_path: Path) -> None:
    v = _one(tmp_path, REJECT, [Lifecycle(event="ready", detail={"after_s": 40.0})])
    assert v.status == "fail"


def test_launch_with_neither_ready_nor_failure_is_unknown(tmp_path: Path) -> None:
    v = _one(
        tmp_path, LaunchParams(accepted=True), [Lifecycle(event="launched")]
    )
    assert v.status == "unknown"


# ---------------------------------------------------------------- serving
SERVING = ServingParams(completed_min=2, of=3)


def _req(i: int, status: str) -> RequestResult:
    return RequestResult(index=i, prompt_len=1, max_new_tokens=1, prompt_sha256="x", status=status)


def test_request_without_outcome_fails_as_hung(tmp_path: Path) -> None:
    v = _one(tmp_path, SERVING, [_req(0, "ok"), _req(1, "ok")], requests=3)
    assert v.status == "fail" and v.figures["first_no_outcome"] == 2 and "hung" in v.reason


def test_timeouts_short_of_the_minimum_are_unknown(tmp_path: Path) -> None:
    v = _one(tmp_path, SERVING, [_req(0, "ok"), _req(1, "timeout"), _req(2, "error")], requests=3)
    assert v.status == "unknown" and "indeterminate" in v.reason


def test_enough_completed_passes_despite_a_timeout(tmp_path: Path) -> None:
    v = _one(tmp_path, SERVING, [_req(0, "ok"), _req(1, "ok"), _req(2, "timeout")], requests=3)
    assert v.status == "pass"


def test_errors_short_of_the_minimum_fail(tmp_path: Path) -> None:
    v = _one(tmp_path, SERVING, [_req(0, "ok"), _req(1, "error"), _req(2, "error")], requests=3)
    assert v.status == "fail"


# ---------------------------------------------------------------- shutdown
SHUTDOWN = ShutdownParams(within_s=30, gpu_memory_released=True, no_orphans=True, exit_statuses=[0, -9])
CLEAN = [
    GpuSample(phase="before", used_mib={"0": 500}),
    Lifecycle(event="signal", detail={"sig": 15, "pid": 10}),
    Lifecycle(event="exited", detail={"node": 0, "status": -9, "after_s_since_signal": 12.0}),
    Lifecycle(event="teardown", detail={"leftover_pids": [], "killed": []}),
    ProcessSample(phase="final", procs=[]),
    GpuSample(phase="after", used_mib={"0": 540}),
]


def test_clean_shutdown_passes(tmp_path: Path) -> None:
    v = _one(tmp_path, SHUTDOWN, CLEAN)
    assert v.status == "pass", v.reason
    assert v.figures["parts"] == {
        "within": "pass",
        "no_orphans": "pass",
        "gpu_memory": "pass",
        "exit_status": "pass",
    }


def test_gpu_memory_held_after_shutdown_fails(tmp_path: Path) -> None:
    v = _one(tmp_path, SHUTDOWN, [*CLEAN[:-1], GpuSample(phase="after", used_mib={"0": 1800})])
    assert v.status == "fail" and v.reason == "gpu_memory: GPU 0 still holds 1300 MiB more than before launch"


def test_slow_exit_and_orphan_both_fail(tmp_path: Path) -> None:
    runner = [*CLEAN]
    runner[2] = Lifecycle(event="exited", detail={"node": 0, "status": -9, "after_s_since_signal": 45.0})
    runner[4] = ProcessSample(phase="final", procs=[{"pid": 77, "name": "sglang::scheduler_TP1"}])
    v = _one(tmp_path, SHUTDOWN, runner)
    assert v.status == "fail"
    assert v.figures["parts"]["within"] == "fail" and v.figures["parts"]["no_orphans"] == "fail"


def test_exit_status_outside_the_accepted_set_fails(tmp_path: Path) -> None:
    runner = [*CLEAN]
    runner[2] = Lifecycle(event="exited", detail={"node": 0, "status": 1, "after_s_since_signal": 2.0})
    assert _one(tmp_path, SHUTDOWN, runner).figures["parts"]["exit_status"] == "fail"


def test_shutdown_without_gpu_samples_is_unknown(tmp_path: Path) -> None:
    v = _one(tmp_path, SHUTDOWN, [r for r in CLEAN if not isinstance(r, GpuSample)])
    assert v.status == "unknown" and v.figures["parts"]["gpu_memory"] == "unknown"


# ---------------------------------------------------------------- graph
def _graph(state: str) -> Expectation:
    return GraphParams(phase="decode", state=state)


def test_decode_graph_captured_and_replayed_passes(tmp_path: Path) -> None:
    recs = [
        Graph(rank=rank_id(0), event="capture", phase="decode", batch_sizes=[1, 2, 4]),
        Graph(rank=rank_id(0), event="replay", phase="decode", count=30),
    ]
    v = _one(tmp_path, _graph("captured"), [], ranks={0: recs})
    assert v.status == "pass" and v.figures["captured_sizes"] == {"0": [1, 2, 4]}


def test_decode_graph_captured_but_never_replayed_fails(tmp_path: Path) -> None:
    recs = [
        Graph(rank=rank_id(0), event="capture", phase="decode", batch_sizes=[1]),
        Graph(rank=rank_id(0), event="eager", phase="decode", count=30),
    ]
    assert _one(tmp_path, _graph("captured"), [], ranks={0: recs}).status == "fail"


def test_graph_disabled_with_decode_steps_and_no_capture_passes(tmp_path: Path) -> None:
    step = Step(rank=rank_id(0), step=1, mode="decode", batch_size=1, rows_in=1)
    assert _one(tmp_path, _graph("disabled"), [], ranks={0: [step]}).status == "pass"


def test_replayed_steps_are_not_proof_of_eager_decode(tmp_path: Path) -> None:
    """Since D58 a replay is a Step record too, marked by graph_rows: it counts as a replay, and
    'disabled' fails on it even where the runner's counters were never flushed (a killed rank)."""
    replay = Step(rank=rank_id(0), step=1, mode="decode", batch_size=1, rows_in=1, graph_rows=4)
    v = _one(tmp_path, _graph("disabled"), [], ranks={0: [replay]})
    assert v.status == "fail" and "replayed graphs 1 time(s)" in v.reason
    assert v.figures["steps"] == {"0": 0}


def test_graph_captured_with_replays_seen_only_as_steps_passes(tmp_path: Path) -> None:
    recs = [Graph(rank=rank_id(0), event="capture", phase="decode", batch_sizes=[1, 2, 4]),
            *(Step(rank=rank_id(0), step=i, mode="decode", batch_size=1, rows_in=1, graph_rows=1)
              for i in range(5))]
    v = _one(tmp_path, _graph("captured"), [], ranks={0: recs})
    assert v.status == "pass" and v.figures["replays"] == {"0": 5}


def test_graph_disabled_without_step_records_is_unknown(tmp_path: Path) -> None:
    assert _one(tmp_path, _graph("disabled"), [], ranks={0: []}).status == "unknown"


def test_graph_disabled_but_captured_fails(tmp_path: Path) -> None:
    recs = [Graph(rank=rank_id(0), event="capture", phase="decode", batch_sizes=[8])]
    assert _one(tmp_path, _graph("disabled"), [], ranks={0: recs}).status == "fail"


# ---------------------------------------------------------------- log
def test_log_pattern_expected_absent_but_present_fails(tmp_path: Path) -> None:
    expect = LogParams(pattern=r"Traceback", present=False)
    v = _one(tmp_path, expect, [], logs={"main-node0.log": "ok\nTraceback (most recent call last):\n"})
    assert v.status == "fail" and v.figures == {
        "file": "logs/main-node0.log",
        "line": "Traceback (most recent call last):",
    }


def test_a_log_kept_under_its_nodes_name_is_the_file_the_verdict_names(tmp_path: Path) -> None:
    # A launcher that names its nodes (Slurm) keeps `logs/main-node1-n2.log`: the verdict must name
    # the file the archive holds, not the one without the name.
    logs = {"main-node0-n1.log": "[t] ready\n", "main-node1-n2.log": "[t] SIGQUIT received: a rank died\n"}
    v = _one(tmp_path, LogParams(pattern="SIGQUIT received"), [], logs=logs,
             main=server_plan(world=2, dcp=2, nodes=2))
    assert v.status == "pass" and v.figures["file"] == "logs/main-node1-n2.log"
    assert (tmp_path / v.figures["file"]).is_file() and "logs/main-node1-n2.log" in v.reason
    failed_launch = [Lifecycle(event="launch_failed", detail={"status": 1, "reason": "exited"})]
    launch = _one(tmp_path / "launch", LaunchParams(accepted=True), failed_launch, logs=logs,
                  main=server_plan(world=2, dcp=2, nodes=2))
    assert launch.status == "fail" and launch.reason.endswith("; see logs/main-node0-n1.log")


def test_log_pattern_without_logs_is_unknown(tmp_path: Path) -> None:
    expect = LogParams(pattern=r"Traceback", present=False)
    assert _one(tmp_path, expect, []).status == "unknown"


# Per-process figures (NVML): only this run's processes count, so runs may share the GPUs.
def _gpu(phase: str, total: int, *procs: tuple[int, int, bool]) -> GpuSample:
    return GpuSample(phase=phase, used_mib={"0": total},
                     processes=[GpuProcessUse(gpu="0", pid=p, mib=m, ours=o) for p, m, o in procs])


def test_another_runs_memory_on_a_shared_gpu_does_not_fail_the_shutdown(tmp_path: Path) -> None:
    runner = [_gpu("before", 4600, (900, 4000, False)), *CLEAN[1:-1],
              _gpu("running", 12000, (900, 4000, False), (10, 4100, True)),
              # another run started a server meanwhile: the device total grew by 4 GiB
              _gpu("after", 8700, (900, 4000, False), (901, 4100, False))]
    v = _one(tmp_path, SHUTDOWN, runner)
    assert v.status == "pass", v.reason
    assert v.figures["gpu_own_mib"] == {"peak": {"0": 4100}, "after": {"0": 0}}


def test_a_process_of_this_run_still_holding_memory_fails_whatever_the_total(tmp_path: Path) -> None:
    runner = [_gpu("before", 9000, (900, 8000, False)), *CLEAN[1:-1],
              _gpu("after", 5000, (77, 1200, True))]  # the other run left: the total even fell
    v = _one(tmp_path, SHUTDOWN, runner)
    assert v.status == "fail"
    assert v.reason == ("gpu_memory: pid 77 of this run still holds 1200 MiB on GPU 0 after shutdown "
                        "(1 process(es) in all)")


def test_a_foreign_stray_is_not_this_runs_orphan(tmp_path: Path) -> None:
    runner = [*CLEAN]
    stray = {"pid": 5, "name": "sglang::scheduler_TP0"}
    runner[4] = ProcessSample(phase="final", procs=[{**stray, "scope": "foreign"}])
    assert _one(tmp_path, SHUTDOWN, runner).figures["parts"]["no_orphans"] == "pass"
    runner[4] = ProcessSample(phase="final", procs=[{**stray, "scope": "host"}])
    assert _one(tmp_path / "b", SHUTDOWN, runner).figures["parts"]["no_orphans"] == "fail"


# Co-located ranks share a GPU: a device total mixes them, per-process figures do not.
def _colocated_runner(*gpu: GpuSample) -> list:
    exits = [Lifecycle(event="exited", detail={"node": n, "status": -9, "after_s_since_signal": 2.0})
             for n in (0, 1)]
    return [gpu[0], CLEAN[1], *exits, *CLEAN[3:5], *gpu[1:]]


def test_a_colocated_servers_device_totals_leave_gpu_memory_unknown_co_located(tmp_path: Path) -> None:
    runner = _colocated_runner(GpuSample(phase="before", used_mib={"0": 500}),
                               GpuSample(phase="after", used_mib={"0": 540}))
    v = _one(tmp_path, SHUTDOWN, runner, main=colocate(server_plan(world=2, dcp=2)))
    assert v.status == "unknown"
    assert v.figures["parts"] == {"within": "pass", "no_orphans": "pass", "gpu_memory": "unknown",
                                  "exit_status": "pass"}
    assert v.reason.startswith("gpu_memory: co-located: the ranks share GPUs and only device totals")
    # The same evidence from a physical server is judged by the totals.
    physical = _one(tmp_path / "physical", SHUTDOWN, runner, main=server_plan(world=2, dcp=2, nodes=2))
    assert physical.figures["parts"]["gpu_memory"] == "pass"


def test_a_colocated_servers_memory_is_still_judged_per_process(tmp_path: Path) -> None:
    main = colocate(server_plan(world=2, dcp=2))
    released = _colocated_runner(_gpu("before", 600, (900, 500, False)),
                                 _gpu("after", 600, (900, 500, False)))
    assert _one(tmp_path, SHUTDOWN, released, main=main).figures["parts"]["gpu_memory"] == "pass"
    held = _colocated_runner(_gpu("before", 600, (900, 500, False)),
                             _gpu("after", 1800, (900, 500, False), (11, 1200, True)))
    v = _one(tmp_path / "held", SHUTDOWN, held, main=main)
    assert v.status == "fail" and v.reason.startswith("gpu_memory: pid 11 of this run still holds 1200 MiB")


def test_a_colocated_servers_exit_status_is_its_head_nodes(tmp_path: Path) -> None:
    # Node 1 is a local follower node: it ends with 0 after its head's shutdown request, where the
    # single-node server would be one tree; the declared statuses judge the head.
    runner = _colocated_runner(_gpu("before", 600), _gpu("after", 600))
    runner[3] = Lifecycle(event="exited", detail={"node": 1, "status": 1, "after_s_since_signal": 2.5})
    main = colocate(server_plan(world=2, dcp=2))
    v = _one(tmp_path, SHUTDOWN, runner, main=main)
    assert v.figures["parts"]["exit_status"] == "pass" and v.figures["exit_statuses"] == {"0": -9, "1": 1}
    # A physical server of two nodes is judged on both.
    physical = _one(tmp_path / "physical", SHUTDOWN, runner, main=server_plan(world=2, dcp=2, nodes=2))
    assert physical.figures["parts"]["exit_status"] == "fail"
    runner[2] = Lifecycle(event="exited", detail={"node": 0, "status": 1, "after_s_since_signal": 2.0})
    assert _one(tmp_path / "head", SHUTDOWN, runner, main=main).figures["parts"]["exit_status"] == "fail"


FOLLOWER = ("[t] Scheduler or DataParallelController 77 terminated with 0\n"
            "[t] ERROR:    Traceback (most recent call last):\n"
            "AttributeError: 'NoneType' object has no attribute 'server_args'\n")


def test_a_colocated_followers_launcher_after_its_ranks_ended_is_not_the_servers_log(tmp_path: Path) -> None:
    absent = LogParams(pattern="Traceback", present=False)
    logs = {"main-node0.log": "[t] ready\n", "main-node1.log": "[t] loading\n" + FOLLOWER}
    v = _one(tmp_path, absent, CLEAN, logs=logs, main=colocate(server_plan(world=2, dcp=2)))
    assert v.status == "pass" and "not searched: node 1's last 2 line(s)" in v.reason
    assert v.figures["follower_lines_not_judged"] == {"1": 2}
    # Physical nodes are the server's own: the same log fails.
    physical = _one(tmp_path / "p", absent, CLEAN, logs=logs, main=server_plan(world=2, dcp=2, nodes=2))
    assert physical.status == "fail" and "main-node1.log" in physical.reason
    # Before its ranks ended, a follower's traceback is the server's.
    early = {**logs, "main-node1.log": "[t] Traceback (most recent call last):\n" + FOLLOWER}
    colocated = colocate(server_plan(world=2, dcp=2))
    assert _one(tmp_path / "e", absent, CLEAN, logs=early, main=colocated).status == "fail"
