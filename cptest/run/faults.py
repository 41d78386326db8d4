"""The fault injector: signals to a rank (found by its process title) or to the server's main process.

Two layers (Jepsen `Nemesis`): a `Fault` does one injection now (`inject`, `heal`,
`supported_kinds`); the `FaultInjector` decides *when*, from the plan's triggers:
- `at_s`: seconds on the monotonic clock from the workload start (`start(t0)`);
- `after_requests`: at the Nth request that ended `ok` (the workload's `on_done` callback, so it fires
  in the same event-loop turn as that completion);
- `after_decode_steps`: when rank 0's probe file (`<probe_dir>/rank0.jsonl`) holds N Step records of
  mode `decode` as `evidence.read_records` reads them (polled; a `steps` line counts each of its
  steps; CUDA-graph replays are recorded as steps too). The probe writes a step's record up
  to `probe.runtime.COPY_EVERY` steps or its copy bound after the step (its copy batches), so
  the fault lands that much later in the run than the Nth decode step itself. For such a server
  the runner sets that bound to `probe.runtime.IDLE_S` (`probe_env`), against its default of
  `runtime.COPY_WITHIN_S`.
A `stop` with `heal_after_s` is healed by SIGCONT that long after it fired, or when the injector
stops, whichever comes first. A `stop` without `heal_after_s` stays frozen through the shutdown (that
is what such a scenario measures); teardown still works, since SIGKILL ends a stopped process.
Each injection writes a Lifecycle `fault` record; each heal a Lifecycle `signal` record.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import psutil

from cptest.errors import RunError
from cptest.evidence import Lifecycle, RequestResult, RunRole
from cptest.outline import Logger, null_logger
from cptest.plan.model import FaultPlan
from cptest.probe.runtime import ENV_COPY_WITHIN_S, IDLE_S
from cptest.run.evidence_writer import RecordWriter
from cptest.run.launcher import Handle
from cptest.store import rank_file_name

SIGNAL_OF: dict[str, signal.Signals] = {
    "kill": signal.SIGKILL,
    "stop": signal.SIGSTOP,
    "cont": signal.SIGCONT,
    "sigterm": signal.SIGTERM,
    "sigint": signal.SIGINT,
}
"""Fault action -> the signal it sends."""


class Fault(Protocol):
    """One kind of fault that can be injected now. `inject` returns the detail to record."""

    supported_kinds: frozenset[str]

    def inject(self, fault: FaultPlan) -> dict[str, Any]: ...

    def heal(self, fault: FaultPlan, injected: dict[str, Any]) -> dict[str, Any] | None:
        """Undo `fault` if it can be undone (SIGCONT after SIGSTOP); None when nothing to heal."""
        ...

    def settle(self, timeout_s: float) -> None:
        """Wait, up to `timeout_s`, until every process a `kill` ended is gone (or a zombie)."""
        ...


KILLED_GONE_S = 5.0
"""How long the injector's `stop` waits for the processes its kills signalled to end. The kernel ends
a SIGKILLed process at its next scheduling, which on a loaded host can come after the workload's
last request has failed: the shutdown must not take it for a live server and signal it."""


def probe_env(faults: list[FaultPlan]) -> dict[str, str]:
    """What the probe of a server facing `faults` must be told: where one fires after a number of
    decode steps, which the injector counts in rank 0's file, the steps' records must reach it
    within IDLE_S of the step rather than the probe's usual copy bound."""
    if any(f.after_decode_steps is not None for f in faults):
        return {ENV_COPY_WITHIN_S: repr(IDLE_S)}
    return {}


def process_title(pid: int) -> str | None:
    """The title a process shows (setproctitle rewrites argv; psutil pads it with empty strings)."""
    try:
        p = psutil.Process(pid)
        cmd = " ".join(c for c in p.cmdline() if c).strip()
        return cmd or p.name()
    except (psutil.Error, OSError):
        return None


def find_titled(pids: list[int], title: str) -> int | None:
    """The pid among `pids` whose title is exactly `title` (not a prefix: TP1 is not TP10). A child
    that the titled process forks wears its title until it execs: a match whose parent matches too
    is such a child, never the process asked for."""
    exact = _not_forks([pid for pid in pids if process_title(pid) == title])
    if exact:
        return exact[0]
    short: list[int] = []  # setproctitle also sets comm, truncated to 15 bytes: only a unique match
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).name() == title:
                short.append(pid)
    short = _not_forks(short)
    return short[0] if len(short) == 1 else None


