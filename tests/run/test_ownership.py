"""Each run owns its processes and its port (issue 14): the engine tree is covered from its first
instant, readiness counts only this run's server, strays are judged only when they are this run's,
and the reference engine runs on cptest's own interpreter."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from cptest.evidence import Lifecycle, ProcessSample, read_records
from cptest.outline import null_logger
from cptest.run.evidence_writer import RecordWriter
from cptest.run.process import GATE_EXIT, ProcessLauncher, gated_argv, own_interpreter, resolve_argv
from cptest.run.runner import RunOptions, run_plan
from cptest.run.supervisor import GpuQueryUnavailable, GpuReading, Supervisor

from conftest import FAKE_ENGINE, alive, fake_node, fake_server, free_port, make_plan, wait_until  # isort: skip

ROOT = Path(__file__).resolve().parents[2]


def no_gpu() -> GpuReading:
    raise GpuQueryUnavailable("no GPU in tests")


# ------------------------------------------------------------------------------------ interpreter
def test_a_cptest_module_runs_on_cptest_own_interpreter_not_the_first_python3_on_path() -> None:
    argv = ["python3", "-m", "cptest.reference.server", "--port", "1"]
    assert own_interpreter(argv) == [sys.executable, "-m", "cptest.reference.server", "--port", "1"]
    # Even when PATH has no python3 at all (pipx, a venv called by its full path).
    assert resolve_argv(argv, {"PATH": "/nonexistent"})[0] == sys.executable


def test_other_argvs_keep_their_interpreter() -> None:
    for argv in (["python3", "-m", "sglang.launch_server"], ["python3", "script.py"],
                 ["/opt/sglang/bin/python3", "-m", "cptest.reference.server"]):
        assert own_interpreter(argv) == argv


def test_launched_records_the_executable_argv_zero_resolved_to(tmp_path: Path, port: int) -> None:
    writer = RecordWriter(tmp_path / "r.jsonl")
    with Supervisor(ProcessLauncher(), gpu_query=no_gpu) as sup:
        sup.start(fake_node(port), tmp_path / "engine.log", {}, "main", writer)
    (launched,) = [r for r in read_records(tmp_path / "r.jsonl")[0]
                   if isinstance(r, Lifecycle) and r.event == "launched"]
    assert launched.detail["executable"] == sys.executable or launched.detail["executable"].startswith("<")


# ------------------------------------------------------------------------------------ the gate
def test_the_gate_runs_nothing_when_cptest_dies_before_the_go_byte(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    r, w = os.pipe()
    engine = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    gate = subprocess.Popen(gated_argv(engine, r, None), pass_fds=(r,), start_new_session=True)
    os.close(r)
    os.close(w)  # what cptest's death does to the write end
    assert gate.wait(10) == GATE_EXIT
    assert not marker.exists()


def test_the_gate_execs_the_engine_in_its_own_pid_with_the_cpus_after_the_go_byte(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    cpu = sorted(os.sched_getaffinity(0))[0]
    code = (f"import json, os; json.dump([os.getpid(), os.getsid(0), sorted(os.sched_getaffinity(0))], "
            f"open({str(out)!r}, 'w'))")
    r, w = os.pipe()
    gate = subprocess.Popen(gated_argv([sys.executable, "-c", code], r, [cpu]), pass_fds=(r,),
                            start_new_session=True)
    os.close(r)
    os.write(w, b"g")
    os.close(w)
    assert gate.wait(20) == 0
    assert json.loads(out.read_text()) == [gate.pid, gate.pid, [cpu]]


def test_the_reaper_acts_on_its_lifeline_closing_at_once(tmp_path: Path) -> None:
    tree = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    me = psutil.Process(os.getpid())
    # The owner named on the command line is alive (this test): only the lifeline says it is gone.
    reaper = subprocess.Popen([sys.executable, "-m", "cptest.run.reaper", str(me.pid), repr(me.create_time()),
                               str(tree.pid)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert reaper.stdout is not None and reaper.stdin is not None
        assert select.select([reaper.stdout], [], [], 30)[0] and reaper.stdout.readline() == b"ready\n"
        t0 = time.monotonic()
        reaper.stdin.close()
        assert tree.wait(10) == -signal.SIGKILL
        assert time.monotonic() - t0 < 2.0
        assert reaper.wait(10) == 0
    finally:
        tree.kill()
        reaper.kill()


def test_sigkill_of_cptest_right_after_the_spawn_leaves_nothing() -> None:
    """A slice of `benchmarks/sigkill_coverage.py`: fake-engine runs SIGKILLed within 50 ms of the
    engine's spawn and later, 0 processes and 0 bound ports left."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sigkill_coverage.py"), "--points", "6",
                        "--early", "4", "--reference-points", "0", "--settle", "10"],
                       capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout[r.stdout.index("{"):])
    assert summary["processes_left"] == 0 and summary["ports_left_bound"] == 0
    assert summary["within_50ms_of_spawn"] >= 3


