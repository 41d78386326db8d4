"""What the slurm launcher runs *on a node*, as a Slurm step of the run's job: one signal to one process
of another step on the same node.

    srun --jobid=J --overlap -N1 -n1 -w NODE python -m cptest.run.slurm_node signal J.S SIGNUM TARGET

TARGET is `main` (the step's task: the engine's main process on that node, a child of slurmstepd),
`title=T` (the process of the step titled exactly T: a rank, `cptest.run.faults.find_titled`) or
`pid=N` (that pid, only if it is a process of the step: the heal of a stopped rank).

Why a step and not `scancel --signal`: Slurm signals *every* process of a step (proctrack's
container), whereas a rank fault targets one rank and cptest's shutdown signals the main process
only (the `Launcher` protocol's `send_signal`), as the process and docker launchers do. A step on
the node reaches that node's processes wherever it is, without ssh; the step's processes are the
descendants of `slurmstepd: [J.S]` on this host (the other node's slurmstepd, even on one host,
has another step id).

Prints one JSON object: {"pid", "title", "error"}; exit 0 when the signal was sent, 1 otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

import psutil

from cptest.run.faults import find_titled, process_title


def stepd(step: str) -> psutil.Process | None:
    """The slurmstepd of `step` (`J.S`) on this host: its title is `slurmstepd: [J.S]`."""
    want = f"slurmstepd: [{step}]"
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(c for c in (p.info.get("cmdline") or []) if c).strip()
        if cmd == want:
            return p
    return None


def step_pids(step: str) -> tuple[list[int], list[int]]:
    """(the task pids: children of the step's slurmstepd, every descendant) on this host."""
    d = stepd(step)
    if d is None:
        return [], []
    try:
        children = [c.pid for c in d.children()]
        every = [c.pid for c in d.children(recursive=True)]
    except psutil.Error:
        return [], []
    return children, every


def signal_target(step: str, signum: int, target: str) -> dict[str, object]:
    """Send `signum` to `target` of `step` on this host (see the module docstring)."""
    tasks, every = step_pids(step)
    out: dict[str, object] = {"pid": None, "title": None, "error": ""}
    if not every:
        out["error"] = f"no process of step {step} on this node"
        return out
    pid: int | None
    if target == "main":
        pid = tasks[0] if tasks else None
    elif target.startswith("title="):
        pid = find_titled(every, target[len("title="):])
    elif target.startswith("pid=") and target[4:].isdigit():
        pid = int(target[4:]) if int(target[4:]) in every else None
    else:
        out["error"] = f"unknown target {target!r}"
        return out
    if pid is None:
        out["error"] = f"no process {target!r} in step {step} on this node"
        return out
    out["pid"], out["title"] = pid, process_title(pid)
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError) as e:
        out["error"] = f"signal {signum} to pid {pid} failed: {e}"
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] != "signal" or not argv[2].isdigit():
        print("usage: python -m cptest.run.slurm_node signal J.S SIGNUM main|title=T|pid=N", file=sys.stderr)
        return 2
    out = signal_target(argv[1], int(argv[2]), argv[3])
    with contextlib.suppress(OSError):
        print(json.dumps(out), flush=True)
    return 1 if out["error"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
