"""Specification of cptest/run/process.py: subprocess trees torn down on every exit path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from cptest.errors import RunError
from cptest.plan.model import NodeLaunch
from cptest.run import reaper
from cptest.run.launcher import Launcher
from cptest.run.process import ProcessLauncher, engine_env, live_handles, resolve_argv

from conftest import PARENT, alive, fake_node, wait_until  # isort: skip

FULL_TREE = 1 + 2 * 2 + 1  # main, 2 schedulers with a helper each, one orphan


def start_full_tree(launcher: ProcessLauncher, port: int, tmp_path: Path, *args: str):
    handle = launcher.start(
        fake_node(port, "--orphan", *args), tmp_path / "engine.log", {"test": tmp_path.name}
    )
    wait_until(lambda: len(handle.pids()) >= FULL_TREE, 20, "the whole fake tree")
    return handle


def test_process_launcher_implements_the_launcher_protocol() -> None:
    assert isinstance(ProcessLauncher(), Launcher)


def test_engine_env_drops_engine_settings_of_the_shell_and_sets_gpus_from_the_plan() -> None:
    node = NodeLaunch(
        node_rank=0, gpu_ids=[2, 3], env={"NCCL_DEBUG": "INFO", "SGLANG_X": "plan"}, argv=["python3"], port=1
    )
    env = engine_env(
        node,
        {"PATH": "/bin", "SGLANG_X": "shell", "SGL_Y": "1", "CPTEST_Z": "1", "CUDA_VISIBLE_DEVICES": "0"},
        {"cptest.run": "r1"},
    )
    assert env == {
        "PATH": "/bin",
        "NCCL_DEBUG": "INFO",
        "SGLANG_X": "plan",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "CPTEST_LABEL_CPTEST_RUN": "r1",
    }


def test_missing_executable_is_a_run_error_naming_it() -> None:
    with pytest.raises(RunError, match="no-such-engine"):
        resolve_argv(["no-such-engine", "--x"], {"PATH": "/nonexistent"})


def test_argv_zero_is_resolved_on_the_engine_path_without_a_shell() -> None:
    argv = resolve_argv(["python3", "-c", "1; echo $HOME"], {"PATH": os.path.dirname(sys.executable)})
    assert os.path.isabs(argv[0]) and argv[1:] == ["-c", "1; echo $HOME"]


def test_tree_includes_grandchildren_and_orphans_reparented_away(tmp_path: Path, port: int) -> None:
    launcher = ProcessLauncher(reaper=False)
    handle = start_full_tree(launcher, port, tmp_path)
    try:
        pids = handle.pids()
        assert pids[0] == handle.main_pid()

        def titles() -> set[str]:
            return {psutil.Process(p).name() for p in handle.pids()}

        # A child is in the tree from its fork; it takes its title a moment later, in its own time.
        wait_until(lambda: {"sglang::scheduler_TP0", "sglang::scheduler_TP1"} <= titles(), 20,
                   "the schedulers' process titles")
        orphans = [
            p
            for p in pids
            if psutil.Process(p).ppid() != handle.main_pid() and psutil.Process(p).ppid() not in pids
        ]
        assert orphans, "the double-forked grandchild should have left the parent chain"
    finally:
        info = launcher.teardown(handle, grace_s=1.5)
    assert info.leftover_pids == []


def test_teardown_after_a_normal_end_leaves_nothing(tmp_path: Path, port: int) -> None:
    launcher = ProcessLauncher()
    handle = start_full_tree(launcher, port, tmp_path)
    known = dict(handle.known)
    info = launcher.teardown(handle, grace_s=1.5)
    assert info.leftover_pids == []
    assert info.status == 0  # the fake engine drains and exits 0 on SIGTERM
    assert alive(list(known), known) == []
    assert handle not in live_handles()
    assert handle.reaper is not None and handle.reaper.poll() is not None


def test_teardown_kills_a_tree_that_ignores_sigterm(tmp_path: Path, port: int) -> None:
    launcher = ProcessLauncher()
    handle = start_full_tree(launcher, port, tmp_path, "--ignore-sigterm")
    known = dict(handle.known)
    info = launcher.teardown(handle, grace_s=0.5)
    assert info.leftover_pids == []
    assert info.status == -signal.SIGKILL
    assert alive(list(known), known) == []


def test_teardown_is_idempotent_and_quiet_for_a_tree_already_gone(tmp_path: Path, port: int) -> None:
    launcher = ProcessLauncher()
    handle = start_full_tree(launcher, port, tmp_path)
    first = launcher.teardown(handle, grace_s=1.5)
    second = launcher.teardown(handle, grace_s=1.5)
    assert first.leftover_pids == second.leftover_pids == []
    assert second.status == first.status


def test_sweep_kills_leftovers_carrying_the_labels(tmp_path: Path, port: int) -> None:
    launcher = ProcessLauncher(reaper=False)
    handle = start_full_tree(launcher, port, tmp_path)
    known = dict(handle.known)
    removed = launcher.sweep({"test": tmp_path.name})
    assert removed
    wait_until(lambda: not alive(list(known), known), 10, "swept processes to die")
    handle.popen.wait(5)
    assert launcher.teardown(handle, grace_s=1).leftover_pids == []


def run_parent(tmp_path: Path, mode: str, port: int) -> tuple[subprocess.Popen[bytes], dict[int, float]]:
    pids_file = tmp_path / "pids.json"
    parent = subprocess.Popen(
        [sys.executable, str(PARENT), mode, str(port), str(pids_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: pids_file.exists() or parent.poll() is not None, 30, "the parent's tree")
    finally:
        if not pids_file.exists():  # say why: the parent's own words and its engine's log
            parent.kill()
            out = parent.communicate()[0].decode(errors="replace")
            log = tmp_path / "engine.log"
            engine = log.read_text(errors="replace") if log.exists() else "(no engine log)"
            pytest.fail(f"the parent wrote no tree; it printed:\n{out[-3000:]}\n"
                        f"engine log:\n{engine[-3000:]}")
    pids = {int(k): v for k, v in json.loads(pids_file.read_text()).items()}
    assert len(pids) >= FULL_TREE
    assert alive(list(pids), pids)
    return parent, pids


@pytest.mark.parametrize("mode", ["normal", "exception", "thread_crash"])
def test_parent_ending_by_itself_leaves_no_process(tmp_path: Path, port: int, mode: str) -> None:
    parent, pids = run_parent(tmp_path, mode, port)
    out, _ = parent.communicate(timeout=30)
    if mode == "thread_crash":
        assert b"sampler thread crashed" in out and parent.returncode != 0
    if mode == "exception":
        assert b"boom inside the run" in out
    assert alive(list(pids), pids) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_the_parent_tears_the_tree_down(tmp_path: Path, port: int, sig: int) -> None:
    parent, pids = run_parent(tmp_path, "signal", port)
    parent.send_signal(sig)
    parent.communicate(timeout=30)
    assert alive(list(pids), pids) == []


def test_sigkill_of_the_parent_is_covered_by_the_reaper(tmp_path: Path, port: int) -> None:
    parent, pids = run_parent(tmp_path, "wait", port)
    parent.kill()
    parent.wait()
    wait_until(lambda: not alive(list(pids), pids), 15, "the reaper to kill the orphaned tree")


def test_a_reaper_whose_session_id_was_reused_kills_nobody_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # A busy process table (pid_max 32768 on CI) reuses a finished engine's session id for a later
    # run's engine, itself a session leader. The first reaper then learns that cptest is gone (the
    # lifeline closes when its run ends): the process that now holds the number is not its engine.
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        real = reaper.ident(other.pid)
        assert real is not None
        reused = {"now": False}
        true_ident = reaper.ident

        def ident(pid: int) -> float | None:
            if pid == other.pid:  # the engine's leader while it ran, then the later run's process
                return real if reused["now"] else real - 100.0
            return None if pid == gone.pid else true_ident(pid)

        monkeypatch.setattr(reaper, "ident", ident)
        monkeypatch.setattr(reaper, "tree_snapshot", lambda session: {session: ident(session)})
        assert reaper.watch(gone.pid, 1.0, other.pid, interval_s=0.05,
                            ready=lambda: reused.update(now=True)) == 0
        assert other.poll() is None, "the reaper killed a process of the session that reused its id"
    finally:
        other.kill()
        other.wait()
