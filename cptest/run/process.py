"""The process launcher: an engine node as a subprocess tree in its own session, torn down on every exit.

`ProcessLauncher.start` runs the node's argv (never a shell) with `start_new_session=True`, so the
engine's main pid is also its session id and process-group id, and stdout+stderr go to the node's
log file. The handle tracks the whole tree with psutil: descendants of the main process, plus every
process whose session or process group is the engine's (orphans reparented to init keep them), plus
a snapshot of every pid ever seen (with its create time, so a reused pid is never signalled).

Every exit path tears the tree down:
- normal end and exceptions: the `Supervisor` calls `teardown` in `__exit__`;
- Ctrl-C and SIGTERM to cptest: `install_signal_handlers()` (CLI path) turns SIGTERM/SIGHUP into
  `Interrupted` (a `KeyboardInterrupt`), so the same `__exit__` runs;
- anything that skips `__exit__` but still runs Python (a crash of the main thread, `sys.exit` from a
  thread handler, interpreter shutdown): the module registry is torn down by `atexit`;
- SIGKILL of cptest, which no user-space code inside cptest can handle: a watchdog child
  (`python -m cptest.run.reaper`, `cptest/run/reaper.py`) in its own session kills the tree when
  the cptest pid disappears.

The tree is covered from its first instant: the node starts as a *gate*, this
interpreter running `GATE_CODE`, already the session leader, that blocks on a pipe whose write end
only cptest holds. cptest then starts the reaper for that session, waits until the reaper says it
is watching, and only then writes the byte that lets the gate exec the engine (same pid, same
session). A SIGKILL of cptest before that byte closes the pipe: the gate reads end-of-file and exits
without running the engine. After it, the reaper is already watching and also learns of cptest's
death at once, from end-of-file on its own lifeline pipe. So at no moment does an engine process
exist that nothing will kill.

Interpreter: an argv that runs one of cptest's own modules with a bare `python3`
(`python3 -m cptest.reference.server`, how the machine-independent plan names the reference engine)
runs on the interpreter running cptest (`sys.executable`), never the first `python3` on PATH, which
may lack cptest's dependencies (pipx, a venv called by its full path). One that runs an `sglang`
module runs on SGLang's interpreter (`engine_python`, `cptest.run.interpreter`: `--engine-python`,
`$CPTEST_SGLANG_PYTHON`, else the first `python3` on PATH). `launched` records the executable in
portable form (`<python>/bin/python3`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import psutil

from cptest.errors import RunError
from cptest.plan.model import NodeLaunch
from cptest.run.interpreter import locate
from cptest.run.launcher import ExitInfo
from cptest.run.reaper import ident as _ident
from cptest.run.reaper import tree_snapshot

DROPPED_ENV_PREFIXES: tuple[str, ...] = ("SGLANG_", "SGL_", "CPTEST_")
"""Host variables never passed to an engine: engine settings must come from the plan (reproducible,
archived in plan.json), not from whatever the operator's shell happened to export."""

DROPPED_ENV: frozenset[str] = frozenset({"CUDA_VISIBLE_DEVICES"})
"""Set from `NodeLaunch.gpu_ids` instead."""

LABEL_ENV_PREFIX = "CPTEST_LABEL_"
"""Labels travel as environment variables of the engine main process so `sweep` can find leftovers."""

KILL_WAIT_S = 5.0
"""How long teardown waits for SIGKILLed processes to disappear before reporting them as leftovers."""


class Interrupted(KeyboardInterrupt):
    """cptest received SIGTERM or SIGHUP. A `KeyboardInterrupt` so `except Exception` cannot eat it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


def engine_env(node: NodeLaunch, base: dict[str, str] | None = None,
               labels: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the engine: `base` (default os.environ) filtered, then node.env, then
    CUDA_VISIBLE_DEVICES from gpu_ids and the label variables. Pure."""
    src = dict(os.environ if base is None else base)
    env = {k: v for k, v in src.items()
           if k not in DROPPED_ENV and not k.startswith(DROPPED_ENV_PREFIXES)}
    env.update(node.env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in node.gpu_ids)
    for k, v in (labels or {}).items():
        env[label_var(k)] = v
    return env


def label_var(key: str) -> str:
    return LABEL_ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", key).upper()


GATE_CODE = ("import os, sys\n"
             "fd = int(sys.argv[1])\n"
             "if os.read(fd, 1) != b'g':\n"
             "    os._exit(70)\n"
             "os.close(fd)\n"
             "if sys.argv[2]:\n"
             "    os.sched_setaffinity(0, map(int, sys.argv[2].split(',')))\n"
             "os.execv(sys.argv[3], sys.argv[3:])\n")
