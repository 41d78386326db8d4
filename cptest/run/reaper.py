"""Watchdog that kills an engine process tree when cptest itself disappears.

Usage (started by `ProcessLauncher`, never by hand): `python -m cptest.run.reaper <cptest pid>
<cptest create time> <session id>`. It runs in its own session, so neither Ctrl-C on the terminal
nor the engine's own `kill_process_tree` reaches it. Every `interval_s` it refreshes a snapshot of
the engine tree (descendants of the session leader, plus every process whose session or process
group is the engine's: orphans reparented to init keep their session id). When the cptest pid is
gone (or became a zombie, or was reused: the create time differs), it SIGKILLs the process group
and every process of the snapshot, and exits. When the tree ends on its own, it exits quietly.

cptest starts it before the engine runs (the engine's first process waits at a gate until then,
`cptest.run.process`): the reaper takes its first snapshot, prints `ready` on stdout, and from then
on also watches its stdin, a pipe whose write end only cptest holds: cptest's death (any signal,
SIGKILL included) closes it, and the reaper acts at once instead of at its next poll. The pid check
stays as a second way to notice.

Slurm (`python -m cptest.run.reaper slurm <cptest pid> <create time> <job name>`, started by
`cptest.run.slurm.SlurmLauncher` before it asks for the allocation): the job's processes run under
slurmstepd on the nodes, out of reach of any local signal, so the reaper `scancel`s the job instead
(`cancel_job`: by its name, which cptest chose before the job existed, and by the id cptest writes
on the lifeline as `job <id>` as soon as salloc returns, before any step starts), until squeue no
longer lists it.

This covers the one exit path no code inside cptest can: `kill -9` of cptest (and an OOM kill).
It cannot cover `kill -9` of cptest *and* the reaper together, nor a process of the tree that
calls `setsid()` and is started after the last snapshot and after its parent died.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable

import psutil


def ident(pid: int) -> float | None:
    """Create time of a live, non-zombie process, or None."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return None


def session_members(session: int) -> dict[int, float]:
    """pid -> create time of every live process whose session or process group is `session`."""
    out: dict[int, float] = {}
    me = os.getpid()
    for p in psutil.process_iter(["pid", "create_time", "status"]):
        pid = p.info["pid"]
        if pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if os.getsid(pid) == session or os.getpgid(pid) == session:
                out[pid] = p.info["create_time"]
        except (ProcessLookupError, PermissionError, OSError):
            continue
    return out


def tree_snapshot(session: int) -> dict[int, float]:
    """The session leader's descendants plus the session/group members."""
    found = session_members(session)
    with contextlib.suppress(psutil.Error):
        leader = psutil.Process(session)
        found.setdefault(session, leader.create_time())
        for c in leader.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                found.setdefault(c.pid, c.create_time())
    return found


def kill_all(session: int, known: dict[int, float], *, group: bool = True) -> None:
    """SIGKILL the process group (unless `group` is False: its id no longer names the engine's) and
    each known pid that is still the same process."""
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(session, signal.SIGKILL)
    for pid, created in known.items():
        if ident(pid) == created:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def watch(cptest_pid: int, cptest_created: float, session: int, interval_s: float = 0.2,
          lifeline: int | None = None, ready: Callable[[], None] | None = None) -> int:
    """Watch until cptest is gone (then kill the tree) or the tree ended by itself. `lifeline`: a
    file descriptor whose end-of-file means cptest is gone; `ready` is called after the first
    snapshot."""
    leader = ident(session)

    def ours() -> bool:
        # The kernel reuses a pid only once no process has it as its session or group id: a leader
        # pid alive as another process means every process of the engine's session has ended, and
        # the number now names someone else's session (a later run's engine, in a busy process
        # table), which must not be snapshot or killed as the engine's.
        now = ident(session)
        return now is None or now == leader

    known: dict[int, float] = tree_snapshot(session)
    if ready is not None:
        ready()
    rescan_every = max(int(1.0 / interval_s), 1)  # a full process-table scan about once a second
    tick = 1
    while True:
        if tick % rescan_every == 0:
            snap = tree_snapshot(session) if ours() else {}
            known.update(snap)
            if not snap and not any(ident(p) == c for p, c in known.items()):
                return 0  # the tree ended by itself
        tick += 1
        if _lifeline_closed(lifeline, interval_s) or ident(cptest_pid) != cptest_created:
            for _ in range(50):  # up to ~5 s: processes may fork while we kill
                group = ours()
                if group:
                    known.update(tree_snapshot(session))
                alive = {p: c for p, c in known.items() if ident(p) == c}
                if not alive:
                    break
                kill_all(session, alive, group=group)
                time.sleep(0.1)
            return 0
        if lifeline is None:
            time.sleep(interval_s)