# ------------------------------------------------------------------------------------ the port
def test_serves_tells_this_tree_from_another_listener(tmp_path: Path, port: int) -> None:
    launcher = ProcessLauncher(reaper=False)
    handle = launcher.start(fake_node(port), tmp_path / "engine.log", {})
    other = socket.socket()
    try:
        wait_until(lambda: handle.serves(port)[0] is not None, 20, "the fake engine to listen")
        assert handle.serves(port) == (True, [handle.session])
        other.bind(("127.0.0.1", 0))
        other.listen()
        foreign_port = other.getsockname()[1]
        assert handle.serves(foreign_port) == (False, [os.getpid()])
        assert handle.serves(free_port()) == (None, [])
    finally:
        other.close()
        assert launcher.teardown(handle, grace_s=2).leftover_pids == []


def test_a_server_of_another_run_on_our_port_never_makes_this_run_ready(tmp_path: Path) -> None:
    """Our engine never binds the planned port (it serves elsewhere), while another run's server
    answers 200 there: readiness must not count it, and the launch fails naming the other process."""
    taken, ours = free_port(), free_port()
    theirs = subprocess.Popen([sys.executable, str(FAKE_ENGINE), "--port", str(taken)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        main = fake_server("main", ours, ready_timeout_s=4.0)
        main = main.model_copy(update={"base_url": f"http://127.0.0.1:{taken}"})
        wait_until(lambda: _answers(taken), 20, "the other run's server")
        outcome = run_plan(make_plan(main, n=2), tmp_path / "run", launcher=ProcessLauncher(),
                           log=null_logger(), options=RunOptions(gpu_query=no_gpu, ready_poll_s=0.1,
                                                                 gpu_settle_s=0))
        assert not outcome.main.ready
        records = read_records(tmp_path / "run" / "evidence" / "main" / "runner.jsonl")[0]
        events = {r.event: r for r in records if isinstance(r, Lifecycle)}
        assert "ready" not in events
        assert events["port_foreign"].detail["pids"] == [theirs.pid]
        assert f"pid {theirs.pid}" in events["launch_failed"].detail["reason"]
    finally:
        os.killpg(theirs.pid, signal.SIGKILL)
        theirs.wait()


def test_ready_names_the_listener_of_this_tree(tmp_path: Path) -> None:
    port = free_port()
    outcome = run_plan(make_plan(fake_server("main", port), n=2), tmp_path / "run",
                       launcher=ProcessLauncher(), log=null_logger(),
                       options=RunOptions(gpu_query=no_gpu, ready_poll_s=0.1, gpu_settle_s=0))
    assert outcome.main.ready
    records = read_records(tmp_path / "run" / "evidence" / "main" / "runner.jsonl")[0]
    (ready,) = [r for r in records if isinstance(r, Lifecycle) and r.event == "ready"]
    launched = next(r for r in records if isinstance(r, Lifecycle) and r.event == "launched")
    assert ready.detail["identity"] == "tree" and ready.detail["port"] == port
    assert ready.detail["listener_pids"] == [launched.detail["pid"]]


def _answers(port: int) -> bool:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/health_generate", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# ------------------------------------------------------------------------------------ orphans
TITLED = ("import setproctitle, sys, time; setproctitle.setproctitle(sys.argv[1]); "
          "print('up', flush=True); time.sleep(60)")


def test_an_engine_process_of_another_session_is_foreign(tmp_path: Path, port: int) -> None:
    writer = RecordWriter(tmp_path / "r.jsonl")
    # A stranger: an engine-titled process in a session of its own, unlabelled (its title hides
    # its environment anyway): before issue 14 it counted as this run's orphan.
    stranger = subprocess.Popen([sys.executable, "-c", TITLED, "sglang::scheduler_TP9"],
                                stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert stranger.stdout is not None and stranger.stdout.readline() == b"up\n"
        with Supervisor(ProcessLauncher(reaper=False), gpu_query=no_gpu) as sup:
            owned = sup.start(fake_node(port), tmp_path / "engine.log", {"cptest.run": "r1"}, "main", writer)
            wait_until(lambda: len(owned.handle.pids()) >= 5, 20, "the fake tree")
            sup.sample("after", "main", writer, host=True)
        (sample,) = [r for r in read_records(tmp_path / "r.jsonl")[0] if isinstance(r, ProcessSample)]
        scopes = {p["pid"]: p["scope"] for p in sample.procs}
        assert scopes[stranger.pid] == "foreign"
    finally:
        stranger.kill()
        stranger.wait()


def test_a_stray_in_this_runs_session_is_this_runs_orphan(tmp_path: Path, port: int) -> None:
    """The fake engine's schedulers are in its session; one that outlived its tree (SIGKILLed
    server, scheduler left) is listed as this run's (`host`), not `foreign`."""
    writer = RecordWriter(tmp_path / "r.jsonl")
    with Supervisor(ProcessLauncher(reaper=False), gpu_query=no_gpu) as sup:
        owned = sup.start(fake_node(port), tmp_path / "engine.log", {}, "main", writer)
        wait_until(lambda: len(owned.handle.pids()) >= 5, 20, "the fake tree")
        sup.sample("running", "main", writer)
        # The schedulers are the head's children: a title test would also catch a helper caught
        # between fork and exec, which still wears its scheduler's title and then loses it.
        head = owned.handle.main_pid()
        sched = [p for p in owned.handle.pids() if psutil.Process(p).ppid() == head]
        assert len(sched) == 2
        owned.handle.known.clear()  # forget the tree: its schedulers are now strays to the sampler
        real = owned.handle.alive_pids
        owned.handle.alive_pids = lambda: [p for p in real() if p not in sched]  # type: ignore[method-assign]
        sup.sample("after", "main", writer, host=True)
        owned.handle.alive_pids = real  # type: ignore[method-assign]
    samples = [r for r in read_records(tmp_path / "r.jsonl")[0] if isinstance(r, ProcessSample)]
    scopes = {p["pid"]: p["scope"] for p in samples[-1].procs}
    assert sched and all(scopes.get(p) == "host" for p in sched)
    assert alive(sched) == []


class _Handle:
    def __init__(self, answer: tuple[bool | None, list[int]] | None) -> None:
        if answer is not None:
            self.serves = lambda port: answer


class _Owned:
    def __init__(self, answer: tuple[bool | None, list[int]] | None) -> None:
        self.handle = _Handle(answer)


def test_whose_server_answers_is_this_runs_if_any_node_listens_and_unverified_without_a_way_to_ask() -> None:
    from cptest.run.runner import who_serves

    assert who_serves([_Owned((False, [7])), _Owned((True, [9]))], 1) == (True, [7, 9])  # type: ignore[list-item]
    assert who_serves([_Owned((False, [7]))], 1) == (False, [7])  # type: ignore[list-item]
    assert who_serves([_Owned(None)], 1) == (None, [])  # type: ignore[list-item]  # a container
    assert who_serves([_Owned((None, []))], 1) == (None, [])  # type: ignore[list-item]