"""Run by this interpreter as the node's first process: `<fd> <cpus or ''> <engine argv...>`. It
waits for cptest's go byte on `fd` (end-of-file: cptest died before its reaper was watching; exit
70, nothing started), sets the CPU affinity when the node has `cpus`, and execs the engine, which
keeps the pid and session, and whose children inherit the affinity (setting it from outside after
Popen would race the engine's first children; `preexec_fn` is not safe in a process with threads,
and cptest has its sampler thread)."""

GATE_EXIT = 70
"""The gate's status when cptest gave no go byte (it died, or its reaper could not start)."""

REAPER_READY_S = 30.0
"""How long `start` waits for the reaper to say it is watching (a Python start on a loaded machine)."""

OWN_MODULE_INTERPRETERS: frozenset[str] = frozenset({"python", "python3"})
"""Bare interpreter names that, in front of `-m cptest.…`, mean cptest's own interpreter."""


def gated_argv(argv: list[str], fd: int, cpus: list[int] | None) -> list[str]:
    """The gate's argv in front of the resolved engine `argv` (see `GATE_CODE`)."""
    return [sys.executable, "-c", GATE_CODE, str(fd), ",".join(str(c) for c in cpus or []), *argv]


def own_interpreter(argv: list[str]) -> list[str]:
    """`argv` with a bare `python3` in front of `-m cptest.<module>` replaced by `sys.executable`
    (the interpreter running cptest, which has cptest's dependencies); any other argv unchanged."""
    if len(argv) >= 3 and argv[0] in OWN_MODULE_INTERPRETERS and argv[1] == "-m" \
            and argv[2].split(".")[0] == "cptest":
        return [sys.executable, *argv[1:]]
    return argv


def sglang_interpreter(argv: list[str], engine_python: str | None, env: dict[str, str]) -> list[str]:
    """`argv` with a bare `python3` in front of `-m sglang.<module>` replaced by SGLang's interpreter
    (`interpreter.locate`: `engine_python`, else $CPTEST_SGLANG_PYTHON, else the first `python3` on
    the engine's PATH); any other argv unchanged. The pipeline passes the interpreter it inspected."""
    if len(argv) >= 3 and argv[0] in OWN_MODULE_INTERPRETERS and argv[1] == "-m" \
            and argv[2].split(".")[0] == "sglang":
        path, _, name = locate(engine_python, environ={**os.environ, "PATH": env.get("PATH", os.defpath)})
        return [path or name, *argv[1:]]
    return argv


def resolve_argv(argv: list[str], env: dict[str, str], engine_python: str | None = None) -> list[str]:
    """argv with argv[0] resolved: cptest's own interpreter for a cptest module (`own_interpreter`),
    SGLang's for an sglang module (`sglang_interpreter`), else on the engine's PATH (no shell).
    Raises RunError if not found."""
    if not argv:
        raise RunError("node argv is empty; the plan must give the engine command")
    argv = sglang_interpreter(own_interpreter(argv), engine_python, env)
    exe = argv[0]
    found = exe if os.sep in exe else shutil.which(exe, path=env.get("PATH", os.defpath))
    if not found or not os.access(found, os.X_OK):
        raise RunError(f"cannot start the engine: {exe!r} is not an executable on PATH "
                       f"({env.get('PATH', '')!r}); install it or put its directory on PATH")
    return [found, *argv[1:]]


