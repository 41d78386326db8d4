"""The docker launcher: one container per planned node, through the Docker Engine API.

Contract (the `Launcher` protocol of `cptest.run.launcher`, plus what containers add):

- An image runs only if `images/lock.json` (read through `cptest.image.lock`, its one owner) pins it
  and the local image has the pinned digest (its image ID, or the digest part of one of its repo
  digests). An image that is missing from the lock, marked `"status": "unbuilt"`, absent locally, or
  of another digest is refused with a `RunError` (exit 3) *before* anything is created. Images are
  never pulled implicitly.
- `pin_images(plan)`, which the pipeline calls before the archive is begun, does that check for every
  node of every server at once and returns the plan with the images it will run: a node that names
  no image gets the lock's image for its engine (`"engine": "reference"`: the reference engine's
  image, `cptest image build reference`), and `pins.image`/`pins.image_digest` record the verified
  digest, so plan.json and the manifest say what ran. A refusal there is `InfrastructureError`
  (`unknown (image_...)`, exit 3, nothing launched or archived; docs/containers.md, section 4).
- An image whose lock entry has `cptest_mount` gets the running cptest package mounted read-only at
  `<cptest_mount>/cptest`, with PYTHONPATH set to it (the reference image holds no cptest).
- A container runs `node.argv` as an argv list (never a shell string) under an init process
  (`init=True`): SGLang kills its own process group with SIGKILL on shutdown, which the kernel
  ignores for a namespace's pid 1, and the init also reaps zombies. `send_signal` therefore goes to
  the init, which forwards it to the main process only.
- Host networking and host IPC (NCCL and SGLang's shared memory need them); the model directory is
  mounted read-only at the same path, the probe directory (the launcher's, else the node's
  `CPTEST_PROBE_DIR`, where the runner tells the ranks to write) read-write at the same path.
- GPUs are a device request for exactly `node.gpu_ids` (none when the list is empty). Inside the
  container those GPUs are numbered from 0, so `CUDA_VISIBLE_DEVICES` is rewritten to `0..n-1`.
  Podman's Docker-compatible API accepts a device request and ignores it (podman#22645: the
  container starts without GPUs), so on Podman the GPUs go in as device nodes instead: each GPU's
  `/dev/nvidia<minor>` (NVML's minor number) and the driver's control nodes, plus the lock entry's
  `driver_mounts` read-only (the driver's user-space libraries, which NVIDIA's runtime hook would
  have added). The node's log begins with a line saying which way its GPUs were attached.
- Every container carries the caller's labels plus `cptest.node` and `cptest.launcher=docker`;
  `sweep(labels)` removes every container carrying them (crash recovery).
- The launcher remembers every container it created (registered right after create, before start)
  and, used as a context manager, tears all of them down on every exit path: normal end, exception,
  KeyboardInterrupt, timeout.

Docker SDK and engine errors are turned into `RunError` here; they never reach the user raw.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import psutil
import requests.exceptions

from cptest.errors import Problem, RunError
from cptest.image.lock import BUILD_HINT, ImageLock, lock_path
from cptest.plan.model import NodeLaunch, Plan
from cptest.run import gpu
from cptest.run.container_config import (
    LABEL_LAUNCHER,
    LABEL_NODE,
    container_config,
    gpu_access_of,
    gpu_device_nodes,
)
from cptest.run.launcher import ExitInfo
from cptest.run.preflight import Cause, InfrastructureError

log = logging.getLogger(__name__)

# Exit statuses above 128 are the init's report of a signal death (128 + N); the process launcher
# reports those as -N (subprocess convention), and the two launchers must agree (ExitInfo.status).
_SIGNAL_BASE = 128
_MAX_SIGNAL = 64


def image_digests(attrs: Mapping[str, Any]) -> list[str]:
    """Every digest that identifies a local image: its ID, then the digest of each repo digest."""
    digests = [str(attrs.get("Id", ""))]
    for rd in attrs.get("RepoDigests") or []:
        digests.append(str(rd).rsplit("@", 1)[-1])
    return [d for d in digests if d]


class ImageRefused(RunError):
    """An image the launcher will not run; `code` is its preflight cause (`image_unpinned`: not in
    the lock or unbuilt, `image_missing`: not in the engine, `image_mismatch`: another digest)."""

    def __init__(self, code: str, problem: Problem) -> None:
        self.code = code
        super().__init__(problem)


def verify_image(client: docker.DockerClient, reference: str, lock: ImageLock) -> str:
    """The pinned digest of `reference` after checking the local image has it; ImageRefused (a
    RunError, exit 3) otherwise."""
    try:
        pinned = lock.entry(reference)
    except RunError as e:
        raise ImageRefused("image_unpinned", e.problems[0]) from None
    try:
        image = client.images.get(reference)
    except docker.errors.ImageNotFound:
        raise ImageRefused("image_missing", Problem(
            None, f"image {reference!r} is not present in the container engine",
            expected=pinned.digest, hint=f"{pinned.build or BUILD_HINT} (cptest never pulls implicitly)",
        )) from None
    except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
        raise _engine_error(f"looking up image {reference!r}", e) from None
    local = image_digests(image.attrs)
    if pinned.digest not in local:
        raise ImageRefused("image_mismatch", Problem(
            None, f"image {reference!r} does not match its pin in {lock.path}",
            expected=pinned.digest, found=", ".join(local),
            hint=(f"load the pinned image ({pinned.build or 'images/README.md'}), or, if the local image is "
                  f"the one intended, pin it: set its digest to {local[0]} in {lock.path}"),
        ))
    return str(pinned.digest)


def engine_gpu_access(client: docker.DockerClient) -> str:
    """How this engine attaches GPUs: "device_requests" (Docker, through NVIDIA's runtime hook) or
    "device_nodes" (Podman, whose Docker-compatible API ignores device requests)."""
    try:
        return gpu_access_of(client.version())
    except (docker.errors.DockerException, requests.exceptions.RequestException):
        return "device_requests"


def engine_client(base_url: str | None = None, timeout_s: float = 60.0) -> docker.DockerClient:
    """A client of the engine at `base_url` ($DOCKER_HOST, else Docker's socket) that answered a
    ping; RunError saying how to start one otherwise."""
    url = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.DockerClient(base_url=url, timeout=int(timeout_s))
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
        raise RunError(Problem(
            None, f"no container engine answers at {url}: {e}",
            hint="start one (.ci/container-engine.sh start for Podman) or set DOCKER_HOST",
        )) from None
    return client


def exit_status(code: int | None) -> int | None:
    """A container exit code in subprocess terms: 128+N (a signal death, as the init reports it) -> -N."""
    if code is None:
        return None
    if _SIGNAL_BASE < code <= _SIGNAL_BASE + _MAX_SIGNAL:
        return -(code - _SIGNAL_BASE)
    return code


def _engine_error(doing: str, e: BaseException) -> RunError:
    explanation = getattr(e, "explanation", None) or str(e)
    return RunError(Problem(None, f"container engine failed while {doing}: {explanation}"))


# --------------------------------------------------------------------------------------------------
# Handles and the launcher


@dataclass
class DockerHandle:
    """A started node: its container, the log follower, and what was observed at its end."""

    node: NodeLaunch
    log_path: Path
    container: Any
    """docker.models.containers.Container."""
    image_digest: str
    _log_thread: threading.Thread | None = None
    _status: int | None = None
    _ended_at: float | None = None
    _gone: bool = False

    @property
    def container_id(self) -> str:
        return str(self.container.id)

    def _state(self) -> dict[str, Any] | None:
        """The container's State, or None once it no longer exists."""
        if self._gone:
            return None
        try:
            self.container.reload()
        except docker.errors.NotFound:
            self._gone = True
            return None
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise _engine_error(f"inspecting container {self.container_id[:12]}", e) from None
        return dict(self.container.attrs.get("State") or {})

    def _init_pid(self) -> int | None:
        state = self._state()
        pid = int(state.get("Pid") or 0) if state else 0
        return pid if pid > 0 and state and state.get("Running") else None

    def main_pid(self) -> int | None:
        """Host pid of the node's main process (the init's child), or None if not running here."""
        pid = self._init_pid()
        if pid is None:
            return None
        if self.container.attrs.get("HostConfig", {}).get("Init"):
            try:
                children = psutil.Process(pid).children()
            except psutil.Error:
                return None
            return children[0].pid if children else None
        return pid

    def pids(self) -> list[int]:
        """Host pids of the node's processes, main process first (the init is left out).

        Docker's `top` lists host pids; Podman's lists the container's own pid namespace. Those are
        mapped to host pids through /proc/<pid>/status NSpid when the engine runs on this host; when
        nothing maps (a remote engine), only the container's main pid is known.
        """
        init_pid = self._init_pid()
        if init_pid is None:
            return []
        try:
            top = self.container.top()
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            top = {}
        listed = _top_pids(top)
        local = _descendants_by_nspid(init_pid)
        if init_pid in listed:  # Docker: already host pids
            host = listed
        elif local:
            host = [local[p] for p in listed if p in local] or list(local.values())
        else:
            return [init_pid]
        main = self.main_pid()
        host = [p for p in host if p != init_pid] if self.container.attrs["HostConfig"].get("Init") else host
        host.sort(key=lambda p: (p != main, p))
        return host

    def poll(self) -> int | None:
        """Exit status (subprocess convention) once the container has exited, else None."""
        if self._status is not None:
            return self._status
        state = self._state()
        if state is None or state.get("Running") or state.get("Status") in ("created", "running", "paused"):
            return None
        self._status = exit_status(int(state.get("ExitCode", 0)))
        self._ended_at = time.monotonic()
        return self._status

    def send_signal(self, sig: int) -> None:
        """Deliver `sig` to the main process (through the init, which forwards it)."""
        try:
            self.container.kill(signal=int(sig))
        except docker.errors.NotFound:
            self._gone = True
        except docker.errors.APIError as e:
            # Signalling a container that has just exited is not an error (Popen.send_signal agrees).
            if self.poll() is None:
                raise _engine_error(f"signalling container {self.container_id[:12]}", e) from None


def _top_pids(top: Mapping[str, Any]) -> list[int]:
    """PIDs out of a `top` answer. Podman may put a whole ps line in one column: take its first number."""
    titles = [str(t) for t in top.get("Titles") or []]
    if not titles:
        return []
    col = next((i for i, t in enumerate(titles) if t.split() and t.split()[0] == "PID"), None)
    if col is None:
        return []
    pids: list[int] = []
    for row in top.get("Processes") or []:
        if col < len(row):
            first = str(row[col]).split()
            if first and first[0].isdigit():
                pids.append(int(first[0]))
    return pids


def _descendants_by_nspid(init_pid: int) -> dict[int, int]:
    """{pid in the container's namespace: host pid} for the init and its descendants on this host."""
    try:
        proc = psutil.Process(init_pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return {}
    mapping: dict[int, int] = {}
    for p in procs:
        try:
            status = Path(f"/proc/{p.pid}/status").read_text()
        except OSError:
            continue
        m = re.search(r"^NSpid:\s+(.*)$", status, re.MULTILINE)
        if m:
            mapping[int(m.group(1).split()[-1])] = p.pid
    return mapping


class DockerLauncher:
    """Starts each planned node as a container; owns every container it created until torn down.

    Use it as a context manager (or call `close()`) so that no container outlives the run on any
    exit path. `start` raises RunError (never a Docker exception) and creates nothing when the
    image is not pinned or its digest differs from the lock.
    """

    name = "docker"

    def __init__(
        self,
        *,
        lock: ImageLock | Path | str | None = None,
        base_url: str | None = None,
        client: docker.DockerClient | None = None,
        probe_dir: Path | None = None,
        ipc_mode: str = "host",
        shm_size: str | None = "16g",
        init: bool = True,
        api_timeout_s: float = 60.0,
    ) -> None:
        """`base_url` defaults to $DOCKER_HOST (then the SDK's default socket); `lock` to `lock_path()`."""
        self.lock = lock if isinstance(lock, ImageLock) else ImageLock.load(lock or lock_path())
        self.base_url = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self.probe_dir = probe_dir
        self.ipc_mode = ipc_mode
        self.shm_size = shm_size
        self.init = init
        self._client = client
        self._api_timeout_s = api_timeout_s
        self._handles: list[DockerHandle] = []
        self._lock = threading.Lock()
        self._gpu_access: str | None = None

    # -- the engine

    @property
    def client(self) -> docker.DockerClient:
        """A connected client; RunError saying how to start an engine when none answers."""
        if self._client is None:
            self._client = engine_client(self.base_url, self._api_timeout_s)
        return self._client

    # -- before anything starts

    def pin_images(self, plan: Plan) -> Plan:
        """The plan as this launcher will run it, every image checked before anything starts.

        Each node runs its image, or, naming none, the lock's image for its server's engine. Every
        image must be pinned by the lock and present in the engine with the pinned digest; a plan
        that already pins a digest (a rerun of an archived plan) must get that same one. Returns
        the plan with the nodes' images set and `pins.image`/`pins.image_digest` recording the
        main server's image and its verified digest. Raises InfrastructureError (exit 3, one
        `unknown (image_...)` line per cause) otherwise.
        """
        causes: list[Cause] = []
        updates: dict[str, Any] = {}
        imageless: dict[str, list[str]] = {}
        for server in plan.servers():
            default = self.lock.for_engine(server.engine)
            nodes = []
            for node in server.nodes:
                image = node.image or (default.reference if default else None)
                if image is None and server.role not in imageless.setdefault(server.engine, []):
                    imageless[server.engine].append(server.role)
                nodes.append(node.model_copy(update={"image": image}))
            updates[server.role] = server.model_copy(update={"nodes": nodes})
        for engine, roles in imageless.items():
            causes.append(Cause(
                "image_unpinned", f"the {', '.join(roles)} server(s) ({engine}) name no image and "
                f"{self.lock.path} has none for the {engine} engine",
                f"name one (engine ... image \"REF\") or build and pin one: cptest image build {engine} "
                "--update-lock"))  # fmt: skip
        if causes:
            raise InfrastructureError(causes)
        images = sorted({n.image for s in updates.values() for n in s.nodes if n.image})
        digests: dict[str, str] = {}
        try:
            client = self.client
        except RunError as e:
            p = e.problems[0]
            raise InfrastructureError([Cause("container_engine_down", p.message, p.hint or "")]) from None
        for image in images:
            try:
                digests[image] = verify_image(client, image, self.lock)
            except ImageRefused as e:
                p = e.problems[0]
                pinned = f"pinned {p.expected}" if p.expected else ""
                found = f"the engine has {p.found}" if p.found else ""
                what = "; ".join(x for x in (pinned, found) if x)
                causes.append(Cause(e.code, f"{p.message}{f' ({what})' if what else ''}",  # type: ignore[arg-type]
                                    p.hint or ""))
            except RunError as e:
                causes.append(Cause("container_engine_down", e.problems[0].message, e.problems[0].hint or ""))
        main_image = updates["main"].nodes[0].image
        was = plan.pins.image_digest
        if main_image in digests and was is not None and was != digests[main_image]:
            causes.append(Cause(
                "image_mismatch", f"the plan ran {main_image} with digest {was}; {self.lock.path} now pins "
                f"{digests[main_image]}", "rerun with the lock (and image) the plan was run with, or run the "
                "scenario afresh"))  # fmt: skip
        if causes:
            raise InfrastructureError(causes)
        digest = digests.get(str(main_image))
        pins = plan.pins.model_copy(update={"image": main_image, "image_digest": digest})
        return plan.model_copy(update={**updates, "pins": pins})

    # -- the Launcher protocol

    def start(self, node: NodeLaunch, log_path: Path, labels: dict[str, str]) -> DockerHandle:
        """Verify the image pin, create and start the node's container, follow its logs into `log_path`."""
        if node.image is None:
            raise RunError(Problem(None, f"node {node.node_rank} has no image; the docker launcher needs one",
                                   hint="give the scenario's engine an image, or use the process launcher"))
        digest = verify_image(self.client, node.image, self.lock)
        entry = self.lock.entries[node.image]
        devices, attached = None, None
        # The reference engine computes on the CPU: its nodes carry the GPU ids of the topology they
        # model, and get no GPU (a device request for them failed on Docker without NVIDIA's
        # runtime, and only Podman's ignoring it let them start).
        gpus = bool(node.gpu_ids) and entry.engine != "reference"
        if gpus:
            if self._gpu_access is None:
                self._gpu_access = engine_gpu_access(self.client)
            if self._gpu_access == "device_nodes":
                minors, source = gpu.minor_numbers(node.gpu_ids)
                devices = gpu_device_nodes(node.gpu_ids, minors)
                attached = (f"GPUs {node.gpu_ids} as device nodes ({source}): "
                            f"{', '.join(d.split(':')[0] for d in devices)}; driver mounts: "
                            f"{', '.join(entry.driver_mounts) or 'none'} "
                            "(the engine ignores device requests)")
            else:
                attached = f"GPUs {node.gpu_ids} as a device request"
        config = container_config(node, labels, probe_dir=self.probe_dir, ipc_mode=self.ipc_mode,
                                  shm_size=self.shm_size, init=self.init, cptest_mount=entry.cptest_mount,
                                  device_nodes=devices, driver_mounts=entry.driver_mounts, gpus=gpus)
        config.pop("detach")
        if attached is not None:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a") as out:  # the container's own output follows
                out.write(f"[cptest] {attached}\n")
        try:
            container = self.client.containers.create(**config)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise _engine_error(f"creating the container of node {node.node_rank}", e) from None
        handle = DockerHandle(node=node, log_path=Path(log_path), container=container, image_digest=digest)
        # Registered before start: a failure or Ctrl-C from here on still removes the container.
        with self._lock:
            self._handles.append(handle)
        try:
            container.start()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            self.teardown(handle, grace_s=0)
            raise _engine_error(f"starting the container of node {node.node_rank}", e) from None
        handle._log_thread = _follow_logs(container, handle.log_path)
        return handle

    def teardown(self, handle: Any, grace_s: float = 10.0) -> ExitInfo:
        """SIGTERM, wait up to `grace_s`, SIGKILL; remove the container (force); verify it is gone.

        Idempotent; never raises for a container that is already gone. Host processes of the
        container still alive afterwards are reported in `leftover_pids`.
        """
        assert isinstance(handle, DockerHandle)
        before: list[psutil.Process] = []
        with contextlib.suppress(Exception):
            before = [psutil.Process(p) for p in handle.pids()]
            init_pid = handle._init_pid()
            if init_pid:
                before.append(psutil.Process(init_pid))
        if not handle._gone:
            with contextlib.suppress(docker.errors.NotFound):
                if handle.poll() is None:
                    # Docker's stop is SIGTERM, then SIGKILL after `t` seconds (whole seconds only).
                    with contextlib.suppress(docker.errors.APIError, requests.exceptions.RequestException):
                        handle.container.stop(timeout=max(0, math.ceil(grace_s)))
                handle.poll()
            # The log stream ends by itself once the container has exited; joining before the
            # remove keeps its last lines (a remove cuts the stream short).
            if handle._log_thread is not None:
                handle._log_thread.join(timeout=5)
            _remove(handle.container)
            handle._gone = not _exists(self.client, handle.container_id)
            if not handle._gone:
                raise RunError(Problem(
                    None, f"container {handle.container_id[:12]} is still present after a forced remove",
                    hint="see the engine's log; remove it by hand"))
        if handle._log_thread is not None:
            handle._log_thread.join(timeout=5)
        if handle._ended_at is None:
            handle._ended_at = time.monotonic()
        leftover = [p.pid for p in before if _alive(p)]
        with self._lock:
            if handle in self._handles:
                self._handles.remove(handle)
        return ExitInfo(status=handle._status, ended_at=handle._ended_at, leftover_pids=leftover)

    def sweep(self, labels: dict[str, str]) -> list[str]:
        """Remove every container (any state) carrying all of `labels` and cptest.launcher=docker."""
        wanted = {**labels, LABEL_LAUNCHER: "docker"}
        filters = {"label": [f"{k}={v}" for k, v in sorted(wanted.items())]}
        try:
            found = self.client.containers.list(all=True, filters=filters)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise _engine_error("listing containers to sweep", e) from None
        removed: list[str] = []
        for c in found:
            # Check labels here too: an engine that ignored a filter must not cost a stranger's container.
            if any((c.labels or {}).get(k) != v for k, v in wanted.items()):
                continue
            _remove(c)
            node = (c.labels or {}).get(LABEL_NODE, "?")
            removed.append(f"container {c.short_id} ({c.name}, node {node})")
        return removed

    # -- owning every container on every exit path

    def handles(self) -> list[DockerHandle]:
        with self._lock:
            return list(self._handles)

    def close(self, grace_s: float = 10.0) -> list[str]:
        """Tear down every container this launcher still owns; returns the failures (it goes on)."""
        failures: list[str] = []
        for handle in reversed(self.handles()):
            try:
                self.teardown(handle, grace_s=grace_s)
            except Exception as e:  # noqa: BLE001 - cleanup of one must not stop cleanup of the others
                failures.append(f"error during cleanup of container {handle.container_id[:12]}: {e}")
        return failures

    def __enter__(self) -> DockerLauncher:
        return self

    def __exit__(self, *exc: object) -> None:
        # Short grace on an abnormal exit: nothing will read the results of an interrupted node.
        for failure in self.close(grace_s=10.0 if exc[0] is None else 2.0):
            log.error("%s", failure)


def _follow_logs(container: Any, log_path: Path) -> threading.Thread:
    """A daemon thread appending the container's stdout+stderr to `log_path` until the stream ends."""
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def follow() -> None:
        with open(log_path, "ab", buffering=0) as out:
            try:
                for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                    out.write(chunk)
            except Exception as e:  # noqa: BLE001 - the container went away: say so in its log, end
                out.write(f"\n[cptest] log stream ended: {e}\n".encode())

    thread = threading.Thread(target=follow, name=f"logs-{str(container.id)[:12]}", daemon=True)
    thread.start()
    return thread


def _remove(container: Any) -> None:
    with contextlib.suppress(docker.errors.NotFound):
        try:
            container.remove(force=True)
        except docker.errors.APIError as e:
            # "removal already in progress" (409) from a concurrent remove is fine; anything else is not.
            if getattr(e, "status_code", None) != 409:
                raise _engine_error(f"removing container {str(container.id)[:12]}", e) from None


def _exists(client: docker.DockerClient, container_id: str) -> bool:
    try:
        client.containers.get(container_id)
    except docker.errors.NotFound:
        return False
    return True


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def iter_labelled(client: docker.DockerClient, labels: Mapping[str, str]) -> Iterator[Any]:
    """Containers (any state) carrying all of `labels`: for tests and `cptest` diagnostics."""
    filters = {"label": [f"{k}={v}" for k, v in sorted(labels.items())]}
    yield from client.containers.list(all=True, filters=filters)
