"""The launcher protocol: how a planned node (`NodeLaunch`) becomes a running engine process tree.

Two launchers implement it interchangeably: `process` (a subprocess tree in its own session) and
`docker` (one container per node, Docker SDK). The supervisor owns every `Handle` it gets from
`start` and calls `teardown` on every exit path; `teardown` must be idempotent and must never
raise for a tree that is already gone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from cptest.errors import Problem, ScenarioError
from cptest.plan.model import NodeLaunch


@dataclass
class ExitInfo:
    """How a node's main process ended. `status` follows subprocess: -N for signal N."""

    status: int | None
    """None while running (or unknown after a forced teardown)."""
    ended_at: float | None = None
    """time.monotonic() when the end was observed."""
    leftover_pids: list[int] = field(default_factory=list)
    """Processes of the tree still alive after teardown (must be empty)."""


@runtime_checkable
class Handle(Protocol):
    """A started node. `pids()` are host pids of the whole tree, main process first."""

    node: NodeLaunch
    log_path: Path

    def main_pid(self) -> int | None: ...

    def pids(self) -> list[int]: ...

    def poll(self) -> int | None:
        """Exit status of the main process, or None while it runs."""
        ...

    def send_signal(self, sig: int) -> None:
        """Deliver `sig` to the main process only (SGLang handles SIGTERM/SIGINT itself)."""
        ...


@runtime_checkable
class Launcher(Protocol):
    name: str

    def start(self, node: NodeLaunch, log_path: Path, labels: dict[str, str]) -> Handle:
        """Start the node; its stdout+stderr go to `log_path`. Raises RunError if it cannot start."""
        ...

    def teardown(self, handle: Handle, grace_s: float = 10.0) -> ExitInfo:
        """SIGTERM the tree, wait up to `grace_s`, then SIGKILL every process left; reap; report.

        Idempotent; never raises for a tree that is already gone.
        """
        ...

    def sweep(self, labels: dict[str, str]) -> list[str]:
        """Remove anything this launcher left behind that carries `labels` (crash recovery).

        Returns a description of each thing removed.
        """
        ...


def launcher_named(name: str, *, engine_python: str | None = None) -> Launcher:
    """The launcher the CLI's `--launcher` names: `process` (local process trees), `docker` or
    `slurm` (a Slurm job per server, docs/slurm.md). `engine_python` names SGLang's interpreter
    (`run.interpreter`); a container runs its image's, so naming one there is bad input (exit 2)."""
    if name == "slurm":
        from cptest.run.slurm import SlurmLauncher

        return SlurmLauncher(engine_python=engine_python)
    if name == "docker":
        if engine_python is not None:
            raise ScenarioError(Problem(None, "--engine-python names an interpreter of this machine; under "
                                        "--launcher docker SGLang runs on its image's (pinned by digest)",
                                        hint="leave --engine-python out, or use --launcher process"))
        from cptest.run.docker import DockerLauncher

        return DockerLauncher()
    from cptest.run.process import ProcessLauncher

    return ProcessLauncher(engine_python=engine_python)