@dataclass
class ProcessHandle:
    """A started node: its main Popen, its session, the snapshot of its tree, its reaper."""

    node: NodeLaunch
    log_path: Path
    popen: subprocess.Popen[bytes]
    started_at: float
    reaper: subprocess.Popen[bytes] | None = None
    argv: list[str] = field(default_factory=list)
    """The engine's argv as exec'd (argv[0] resolved), without the gate."""
    known: dict[int, float] = field(default_factory=dict)
    """Every pid of the tree ever seen -> its create time."""
    exit: ExitInfo | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def session(self) -> int:
        return self.popen.pid

    def main_pid(self) -> int | None:
        return self.popen.pid

    def refresh(self) -> None:
        """Add every process of the tree that exists now to the snapshot."""
        snap = tree_snapshot(self.session)
        with self._lock:
            for pid, created in snap.items():
                self.known.setdefault(pid, created)

    def alive_pids(self) -> list[int]:
        """Processes of the snapshot (after a refresh) that are still alive, main first."""
        self.refresh()
        with self._lock:
            items = list(self.known.items())
        alive = [pid for pid, created in items if _ident(pid) == created]
        alive.sort(key=lambda p: (p != self.session, p))
        return alive

    def pids(self) -> list[int]:
        return self.alive_pids()

    def poll(self) -> int | None:
        status = self.popen.poll()
        if status is not None and self.exit is None:
            self.exit = ExitInfo(status, time.monotonic())
        return status

    def send_signal(self, sig: int) -> None:
        """Deliver `sig` to the main process only; a main process already gone is not an error."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def serves(self, port: int) -> tuple[bool | None, list[int]]:
        """Whether the process listening on TCP `port` is of this tree: (True, pids) when one of
        the listeners is, (False, pids) when listeners exist and none is (another run's server
        answers on this node's port), (None, []) when no listener can be seen."""
        listeners = listening_pids(port)
        if not listeners:
            return None, []
        tree = set(self.alive_pids()) | set(self.known)
        return bool(tree & set(listeners)), listeners


def listening_pids(port: int) -> list[int]:
    """Pids of the processes with a TCP socket listening on `port` (any address), as far as this
    user may see (root: all)."""
    found: set[int] = set()
    with contextlib.suppress(psutil.Error, OSError):
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                found.add(c.pid)
    return sorted(found)


_LIVE: dict[int, tuple[ProcessLauncher, ProcessHandle]] = {}
_LIVE_LOCK = threading.Lock()


def live_handles() -> list[ProcessHandle]:
    """Handles started in this process and not yet torn down."""
    with _LIVE_LOCK:
        return [h for _, h in _LIVE.values()]


def teardown_all(grace_s: float = 2.0) -> list[ExitInfo]:
    """Tear down every live handle (atexit, last resort). Never raises."""
    with _LIVE_LOCK:
        entries = list(_LIVE.values())
    out = []
    for launcher, handle in entries:
        try:
            out.append(launcher.teardown(handle, grace_s))
        except Exception as e:  # keep going: the next tree must still be torn down
            print(f"cptest: teardown of pid {handle.main_pid()} failed: {e}", file=sys.stderr)
    return out


atexit.register(teardown_all)


def install_signal_handlers() -> Callable[[], None]:
    """CLI path only (main thread): SIGTERM/SIGHUP raise `Interrupted`, SIGINT raises
    `KeyboardInterrupt`, so every `with Supervisor(...)` unwinds and tears down. Returns a function
    that restores the previous handlers."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, on_signal)
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def start_reaper(watched: str, unready: Callable[[int | None], str], *, mode: str | None = None,
                 env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `python -m cptest.run.reaper [mode] <cptest's pid> <its start time> <watched>` and
    return once it watches (it prints `ready`); else kill it and raise RunError(`unready(its
    status)`). Its stdin is its lifeline: cptest holds the write end, so cptest's death reaches it
    as end-of-file."""
    me = psutil.Process(os.getpid())
    argv = [sys.executable, "-m", "cptest.run.reaper", *([mode] if mode else []), str(me.pid),
            repr(me.create_time()), watched]
    reaper = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              start_new_session=True, close_fds=True, env=env)
    assert reaper.stdout is not None
    ready, _, _ = select.select([reaper.stdout], [], [], REAPER_READY_S)
    line = reaper.stdout.readline() if ready else b""
    reaper.stdout.close()
    if line.strip() != b"ready":
        reaper.kill()
        reaper.wait()
        raise RunError(unready(reaper.poll()))
    return reaper


