"""The docker launcher against a real Docker-API engine (Podman's service in CI).

Start the engine with `set -a; eval "$(.ci/container-engine.sh start)"; set +a`. Without an engine
that answers, every test here is skipped with the reason; CI runs the service, so there they run.
The test image and its digest come from the file the script writes ($CPTEST_TEST_IMAGES); each
test builds its own lock from it and labels its containers with a fresh run id.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import docker.errors
import httpx
import psutil
import pytest

from cptest.errors import RunError
from cptest.image.lock import ImageLock
from cptest.plan.model import NodeLaunch
from cptest.run.container_config import (
    LABEL_LAUNCHER,
    LABEL_NODE,
    LABEL_ROLE,
    LABEL_RUN,
    LABEL_SCENARIO,
    container_config,
    container_labels,
)
from cptest.run.docker import DockerLauncher, engine_gpu_access, iter_labelled
from cptest.run.launcher import Handle, Launcher

ENGINE_DIR = Path(os.environ.get("CPTEST_ENGINE_DIR", "/tmp/cptest-engine"))
BASE_URL = os.environ.get("DOCKER_HOST") or f"unix://{ENGINE_DIR / 'podman.sock'}"
IMAGES_FILE = Path(os.environ.get("CPTEST_TEST_IMAGES", str(ENGINE_DIR / "test-images.json")))
IMAGE = "localhost/cptest-busybox:test"
WRONG_DIGEST = "sha256:" + "0" * 64


def _engine() -> tuple[docker.DockerClient | None, str]:
    try:
        client = docker.DockerClient(base_url=BASE_URL, timeout=30)
        client.ping()
    except Exception as e:  # noqa: BLE001 - any failure means: no engine here
        return None, f"no container engine answers at {BASE_URL} ({type(e).__name__}); " \
                     "run: set -a; eval \"$(.ci/container-engine.sh start)\"; set +a"
    if not IMAGES_FILE.exists():
        return None, f"{IMAGES_FILE} is missing; .ci/container-engine.sh start writes it"
    return client, ""


CLIENT, WHY = _engine()
if CLIENT is None and os.environ.get("CPTEST_REQUIRE_ENGINE") == "1":
    # CI sets this (container-engine.sh prints it): there a missing engine is a failure, not a skip.
    raise RuntimeError(WHY)
pytestmark = pytest.mark.skipif(CLIENT is None, reason=WHY)


def retry(fn: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if fn():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture
def lock() -> ImageLock:
    digests = json.loads(IMAGES_FILE.read_text())
    return ImageLock.from_data(
        {"lock_version": 1, "images": {ref: {"digest": d, "status": "pinned"} for ref, d in digests.items()}},
        "test-lock.json",
    )


@pytest.fixture
def labels() -> Iterator[dict[str, str]]:
    """Fresh run labels; anything still carrying them at the end is removed (and fails the test)."""
    run = container_labels(f"test-{uuid.uuid4().hex[:12]}", "main", "docker_tests")
    yield run
    assert CLIENT is not None
    left = list(iter_labelled(CLIENT, run))
    for c in left:
        c.remove(force=True)
    assert not left, f"containers left behind: {[c.short_id for c in left]}"


def node(argv: list[str], *, rank: int = 0, env: dict[str, str] | None = None) -> NodeLaunch:
    return NodeLaunch(node_rank=rank, image=IMAGE, gpu_ids=[], env=env or {}, argv=argv, port=0)


def remaining(labels: dict[str, str]) -> list[str]:
    assert CLIENT is not None
    return [c.short_id for c in iter_labelled(CLIENT, labels)]


SLEEPER = ["sh", "-c", "echo ready; sleep 1000"]


def test_docker_launcher_and_handle_follow_the_launcher_protocol(lock: ImageLock, labels, tmp_path):
    with DockerLauncher(lock=lock, base_url=BASE_URL) as launcher:
        assert isinstance(launcher, Launcher)
        handle = launcher.start(node(SLEEPER), tmp_path / "n0.log", labels)
        assert isinstance(handle, Handle)


def test_container_carries_run_role_node_scenario_and_launcher_labels(lock: ImageLock, labels, tmp_path):
    with DockerLauncher(lock=lock, base_url=BASE_URL) as launcher:
        handle = launcher.start(node(SLEEPER, rank=3), tmp_path / "n3.log", labels)
        got = CLIENT.containers.get(handle.container_id).labels
        assert {k: got[k] for k in (LABEL_RUN, LABEL_ROLE, LABEL_SCENARIO)} == labels
        assert got[LABEL_NODE] == "3"
        assert got[LABEL_LAUNCHER] == "docker"


def test_container_runs_argv_with_env_and_its_output_goes_to_the_node_log(lock: ImageLock, labels, tmp_path):
    log = tmp_path / "logs" / "n0.log"
    # $X is expanded by the container's sh, not by us: argv reaches the container as a list.
    argv = ["sh", "-c", 'echo "out $X"; echo "err $X" >&2; exit 4']
    with DockerLauncher(lock=lock, base_url=BASE_URL) as launcher:
        handle = launcher.start(node(argv, env={"X": "42"}), log, labels)
        retry(lambda: handle.poll() is not None, 20, "the container to exit")
        assert handle.poll() == 4
        info = launcher.teardown(handle)
    assert info.status == 4
    text = log.read_text()
    assert "out 42" in text and "err 42" in text


def test_container_on_host_network_serves_http_to_the_host(lock: ImageLock, labels, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["httpd", "-f", "-p", f"127.0.0.1:{port}", "-h", "/www"]
    with DockerLauncher(lock=lock, base_url=BASE_URL) as launcher:
        handle = launcher.start(node(argv), tmp_path / "n0.log", labels)

        def serves() -> bool:
            assert handle.poll() is None, (tmp_path / "n0.log").read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/index.html", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        retry(serves, 20, f"httpd on 127.0.0.1:{port}")
        assert httpx.get(f"http://127.0.0.1:{port}/index.html").text.strip() == "cptest-busybox"


def test_pids_are_host_pids_with_the_main_process_first(lock: ImageLock, labels, tmp_path):
    argv = ["sh", "-c", "sleep 1001 & sleep 1002; echo done"]
    with DockerLauncher(lock=lock, base_url=BASE_URL) as launcher:
        handle = launcher.start(node(argv), tmp_path / "n0.log", labels)
        retry(lambda: len(handle.pids()) >= 3, 20, "sh and two sleeps")
        pids = handle.pids()
        assert pids[0] == handle.main_pid()
        cmdlines = {" ".join(psutil.Process(p).cmdline()) for p in pids}
        assert {"sleep 1001", "sleep 1002"} <= cmdlines
        assert "sh -c sleep 1001 & sleep 1002; echo done" in " ".join(psutil.Process(pids[0]).cmdline())


def test_send_signal_reaches_the_main_process(lock: ImageLock, labels, tmp_path):
    log = tmp_path / "n0.log"
    argv = ["sh", "-c", "trap 'echo got-usr1; exit 7' USR1; echo ready; while true; do sleep 0.1; done"]
    with DockerLauncher(lock=lock, base_url=BASE_URL) as launcher:
        handle = launcher.start(node(argv), log, labels)
        retry(lambda: log.exists() and "ready" in log.read_text(), 20, "the trap to be set")
        handle.send_signal(signal.SIGUSR1)
        retry(lambda: handle.poll() is not None, 20, "the container to exit on SIGUSR1")
        assert handle.poll() == 7
        launcher.teardown(handle)
    assert "got-usr1" in log.read_text()


def test_a_signal_death_reads_as_minus_the_signal_like_subprocess(lock: ImageLock, labels, tmp_path):
    with DockerLauncher(lock=lock, base_url=BASE_URL) as launcher:
        handle = launcher.start(node(SLEEPER), tmp_path / "n0.log", labels)
        retry(lambda: handle.main_pid() is not None, 20, "the main process")
        handle.send_signal(signal.SIGKILL)
        retry(lambda: handle.poll() is not None, 20, "the container to exit on SIGKILL")
        assert handle.poll() == -signal.SIGKILL


def test_teardown_removes_the_container_leaves_no_process_and_is_idempotent(lock, labels, tmp_path):
    launcher = DockerLauncher(lock=lock, base_url=BASE_URL)
    argv = ["sh", "-c", "sleep 1001 & sleep 1002; echo done"]
    handle = launcher.start(node(argv), tmp_path / "n0.log", labels)
    retry(lambda: len(handle.pids()) >= 3, 20, "the process tree")
    pids = handle.pids()
    info = launcher.teardown(handle, grace_s=2)
    assert info.status is not None and info.leftover_pids == []
    assert remaining(labels) == []
    assert not any(psutil.pid_exists(p) and "sleep 100" in " ".join(psutil.Process(p).cmdline())
                   for p in pids)
    assert launcher.teardown(handle) == info
    assert launcher.handles() == []


def test_teardown_sends_sigterm_first_and_lets_the_node_end_itself(lock: ImageLock, labels, tmp_path):
    log = tmp_path / "n0.log"
    argv = ["sh", "-c", "trap 'echo got-term; exit 0' TERM; echo ready; while true; do sleep 0.1; done"]
    launcher = DockerLauncher(lock=lock, base_url=BASE_URL)
    handle = launcher.start(node(argv), log, labels)
    retry(lambda: "ready" in log.read_text() if log.exists() else False, 20, "the trap to be set")
    info = launcher.teardown(handle, grace_s=10)
    assert info.status == 0
    assert "got-term" in log.read_text()


def test_normal_end_of_the_with_block_removes_every_container(lock: ImageLock, labels, tmp_path):
    with DockerLauncher(lock=lock, base_url=BASE_URL) as launcher:
        for rank in range(2):
            launcher.start(node(SLEEPER, rank=rank), tmp_path / f"n{rank}.log", labels)
        assert len(remaining(labels)) == 2
    assert remaining(labels) == []


def test_an_exception_inside_the_with_block_removes_every_container(lock: ImageLock, labels, tmp_path):
    with pytest.raises(ValueError), DockerLauncher(lock=lock, base_url=BASE_URL) as launcher:
        launcher.start(node(SLEEPER), tmp_path / "n0.log", labels)
        raise ValueError("workload failed")
    assert remaining(labels) == []


def test_ctrl_c_inside_the_with_block_removes_every_container(lock: ImageLock, labels, tmp_path):
    with pytest.raises(KeyboardInterrupt), DockerLauncher(lock=lock, base_url=BASE_URL) as launcher:
        launcher.start(node(SLEEPER), tmp_path / "n0.log", labels)
        raise KeyboardInterrupt
    assert remaining(labels) == []


def test_a_timeout_while_waiting_on_a_node_removes_every_container(lock: ImageLock, labels, tmp_path):
    class Deadline(Exception):
        """Not TimeoutError: that is socket.timeout, which the HTTP client would swallow and rewrap."""

    def deadline(signum, frame):
        raise Deadline("run deadline")

    previous = signal.signal(signal.SIGALRM, deadline)
    try:
        with pytest.raises(Deadline), DockerLauncher(lock=lock, base_url=BASE_URL) as launcher:
            handle = launcher.start(node(SLEEPER), tmp_path / "n0.log", labels)
            signal.alarm(1)
            handle.container.wait()  # blocks until the deadline interrupts it
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert remaining(labels) == []


def test_an_image_whose_digest_differs_from_the_lock_is_refused_and_nothing_is_created(labels, tmp_path):
    lock = ImageLock.from_data({"lock_version": 1, "images": {IMAGE: {"digest": WRONG_DIGEST}}}, "lock.json")
    actual = json.loads(IMAGES_FILE.read_text())[IMAGE]
    with DockerLauncher(lock=lock, base_url=BASE_URL) as launcher, pytest.raises(RunError) as err:
        launcher.start(node(SLEEPER), tmp_path / "n0.log", labels)
    assert err.value.exit_code == 3
    problem = err.value.problems[0]
    assert problem.expected == WRONG_DIGEST
    assert actual in (problem.found or "")
    assert WRONG_DIGEST in str(err.value) and actual in str(err.value) and "pin it" in str(err.value)
    assert remaining(labels) == []
    assert not (tmp_path / "n0.log").exists()


def test_an_image_missing_from_the_lock_is_refused_with_the_closest_reference(labels, tmp_path):
    lock = ImageLock.from_data({"lock_version": 1, "images": {"localhost/cptest-busybox:tset": {
        "digest": WRONG_DIGEST}}}, "lock.json")
    with DockerLauncher(lock=lock, base_url=BASE_URL) as launcher, pytest.raises(RunError) as err:
        launcher.start(node(SLEEPER), tmp_path / "n0.log", labels)
    assert "is not pinned" in str(err.value)
    assert "did you mean 'localhost/cptest-busybox:tset'" in str(err.value)
    assert remaining(labels) == []


def test_an_unbuilt_lock_entry_is_refused_with_how_to_build_it(labels, tmp_path):
    lock = ImageLock.from_data({"lock_version": 1, "images": {IMAGE: {
        "digest": None, "status": "unbuilt", "build": "docker build -f images/Dockerfile.x ."}}}, "lock.json")
    with DockerLauncher(lock=lock, base_url=BASE_URL) as launcher, pytest.raises(RunError) as err:
        launcher.start(node(SLEEPER), tmp_path / "n0.log", labels)
    assert "unbuilt" in str(err.value) and "docker build -f images/Dockerfile.x ." in str(err.value)
    assert remaining(labels) == []


def test_a_pinned_image_absent_from_the_engine_is_refused_and_never_pulled(labels, tmp_path):
    ref = "localhost/cptest-absent:never"
    lock = ImageLock.from_data({"lock_version": 1, "images": {ref: {"digest": WRONG_DIGEST}}}, "lock.json")
    absent = NodeLaunch(node_rank=0, image=ref, gpu_ids=[], env={}, argv=SLEEPER, port=0)
    with DockerLauncher(lock=lock, base_url=BASE_URL) as launcher, pytest.raises(RunError) as err:
        launcher.start(absent, tmp_path / "n0.log", labels)
    assert "not present" in str(err.value) and "never pulls" in str(err.value)


def test_sweep_removes_leftovers_of_a_crashed_run_by_label_and_spares_others(lock, labels, tmp_path):
    other = {**labels, LABEL_RUN: labels[LABEL_RUN] + "-other"}
    crashed = DockerLauncher(lock=lock, base_url=BASE_URL)
    for rank in range(2):
        crashed.start(node(SLEEPER, rank=rank), tmp_path / f"n{rank}.log", labels)
    bystander = crashed.start(node(SLEEPER), tmp_path / "other.log", other)
    # The crashed process never tore down; a new one sweeps by the run's labels.
    fresh = DockerLauncher(lock=lock, base_url=BASE_URL)
    removed = fresh.sweep({LABEL_RUN: labels[LABEL_RUN]})
    assert len(removed) == 2 and all(r.startswith("container ") for r in removed)
    assert remaining(labels) == []
    assert remaining(other) == [bystander.container.short_id]
    assert fresh.sweep({LABEL_RUN: labels[LABEL_RUN]}) == []
    crashed.teardown(bystander, grace_s=0)
    assert remaining(other) == []


def test_an_engine_that_does_not_answer_is_a_run_error_saying_how_to_start_one(lock: ImageLock, tmp_path):
    launcher = DockerLauncher(lock=lock, base_url=f"unix://{tmp_path / 'nothing.sock'}")
    with pytest.raises(RunError) as err:
        launcher.start(node(SLEEPER), tmp_path / "n0.log", {LABEL_RUN: "x"})
    assert err.value.exit_code == 3
    assert "no container engine answers" in str(err.value) and "container-engine.sh start" in str(err.value)


def test_podman_gets_gpus_as_device_nodes_and_passes_them_in(labels, tmp_path):
    """Podman's Docker-compatible API ignores device requests (podman#22645), so the launcher hands
    it device nodes: this engine is recognised as Podman, and a node given in the form the launcher
    builds reaches the container (/dev/zero standing in for a GPU's node on a machine without one)."""
    assert CLIENT is not None
    assert engine_gpu_access(CLIENT) == "device_nodes"
    cfg = container_config(node(["sh", "-c", "ls -l /dev/nvidia0; head -c 4 /dev/nvidia0 | od -An -tx1"]),
                           labels, device_nodes=["/dev/zero:/dev/nvidia0:rwm"])
    cfg.pop("detach")
    container = CLIENT.containers.create(**cfg)
    try:
        container.start()
        assert container.wait(timeout=60)["StatusCode"] == 0
        out = container.logs().decode()
    finally:
        container.remove(force=True)
    assert out.lstrip().startswith("c")  # a character device
    assert out.split()[-4:] == ["00", "00", "00", "00"]