def _not_forks(matches: list[int]) -> list[int]:
    """`matches` without those whose parent is among them."""
    if len(matches) < 2:
        return matches
    kept = []
    for pid in matches:
        try:
            parent = psutil.Process(pid).ppid()
        except psutil.Error:
            parent = None  # no parent to be read: nothing says it is a fork
        if parent not in matches:
            kept.append(pid)
    return kept


class SignalFault:
    """Faults by signal to processes of the server's trees (host pids: process or docker launcher)."""

    supported_kinds = frozenset(SIGNAL_OF)

    def __init__(self, handles: list[Handle]) -> None:
        self.handles = handles
        self.killed: list[psutil.Process] = []
        """The processes `kill` faults signalled (psutil's handle tells a reused pid apart)."""

    def _all_pids(self, node: int | None = None) -> list[int]:
        """Pids of every node's tree, or of node `node`'s alone (a co-located rank's own process)."""
        out: list[int] = []
        for h in self.handles:
            if node is None or h.node.node_rank == node:
                out.extend(p for p in h.pids() if p not in out)
        return out

    def target_pid(self, fault: FaultPlan) -> tuple[int | None, str | None, str]:
        """(pid, title, error) of the fault's target; error is "" when found."""
        if fault.target == "server":
            head = next((h for h in self.handles if h.node.node_rank == 0), self.handles[0])
            pid = head.main_pid()
            return pid, process_title(pid) if pid else None, "" if pid else "the server has no main pid"
        if not fault.process_title:
            return None, None, f"fault {fault.index}: rank target without a process title in the plan"
        pid = find_titled(self._all_pids(fault.node), fault.process_title)
        if pid is None:
            tree = "the tree" if fault.node is None else f"node {fault.node}'s tree"
            return None, fault.process_title, f"no process titled {fault.process_title!r} in {tree}"
        return pid, fault.process_title, ""

    def inject(self, fault: FaultPlan) -> dict[str, Any]:
        pid, title, error = self.target_pid(fault)
        detail: dict[str, Any] = {"index": fault.index, "action": fault.action, "target": fault.target,
                                  "rank": fault.rank, "pid": pid, "title": title}
        if fault.node is not None:
            detail["node"] = fault.node
        if pid is not None:
            try:
                if fault.action == "kill":
                    with contextlib.suppress(psutil.Error):
                        self.killed.append(psutil.Process(pid))
                os.kill(pid, SIGNAL_OF[fault.action])
            except (ProcessLookupError, PermissionError) as e:
                error = f"signal {SIGNAL_OF[fault.action].name} to pid {pid} failed: {e}"
        if error:
            detail["error"] = error
        return detail

    def heal(self, fault: FaultPlan, injected: dict[str, Any]) -> dict[str, Any] | None:
        pid = injected.get("pid")
        if fault.action != "stop" or pid is None or injected.get("error"):
            return None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)
        return {"sig": "SIGCONT", "pid": pid, "fault_index": fault.index}

    def settle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while any(_running(p) for p in self.killed) and time.monotonic() < deadline:
            time.sleep(0.01)


def _running(p: psutil.Process) -> bool:
    """Alive and not a zombie (a zombie has ended; its parent has not reaped it yet)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class DecodeStepCounter:
    """Counts Step records of mode `decode` in one rank's JSON-lines file, reading only what is new:
    a `step` line of mode decode is one, a `steps` line (`evidence.StepBlock`, decode steps only)
    is one per entry of its `step` list, as `read_records` expands it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0
        self._offset = 0
        self._partial = b""

    def poll(self) -> int:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return self.count
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # an incomplete last line is read again next time
        for line in lines:
            if b'"step"' not in line:
                continue
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                kind = rec.get("kind")
                if kind == "step" and rec.get("mode") == "decode":
                    self.count += 1
                elif kind == "steps" and isinstance(rec.get("step"), list):
                    self.count += len(rec["step"])
        return self.count


