"""Specification of cptest/run/faults.py: when faults fire, what they hit, what they record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from cptest.errors import RunError
from cptest.evidence import Lifecycle, RequestResult, read_records
from cptest.plan.model import FaultPlan
from cptest.probe.runtime import COPY_WITHIN_S, ENV_COPY_WITHIN_S, IDLE_S
from cptest.run.evidence_writer import RecordWriter
from cptest.run.faults import (
    DecodeStepCounter,
    FaultInjector,
    SignalFault,
    find_titled,
    probe_env,
    process_title,
)
from cptest.run.process import ProcessLauncher

from conftest import fake_node, wait_until  # isort: skip


class Recorder:
    """A Fault that only notes when it was asked to inject."""

    supported_kinds = frozenset({"kill", "stop"})

    def __init__(self) -> None:
        self.calls: list[tuple[int, float]] = []

    def inject(self, fault: FaultPlan) -> dict[str, Any]:
        self.calls.append((fault.index, time.monotonic()))
        return {
            "index": fault.index,
            "action": fault.action,
            "target": fault.target,
            "rank": fault.rank,
            "pid": 1234,
            "title": fault.process_title,
        }

    def heal(self, fault: FaultPlan, injected: dict[str, Any]) -> dict[str, Any] | None:
        return None

    def settle(self, timeout_s: float) -> None:
        pass


def kill_rank(index: int = 0, **trigger: Any) -> FaultPlan:
    return FaultPlan(
        index=index, action="kill", target="rank", rank=1, process_title="sglang::scheduler_TP1", **trigger
    )


def result(i: int) -> RequestResult:
    return RequestResult(index=i, prompt_len=1, max_new_tokens=1, prompt_sha256="x", status="ok")


def lifecycle(path: Path) -> list[Lifecycle]:
    return [r for r in read_records(path)[0] if isinstance(r, Lifecycle)]


def test_a_timed_fault_fires_on_time(tmp_path: Path) -> None:
    rec = Recorder()
    inj = FaultInjector([kill_rank(at_s=0.5)], [], writer=RecordWriter(tmp_path / "r.jsonl"), fault=rec)
    t0 = time.monotonic()
    inj.start(t0)
    wait_until(lambda: rec.calls, 3, "the fault")
    inj.stop()
    assert rec.calls[0][1] - t0 == pytest.approx(0.5, abs=0.05)
    (event,) = lifecycle(tmp_path / "r.jsonl")
    assert event.event == "fault"
    assert event.detail["trigger"] == "at 0.5 s" and event.detail["at_s"] == pytest.approx(0.5, abs=0.05)
    assert {"index", "action", "target", "rank", "pid", "title"} <= set(event.detail)


def test_a_request_count_fault_fires_at_the_nth_completion(tmp_path: Path) -> None:
    rec = Recorder()
    inj = FaultInjector(
        [kill_rank(after_requests=3)], [], writer=RecordWriter(tmp_path / "r.jsonl"), fault=rec
    )
    inj.start()
    inj.on_request_done(result(0), 1)
    inj.on_request_done(result(1), 2)
    assert rec.calls == []
    inj.on_request_done(result(2), 3)
    assert [i for i, _ in rec.calls] == [0]  # synchronously, at the 3rd completion
    inj.on_request_done(result(3), 4)
    inj.stop()
    assert len(rec.calls) == 1  # fires once


def test_a_decode_step_fault_fires_when_rank0_has_written_n_decode_steps(tmp_path: Path) -> None:
    rec = Recorder()
    probe = tmp_path / "evidence"
    probe.mkdir()
    inj = FaultInjector(
        [kill_rank(after_decode_steps=3)],
        [],
        writer=RecordWriter(tmp_path / "r.jsonl"),
        probe_dir=probe,
        fault=rec,
    )
    inj.start()
    with (probe / "rank0.jsonl").open("a") as f:
        for i, mode in enumerate(["extend", "decode", "decode", "extend"]):
            f.write(json.dumps({"kind": "step", "mode": mode, "step": i}) + "\n")
            f.flush()
        time.sleep(0.3)
        assert rec.calls == []
        f.write('{"kind": "step", "mode": "decode"}\n')
    wait_until(lambda: rec.calls, 3, "the decode-step fault")
    inj.stop()


def test_only_a_fault_counted_in_decode_steps_asks_the_probe_for_a_tighter_copy_bound() -> None:
    assert probe_env([kill_rank(after_decode_steps=3)]) == {ENV_COPY_WITHIN_S: repr(IDLE_S)}
    assert probe_env([kill_rank(after_requests=2), kill_rank(1, at_s=1.0)]) == {}
    assert probe_env([]) == {}
    assert IDLE_S < COPY_WITHIN_S


def test_decode_step_counter_waits_for_a_complete_line(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    path.write_text('{"kind": "step", "mode": "decode"}\n{"kind": "step", "mo')
    counter = DecodeStepCounter(path)
    assert counter.poll() == 1
    with path.open("a") as f:
        f.write('de": "decode"}\n')
    assert counter.poll() == 2


def test_decode_step_counter_counts_each_step_of_a_steps_line(tmp_path: Path) -> None:
    """The probe writes runs of decode steps as one `steps` line (evidence.StepBlock): each of its
    steps is a decode Step record as read_records reads it, and counts as one."""
    path = tmp_path / "rank0.jsonl"
    path.write_text('{"kind": "steps", "mode": "decode", "step": [4, 5, 6]}\n'
                    '{"kind": "step", "mode": "extend"}\n{"kind": "pool_sample", "step": 7}\n')
    assert DecodeStepCounter(path).poll() == 3


def test_an_action_the_fault_cannot_do_is_refused_up_front(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="'sigterm' is not supported"):
        FaultInjector(
            [FaultPlan(index=0, action="sigterm", target="server")],
            [],
            writer=RecordWriter(tmp_path / "r.jsonl"),
            fault=Recorder(),
        )


def test_titles_match_exactly_not_by_prefix(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import setproctitle, time; "
                f"setproctitle.setproctitle('sglang::scheduler_TP{r}'); time.sleep(30)",
            ]
        )
        for r in (10, 1)
    ]
    try:
        wait_until(
            lambda: all(psutil.Process(p.pid).name().startswith("sglang") for p in procs), 10, "titles"
        )
        pids = [p.pid for p in procs]
        assert find_titled(pids, "sglang::scheduler_TP1") == procs[1].pid
        assert find_titled(pids, "sglang::scheduler_TP10") == procs[0].pid
        assert find_titled(pids, "sglang::scheduler_TP2") is None
    finally:
        for p in procs:
            p.kill()
            p.wait()


FORKS = ("import os, setproctitle, sys, time; setproctitle.setproctitle(sys.argv[1]); "
         "child = os.fork(); print(child or os.getpid(), flush=True); time.sleep(30)")


def test_a_fork_that_still_wears_its_parents_title_is_not_the_titled_process() -> None:
    """A scheduler's child between fork and exec carries the scheduler's title; the fault must
    signal the scheduler, wherever the child comes in the list."""
    proc = subprocess.Popen([sys.executable, "-c", FORKS, "sglang::scheduler_TP1"], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        wait_until(lambda: process_title(child) == "sglang::scheduler_TP1", 10, "the fork's title")
        assert find_titled([child, proc.pid], "sglang::scheduler_TP1") == proc.pid
        assert find_titled([child], "sglang::scheduler_TP1") == child  # alone, it is the one there is
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_killing_a_rank_by_title_brings_the_server_down_and_is_recorded(tmp_path: Path, port: int) -> None:
    launcher = ProcessLauncher()
    handle = launcher.start(fake_node(port), tmp_path / "engine.log", {})
    try:
        wait_until(lambda: len(handle.pids()) >= 5, 20, "the fake tree")
        target = find_titled(handle.pids(), "sglang::scheduler_TP1")
        inj = FaultInjector([kill_rank(at_s=0.0)], [handle], writer=RecordWriter(tmp_path / "r.jsonl"))
        inj.start()
        wait_until(lambda: handle.poll() is not None, 10, "the engine to die after its rank")
        inj.stop()
        assert handle.poll() == -9  # like SGLang: a dead scheduler makes the server SIGKILL itself
        (event,) = lifecycle(tmp_path / "r.jsonl")
        assert event.detail["pid"] == target and "error" not in event.detail
    finally:
        assert launcher.teardown(handle, grace_s=2).leftover_pids == []


def test_stopping_the_injector_waits_for_a_killed_server_to_end_and_takes_a_zombie_as_ended() -> None:
    import subprocess
    import types

    child = subprocess.Popen(["sleep", "30"])  # never waited here: once killed it stays a zombie
    head = types.SimpleNamespace(node=types.SimpleNamespace(node_rank=0), main_pid=lambda: child.pid)
    fault = SignalFault([head])  # type: ignore[list-item]
    try:
        detail = fault.inject(FaultPlan(index=0, action="kill", target="server", at_s=0.0))
        assert detail["pid"] == child.pid and "error" not in detail
        t0 = time.monotonic()
        fault.settle(5.0)
        assert time.monotonic() - t0 < 2.0  # ended: a zombie, not a live server
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
    finally:
        child.kill()
        child.wait()


def test_a_stopped_rank_is_continued_after_heal_after_s(tmp_path: Path, port: int) -> None:
    launcher = ProcessLauncher()
    handle = launcher.start(fake_node(port), tmp_path / "engine.log", {})
    try:
        wait_until(lambda: len(handle.pids()) >= 5, 20, "the fake tree")
        target = find_titled(handle.pids(), "sglang::scheduler_TP0")
        assert target is not None
        fault = FaultPlan(
            index=0,
            action="stop",
            target="rank",
            rank=0,
            process_title="sglang::scheduler_TP0",
            at_s=0.0,
            heal_after_s=0.4,
        )
        inj = FaultInjector([fault], [handle], writer=RecordWriter(tmp_path / "r.jsonl"))
        inj.start()
        wait_until(lambda: psutil.Process(target).status() == psutil.STATUS_STOPPED, 5, "SIGSTOP")
        wait_until(lambda: psutil.Process(target).status() != psutil.STATUS_STOPPED, 5, "SIGCONT")
        inj.stop()
        events = [(e.event, e.detail.get("sig")) for e in lifecycle(tmp_path / "r.jsonl")]
        assert events == [("fault", None), ("signal", "SIGCONT")]
    finally:
        assert launcher.teardown(handle, grace_s=5).leftover_pids == []


def test_a_missing_title_is_recorded_as_a_fault_that_hit_nothing(tmp_path: Path, port: int) -> None:
    launcher = ProcessLauncher()
    handle = launcher.start(fake_node(port), tmp_path / "engine.log", {})
    try:
        wait_until(lambda: len(handle.pids()) >= 5, 20, "the fake tree")
        detail = SignalFault([handle]).inject(
            FaultPlan(index=2, action="kill", target="rank", rank=7, process_title="sglang::scheduler_TP7")
        )
        assert detail["pid"] is None and "sglang::scheduler_TP7" in detail["error"]
        assert handle.poll() is None
    finally:
        assert launcher.teardown(handle, grace_s=5).leftover_pids == []


class TitledHandle:
    """A node's handle as the injector sees it: its node and the pids of its tree."""

    def __init__(self, node_rank: int, pids: list[int]) -> None:
        self.node = fake_node(0).model_copy(update={"node_rank": node_rank})
        self._pids = pids

    def pids(self) -> list[int]:
        return self._pids

    def main_pid(self) -> int:
        return self._pids[0]


def test_a_colocated_rank_fault_looks_only_in_its_own_nodes_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two co-located servers' ranks may carry the same title on one host; so may a stray process.
    titles = {101: "main0", 102: "sglang::scheduler_TP1", 201: "main1", 202: "sglang::scheduler_TP1"}
    monkeypatch.setattr("cptest.run.faults.process_title", titles.get)
    handles = [TitledHandle(0, [101, 102]), TitledHandle(1, [201, 202])]
    fault = FaultPlan(index=0, action="kill", target="rank", rank=1, process_title="sglang::scheduler_TP1",
                      node=1)
    assert SignalFault(handles).target_pid(fault)[0] == 202  # type: ignore[arg-type]
    lost = fault.model_copy(update={"node": 2})
    pid, _, error = SignalFault(handles).target_pid(lost)  # type: ignore[arg-type]
    assert pid is None and "node 2's tree" in error
    # Without a node (one process tree per server), the first titled process anywhere is the target.
    anywhere = fault.model_copy(update={"node": None})
    assert SignalFault(handles).target_pid(anywhere)[0] == 102  # type: ignore[arg-type]