class ProcessLauncher:
    """Launcher of local subprocess trees (see the module docstring for the teardown guarantees)."""

    name = "process"

    def __init__(self, *, reaper: bool = True, base_env: dict[str, str] | None = None,
                 on_spawn: Callable[[int], None] | None = None, engine_python: str | None = None) -> None:
        self.use_reaper = reaper
        self.base_env = base_env
        self.engine_python = engine_python
        """SGLang's interpreter (`--engine-python`); the pipeline replaces it with the absolute path
        it inspected, so that the interpreter checked is the one launched."""
        self.on_spawn = on_spawn
        """Test seam: called with the node's pid the instant its first process exists (before the
        reaper); `benchmarks/sigkill_coverage.py` times its SIGKILLs of cptest from it."""

    def start(self, node: NodeLaunch, log_path: Path, labels: dict[str, str]) -> ProcessHandle:
        """Start `node` with stdout+stderr appended to `log_path`; registers the handle at once.

        The engine runs only once its reaper watches the session (module docstring: the gate).
        Raises RunError when the executable is missing, the OS refuses to start it, or the reaper
        does not come up (the gated process is then killed before it ran anything).
        """
        env = engine_env(node, self.base_env, labels)
        argv = resolve_argv(node.argv, env, self.engine_python)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        gate_r, gate_w = os.pipe()
        try:
            with log_path.open("ab") as log_file:
                try:
                    popen = subprocess.Popen(gated_argv(argv, gate_r, node.cpus), env=env,
                                             stdin=subprocess.DEVNULL, stdout=log_file,
                                             stderr=subprocess.STDOUT, start_new_session=True,
                                             close_fds=True, pass_fds=(gate_r,))
                except OSError as e:
                    raise RunError(f"cannot start the engine {argv[0]!r}: {e}") from None
        except BaseException:
            os.close(gate_w)
            raise
        finally:
            os.close(gate_r)
        handle = ProcessHandle(node, log_path, popen, time.monotonic(), argv=argv)
        with _LIVE_LOCK:
            _LIVE[popen.pid] = (self, handle)
        try:
            if self.on_spawn is not None:
                self.on_spawn(popen.pid)
            if self.use_reaper:
                handle.reaper = self._start_reaper(popen.pid)
            os.write(gate_w, b"g")
        except BaseException:
            # No go byte: the gate exits by itself on end-of-file; kill it anyway, and the reaper.
            with contextlib.suppress(ProcessLookupError):
                popen.kill()
            if handle.reaper is not None:
                handle.reaper.kill()
            raise
        finally:
            os.close(gate_w)
        handle.refresh()
        return handle

    @staticmethod
    def _start_reaper(session: int) -> subprocess.Popen[bytes]:
        """Start the reaper of `session` and return once it watches (`start_reaper`)."""
        return start_reaper(str(session), lambda status: (
            f"the reaper of the engine tree (session {session}) did not start within {REAPER_READY_S:.0f} s "
            f"(status {status}); the engine was not run. Is the machine overloaded? Try again"))

    def teardown(self, handle: ProcessHandle, grace_s: float = 10.0) -> ExitInfo:  # type: ignore[override]
        """SIGTERM the main process (or, if it is gone, every process left), wait up to `grace_s`
        for the whole tree to exit, then SIGKILL the process group and every pid of the snapshot,
        reap, stop the reaper. Idempotent; never raises for a tree that is already gone."""
        from cptest.retry import retry  # local: retry imports nothing of run/, keep import order simple

        alive = handle.alive_pids()
        if alive:
            if handle.popen.poll() is None:
                handle.send_signal(signal.SIGTERM)
            else:
                for pid in alive:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGTERM)
            with contextlib.suppress(RunError):
                retry(lambda last: not handle.alive_pids(), grace_s, 0.05, "waiting for the tree to exit")
        alive = handle.alive_pids()
        if alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(handle.session, signal.SIGKILL)
            for pid in alive:
                if _ident(pid) == handle.known.get(pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(RunError):
                retry(lambda last: not handle.alive_pids(), KILL_WAIT_S, 0.05, "waiting for SIGKILL")
        with contextlib.suppress(subprocess.TimeoutExpired):
            handle.popen.wait(timeout=KILL_WAIT_S)
        if handle.reaper is not None and handle.reaper.poll() is None:
            handle.reaper.kill()  # before its lifeline closes: end-of-file would tell it to kill
            with contextlib.suppress(subprocess.TimeoutExpired):
                handle.reaper.wait(timeout=KILL_WAIT_S)
        if handle.reaper is not None and handle.reaper.stdin is not None:
            with contextlib.suppress(OSError):
                handle.reaper.stdin.close()
        status = handle.poll()
        ended = handle.exit.ended_at if handle.exit else None
        info = ExitInfo(status, ended, handle.alive_pids())
        handle.exit = info
        if not info.leftover_pids:
            with _LIVE_LOCK:
                _LIVE.pop(handle.session, None)
        return info

    def sweep(self, labels: dict[str, str]) -> list[str]:
        """SIGKILL the session of every process whose environment carries all of `labels`."""
        want = {label_var(k): v for k, v in labels.items()}
        removed: list[str] = []
        own_session = os.getsid(0)
        for p in psutil.process_iter(["pid", "name"]):
            if p.pid == os.getpid():
                continue
            try:
                env = p.environ()
            except (psutil.Error, OSError):
                continue
            if want and all(env.get(k) == v for k, v in want.items()):
                try:
                    sid = os.getsid(p.pid)
                    if sid == own_session:  # never our own session: kill just that process
                        raise PermissionError
                    os.killpg(sid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError, OSError):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(p.pid, signal.SIGKILL)
                removed.append(f"process {p.pid} ({p.info['name']}) labels {json.dumps(labels)}")
        return removed
