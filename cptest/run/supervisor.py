"""The supervisor: the one owner of every started node, and the sampler of processes and GPU memory.

`with Supervisor(launcher, log=log) as sup:` — `sup.start(...)` registers a handle the moment the
launcher returns it; `__exit__` tears down each handle still owned, separately, logging a failure and
going on to the next (NixOS `Driver.__exit__`). While the engine runs, a sampler thread writes the
process tree and per-GPU memory every `sample_interval_s` to the owning role's `runner.jsonl`. A
crash of that thread is recorded and re-raised on the main thread by `check()` as a RunError, so the
run unwinds through `__exit__` as on any other error.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil

from cptest.errors import RunError
from cptest.evidence import GpuProcessUse, GpuSample, Lifecycle, ProbeNote, ProcessSample
from cptest.outline import Logger, null_logger
from cptest.plan.model import NodeLaunch
from cptest.run.evidence_writer import RecordWriter
from cptest.run.gpu import GpuQueryUnavailable, GpuReading, parse_gpu_memory, query_gpu_memory, read_gpus
from cptest.run.launcher import ExitInfo, Handle, Launcher

Role = Literal["main", "baseline", "control", "eager"]

RUN_LABEL = "cptest.run"
"""The label (an environment variable of every engine process, `process.label_var`) naming the run:
what tells this run's stray processes from another run's on a shared machine."""


def describe_processes(pids: list[int], scope: str = "tree") -> list[dict[str, Any]]:
    """pid, ppid, name (process title), status, rss of each live pid (vanished ones are skipped)."""
    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                cmd = [c for c in p.cmdline() if c]
                procs.append({
                    "pid": pid, "ppid": p.ppid(), "name": p.name(),
                    "title": " ".join(cmd)[:200], "status": p.status(),
                    "rss": p.memory_info().rss, "scope": scope, "cpus": _affinity(p),
                })
        except (psutil.Error, OSError):
            continue
    return procs


def _affinity(p: psutil.Process) -> list[int] | None:
    """The CPUs a process may run on (a suite pins servers to their own), where the OS says."""
    try:
        return sorted(p.cpu_affinity())
    except (AttributeError, psutil.Error, OSError):
        return None


def session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def run_label_of(pid: int) -> str | None:
    """The cptest run label in a process's environment; "" for a process with none (started
    outside cptest); None when its environment cannot be read (gone, or another user's)."""
    from cptest.run.process import label_var

    try:
        env = psutil.Process(pid).environ()
    except (psutil.Error, OSError):
        return None
    return env.get(label_var(RUN_LABEL), "")


def host_processes_titled(prefix: str) -> list[int]:
    """Pids of every host process whose title (cmdline or name) starts with `prefix`.

    Before and after a run this finds engine processes that belong to no tree we know (orphans of
    this run or leftovers of an earlier one).
    """
    found = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        cmd = " ".join(c for c in (p.info.get("cmdline") or []) if c)
        if (p.info.get("name") or "").startswith(prefix) or cmd.startswith(prefix):
            found.append(p.info["pid"])
    return found


@dataclass
class Owned:
    """A handle the supervisor owns and where its role's runner evidence goes."""

    handle: Handle
    role: Role
    writer: RecordWriter
    torn_down: ExitInfo | None = None


@dataclass
class Supervisor:
    """Owns handles; samples; tears down. See the module docstring."""

    launcher: Launcher
    log: Logger = field(default_factory=null_logger)
    sample_interval_s: float = 2.0
    gpu_query: Callable[[], GpuReading] = read_gpus
    run_label: str | None = None
    """This run's label value (`RUN_LABEL`); set from the first `start`. None: every stray is ours."""
    title_prefix: str = "sglang::"
    teardown_grace_s: float = 10.0
    owned: list[Owned] = field(default_factory=list)
    thread_error: BaseException | None = None
    _gpu_note_written: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _sample_hook: Callable[[], None] | None = None
    """Test seam: called on each sampler tick (a raising hook simulates a sampler crash)."""

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        # A second Ctrl-C or SIGTERM while tearing down would abandon the trees not yet torn down:
        # hold those signals until every teardown is done (they are delivered right after).
        held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            self.stop_sampling()
            for owned in reversed(self.owned):
                try:
                    self.teardown(owned)
                except Exception as e:  # one failed teardown must not leave the others running
                    pid, k = owned.handle.main_pid(), owned.handle.node.node_rank
                    self.log.error(f"error during teardown of {owned.role} node {k} (pid {pid}): {e}")
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)

    # ------------------------------------------------------------------ ownership
    def start(self, node: NodeLaunch, log_path: Path, labels: dict[str, str], role: Role,
              writer: RecordWriter) -> Owned:
        """Start a node through the launcher and own it at once. Writes Lifecycle `launched`."""
        handle = self.launcher.start(node, log_path, labels)
        if self.run_label is None:
            self.run_label = labels.get(RUN_LABEL)
        owned = Owned(handle, role, writer)
        self.owned.append(owned)
        detail: dict[str, Any] = {"node": node.node_rank, "pid": handle.main_pid(), "argv": node.argv}
        executable = (getattr(handle, "argv", None) or [None])[0]
        if executable is not None:  # what argv[0] resolved to (cptest's interpreter for the reference)
            detail["executable"] = executable
        describe = getattr(handle, "describe", None)
        if describe is not None:  # where the launcher ran it (Slurm: job, step, node name and address)
            detail["where"] = describe()
        writer.write(Lifecycle(run=role, event="launched", detail=detail))
        return owned

    def teardown(self, owned: Owned, grace_s: float | None = None) -> ExitInfo:
        """Tear down one owned node (idempotent) and write Lifecycle `teardown`."""
        if owned.torn_down is not None and not owned.torn_down.leftover_pids:
            return owned.torn_down
        before = set(owned.handle.pids())
        info = self.launcher.teardown(owned.handle, self.teardown_grace_s if grace_s is None else grace_s)
        owned.torn_down = info
        owned.writer.write(Lifecycle(run=owned.role, event="teardown", detail={
            "node": owned.handle.node.node_rank, "leftover_pids": info.leftover_pids,
            "killed": sorted(before - set(info.leftover_pids)), "status": info.status}))
        if info.leftover_pids:
            self.log.error(f"{owned.role} node {owned.handle.node.node_rank}: processes "
                           f"{info.leftover_pids} survived teardown; kill them by hand")
        return info

    def check(self) -> None:
        """Raise RunError if the sampler thread crashed (call between phases and in callbacks)."""
        if self.thread_error is not None:
            raise RunError(f"the supervisor's sampler thread crashed: "
                           f"{type(self.thread_error).__name__}: {self.thread_error}")

    # ------------------------------------------------------------------ sampling
    def sample(self, phase: str, role: Role, writer: RecordWriter, *,
               host: bool = False) -> dict[str, int] | None:
        """Write one ProcessSample (the role's trees; with `host`, also every host process titled
        like the engine) and one GpuSample (or, once per role, a note that GPUs cannot be read).
        Returns the GPU memory read, or None."""
        pids: list[int] = []
        for owned in self.owned:
            if owned.role == role:
                pids.extend(p for p in owned.handle.pids() if p not in pids)
        procs = describe_processes(pids)
        if host:
            strays = [p for p in host_processes_titled(self.title_prefix) if p not in pids]
            sessions = self.tree_sessions() if strays else set()
            mine = [p for p in strays if self._stray_is_ours(p, sessions)]
            procs += describe_processes(mine, scope="host")
            procs += describe_processes([p for p in strays if p not in mine], scope="foreign")
        writer.write(ProcessSample(phase=phase, procs=procs))
        return self.sample_gpu(phase, role, writer)

    def tree_sessions(self) -> set[int]:
        """The sessions of this run's trees: each process-launcher node is its own session (its
        first process is the session leader, `ProcessHandle.session`), which every process it
        starts keeps, orphans reparented to init included, unless one calls setsid()."""
        sessions: set[int] = set()
        for o in self.owned:
            session = getattr(o.handle, "session", None)
            if isinstance(session, int):
                sessions.add(session)
        return sessions

    def _stray_is_ours(self, pid: int, sessions: set[int]) -> bool:
        """Whether an engine-titled process outside the trees is this run's orphan: it is in one of
        this run's sessions, or carries this run's label (readable: a process that did not set its
        title). Anything else is another run's or a stranger's (`no_orphans` looks only at this
        run's processes), so that concurrent runs never judge each other's engines."""
        if session_of(pid) in sessions:
            return True
        return self.run_label is not None and run_label_of(pid) == self.run_label

    def tree_pids(self) -> set[int]:
        """Every pid of the owned trees: alive now, or seen before (a launcher that keeps a snapshot)."""
        pids: set[int] = set()
        for o in self.owned:
            pids.update(getattr(o.handle, "known", {}))
            pids.update(o.handle.pids())
        return pids

    def ours(self, pid: int, tree: set[int] | None = None) -> bool:
        """`pid` belongs to this run: a process of an owned tree (now or ever, `tree` if the caller
        has it), or one labelled with this run (an orphan that left the tree)."""
        if pid in (self.tree_pids() if tree is None else tree):
            return True
        return self.run_label is not None and run_label_of(pid) == self.run_label

    def sample_gpu(self, phase: str, role: Role, writer: RecordWriter) -> GpuReading | None:
        try:
            reading = self.gpu_query()
        except GpuQueryUnavailable as e:
            if role not in self._gpu_note_written:
                self._gpu_note_written.add(role)
                writer.write(ProbeNote(level="warning", message=str(e)))
            return None
        uses = None
        if reading.processes is not None:
            tree = self.tree_pids()
            uses = [GpuProcessUse(gpu=g, pid=pid, mib=mib, ours=self.ours(pid, tree))
                    for g, held in sorted(reading.processes.items()) for pid, mib in sorted(held.items())]
        writer.write(GpuSample(phase=phase, used_mib=reading.used_mib, processes=uses))
        return reading

    def start_sampling(self, role: Role, writer: RecordWriter) -> None:
        """Sample the role's trees every `sample_interval_s` (phase `running`) until stop_sampling."""
        self.stop_sampling()
        self._stop = threading.Event()

        def loop() -> None:
            try:
                while not self._stop.wait(self.sample_interval_s):
                    if self._sample_hook is not None:
                        self._sample_hook()
                    self.sample("running", role, writer)
            except BaseException as e:  # recorded, then surfaced on the main thread by check()
                self.thread_error = e
                with contextlib.suppress(Exception):
                    writer.write(ProbeNote(level="error", message=f"sampler thread crashed: "
                                                                   f"{type(e).__name__}: {e}"))

        self._thread = threading.Thread(target=loop, name=f"cptest-sampler-{role}", daemon=True)
        self._thread.start()

    def stop_sampling(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(self.sample_interval_s, 1.0) + 10.0)
            self._thread = None


def gpu_settled(sup: Supervisor, before: GpuReading | None,
                tolerance_mib: int = 0) -> Callable[[bool], bool]:
    """A `retry` predicate: true when no process of this run holds GPU memory any more (where the
    machine attributes memory to processes), else when every GPU of `before` uses no more than
    before + tolerance (a device total: only meaningful when nothing else shares the GPUs)."""

    def ok(last: bool) -> bool:
        if before is None:
            return True
        now = sup.gpu_query()
        if now.processes is not None:
            tree = sup.tree_pids()
            return not any(mib > 0 and sup.ours(pid, tree) for held in now.processes.values()
                           for pid, mib in held.items())
        return all(now.used_mib.get(k, 0) <= v + tolerance_mib for k, v in before.used_mib.items())

    return ok


__all__ = ["GpuQueryUnavailable", "GpuReading", "Supervisor", "gpu_settled", "parse_gpu_memory",
           "query_gpu_memory", "read_gpus"]