def _lifeline_closed(fd: int | None, wait_s: float) -> bool:
    """Wait up to `wait_s` on the lifeline; True on end-of-file (cptest is gone). Bytes are ignored."""
    if fd is None:
        return False
    readable, _, _ = select.select([fd], [], [], wait_s)
    if not readable:
        return False
    try:
        return os.read(fd, 64) == b""
    except OSError:
        return True


JOB_GONE_S = 60.0
"""How long the reaper of a Slurm job keeps cancelling it until `squeue` no longer lists it."""


def job_listed(name: str, job: str | None) -> bool | None:
    """Whether Slurm still lists a job of this `name` (or id `job`); None when squeue does not answer."""
    argv = ["squeue", "--noheader", "--format=%i", f"--name={name}"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    listed = set(r.stdout.split())
    return bool(listed) or (job is not None and job in listed)


def cancel_job(name: str, job: str | None, gone_s: float = JOB_GONE_S) -> bool:
    """`scancel` every job named `name` (and `job`, the id once known) until squeue lists none, up
    to `gone_s`: by name, so that a job whose id cptest never learnt (killed while `salloc` waited)
    is cancelled too. The name is unique to one run's server (`cptest.run.slurm.job_name`)."""
    deadline = time.monotonic() + gone_s
    sig = "TERM"
    while True:
        argv = ["scancel", "--quiet", f"--name={name}"]
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(argv, capture_output=True, timeout=30)
            if job is not None:
                subprocess.run(["scancel", "--quiet", job], capture_output=True, timeout=30)
                subprocess.run(["scancel", "--quiet", f"--signal={sig}", "--full", job],
                               capture_output=True, timeout=30)
        if job_listed(name, job) is False:
            return True
        if time.monotonic() > deadline:
            return False
        sig = "KILL"  # a job in its KillWait keeps its steps' processes: end them now
        time.sleep(0.5)


def watch_job(cptest_pid: int, cptest_created: float, name: str, lifeline: int | None,
              ready: Callable[[], None] | None = None, interval_s: float = 0.2) -> int:
    """Watch until cptest is gone, then cancel the Slurm job `name`. The lifeline also carries
    lines `job <id>`: the id, as soon as `salloc` gave it. A line `done` means cptest cancelled
    the job itself: exit without touching Slurm."""
    job: str | None = None
    buf = b""
    if ready is not None:
        ready()
    while True:
        closed = False
        if lifeline is None:
            time.sleep(interval_s)
        else:
            readable, _, _ = select.select([lifeline], [], [], interval_s)
            if readable:
                try:
                    data = os.read(lifeline, 4096)
                except OSError:
                    data = b""
                closed = data == b""
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    word, _, value = line.decode(errors="replace").strip().partition(" ")
                    if word == "job" and value.isdigit():
                        job = value
                    elif word == "done":
                        return 0
        if closed or ident(cptest_pid) != cptest_created:
            return 0 if cancel_job(name, job) else 1


def main(argv: list[str]) -> int:
    slurm = bool(argv) and argv[0] == "slurm"
    if slurm:
        argv = argv[1:]
    if len(argv) != 3:
        print("usage: python -m cptest.run.reaper [slurm] <cptest pid> <cptest create time> "
              "<session | Slurm job name>", file=sys.stderr)
        return 2
    # Ignore terminal signals: only the disappearance of cptest (or SIGKILL) ends the reaper.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)

    def ready() -> None:
        with contextlib.suppress(OSError):
            sys.stdout.write("ready\n")
            sys.stdout.flush()

    # stdin is the lifeline when cptest gave a pipe; a terminal or /dev/null is not one.
    try:
        lifeline = 0 if stat.S_ISFIFO(os.fstat(0).st_mode) else None
    except OSError:
        lifeline = None
    if slurm:
        return watch_job(int(argv[0]), float(argv[1]), argv[2], lifeline, ready=ready)
    return watch(int(argv[0]), float(argv[1]), int(argv[2]), lifeline=lifeline, ready=ready)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