class FaultInjector:
    """Fires the plan's faults at their triggers; see the module docstring. Use as:
    `inj.start(t0)`, pass `inj.on_request_done` to the workload, `inj.stop()` when it ends."""

    def __init__(self, faults: list[FaultPlan], handles: list[Handle], *, writer: RecordWriter,
                 role: RunRole = "main", probe_dir: Path | None = None,
                 fault: Fault | None = None, poll_s: float = 0.01, log: Logger | None = None) -> None:
        self.faults = sorted(faults, key=lambda f: f.index)
        self.fault = fault or SignalFault(handles)
        unsupported = [f for f in self.faults if f.action not in self.fault.supported_kinds]
        if unsupported:
            kinds = ", ".join(sorted(self.fault.supported_kinds))
            raise RunError(f"fault {unsupported[0].index}: action {unsupported[0].action!r} is not supported "
                           f"by {type(self.fault).__name__} (supported: {kinds})")
        self.writer = writer
        self.role = role
        self.log = log or null_logger()
        self.poll_s = poll_s
        self.steps = DecodeStepCounter(probe_dir / rank_file_name(0)) if probe_dir else None
        self.fired: dict[int, dict[str, Any]] = {}
        self.healed: set[int] = set()
        self._fired_at: dict[int, float] = {}
        self._t0: float | None = None
        self._completed = 0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ triggers
    def start(self, t0: float | None = None) -> None:
        """Start the clock (monotonic `t0`, default now) and the polling thread."""
        self._t0 = time.monotonic() if t0 is None else t0
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="cptest-faults", daemon=True)
        self._thread.start()

    def on_request_done(self, result: RequestResult, completed: int) -> None:
        with self._lock:
            self._completed = completed
            for f in self.faults:
                n = f.after_requests
                if f.index not in self.fired and n is not None and completed >= n:
                    self._fire(f, f"after {f.after_requests} requests")

    def _due(self, f: FaultPlan, now: float, steps: int | None) -> str | None:
        assert self._t0 is not None
        if f.at_s is not None and now - self._t0 >= f.at_s:
            return f"at {f.at_s} s"
        if f.after_requests is not None and self._completed >= f.after_requests:
            return f"after {f.after_requests} requests"
        if f.after_decode_steps is not None and steps is not None and steps >= f.after_decode_steps:
            return f"after {f.after_decode_steps} decode steps"
        if f.at_s is None and f.after_requests is None and f.after_decode_steps is None:
            return "at start"
        return None

    def _loop(self) -> None:
        next_step_poll = 0.0
        steps: int | None = None
        while not self._stop.is_set():
            now = time.monotonic()
            if self.steps is not None and now >= next_step_poll:
                steps = self.steps.poll()
                next_step_poll = now + 0.1
            with self._lock:
                for f in self.faults:
                    if f.index not in self.fired:
                        why = self._due(f, now, steps)
                        if why:
                            self._fire(f, why)
                    elif (f.heal_after_s is not None and f.index not in self.healed
                          and now - self._fired_at[f.index] >= f.heal_after_s):
                        self._heal(f)
            self._stop.wait(self.poll_s)

    # ------------------------------------------------------------------ actions
    def _fire(self, f: FaultPlan, why: str) -> None:
        now = time.monotonic()
        detail = self.fault.inject(f)
        detail["trigger"] = why
        detail["at_s"] = round(now - (self._t0 or now), 6)
        self.fired[f.index] = detail
        self._fired_at[f.index] = now
        self.writer.write(Lifecycle(run=self.role, event="fault", detail=detail))
        msg = f"fault {f.index}: {f.action} {f.target}"
        msg += f" {f.rank}" if f.rank is not None else ""
        msg += f" (pid {detail.get('pid')}, {why})"
        if "error" in detail:
            self.log.error(msg + f": {detail['error']}")
        else:
            self.log.info(msg)

    def _heal(self, f: FaultPlan) -> None:
        self.healed.add(f.index)
        detail = self.fault.heal(f, self.fired[f.index])
        if detail is not None:
            self.writer.write(Lifecycle(run=self.role, event="signal", detail=detail))
            self.log.info(f"fault {f.index}: healed ({detail.get('sig')} to pid {detail.get('pid')})")

    def stop(self) -> None:
        """Stop the thread; heal now every fired `stop` that declared `heal_after_s` and is not healed;
        wait for what the kills ended to be gone (`KILLED_GONE_S`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        with self._lock:
            for f in self.faults:
                if f.index in self.fired and f.index not in self.healed and f.heal_after_s is not None:
                    self._heal(f)
        self.fault.settle(KILLED_GONE_S)
