"""Preflight: what this machine must give a plan before anything is launched.

A run that fails because the machine could not give it what it needs says nothing about the engine.
Before the archive is begun, `preflight` looks for every such cause it can see from outside the
engine and `require` raises `InfrastructureError` (exit code 3, verdict unknown) with one line per
cause naming what is wrong and what to do about it. Nothing is launched and nothing is archived:
nothing was gathered yet.

Causes (`Cause.code`):
- `model_missing`: a checkpoint directory (local, or a hub snapshot at `<models>/hub/ORG/NAME/REVISION`:
  a run never downloads) that does not exist, has no readable
  `config.json`, or holds no weights file (`*.safetensors`, `*.bin`). SGLang would die inside
  `AutoConfig` with a traceback that reads like an engine failure.
- `model_outside`: the checkpoint directory (symlinks followed) lies outside the run's model roots,
  the model store and the scenario's folder (`cptest.run.model_roots`); nothing of it is read.
- `revision_mismatch`: a hub snapshot whose download records (`.cache/huggingface/download`) name
  another commit than the scenario's `revision`.
- `weights_mismatch`: the scenario pins the checkpoint (`sha256 "..."`) and its tree hash
  (`cptest.run.models.model_tree_sha256`) is another.
- `port_in_use`: a server's HTTP port cannot be bound on its host: another process listens there,
  and readiness would be answered by it.
- `gpus_missing`: the plan's GPUs are not all on this machine.
- `gpu_memory_busy`: a planned GPU has less free memory than one server's runtime needs
  (`RUNTIME_MIB`, the largest per-server peak measured on the 2 x H200 machine, rounded up:
  results/_suite-check). The pinned SGLang release sizes its pool from the memory free when it starts
  (mem_cache/kv_cache_configurator.py:1614-1650), so a busy GPU either fails it or shrinks its
  capacity below what the scenario planned; either way not the engine's behaviour.
- `disk_full`: less than `MIN_FREE_DISK` bytes free where the archive goes.
- `image_unpinned`, `image_missing`, `image_mismatch`, `container_engine_down`: under `--launcher
  docker`, an image that images/lock.json does not pin, that the engine does not hold, or of another
  digest; no engine answering (`cptest.run.docker.DockerLauncher.pin_images`, called by the
  pipeline just before the archive is begun).
- `slurm_missing`, `slurm_down`, `slurm_nodes`: under `--launcher slurm`, no Slurm client on PATH,
  no controller answering `sinfo`, fewer usable nodes than the widest server needs
  (`cptest.run.slurm.preflight_causes`, through the launcher's `preflight` hook, same moment).
- `engine_python`: the interpreter SGLang would run on (`--engine-python`, `$CPTEST_SGLANG_PYTHON`,
  the first `python3` on PATH: `cptest.run.interpreter`) is missing, does not run, cannot `import
  sglang` or gives no version.
- `sglang_mismatch`: it imports another SGLang than the plan's release: the argv, the admission
  rules and the lint findings were made from that release's table, so a run would judge another
  engine against them.

A cause that appears only after launch (a port taken in the meantime, cptest's own crash) is
recorded by the run itself (`pipeline.run_scenario`), with the same exit code.
"""

from __future__ import annotations

import errno
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cptest.engines.protocol import RENDEZVOUS_PORT_OFFSET
from cptest.errors import Problem, RunError
from cptest.paths import MODELS, SCENARIO, current_roots
from cptest.plan.model import Plan, ServerPlan
from cptest.run.interpreter import ENV_VAR, EnginePython, same_release
from cptest.run.model_roots import is_commit, outside_roots, recorded_revisions

CauseCode = Literal["model_missing", "model_outside", "revision_mismatch", "weights_mismatch", "port_in_use",
                    "gpus_missing", "gpu_memory_busy",
                    "disk_full", "cptest_crash", "image_unpinned", "image_missing", "image_mismatch",
                    "container_engine_down", "slurm_missing", "slurm_down", "slurm_nodes", "engine_python",
                    "sglang_mismatch"]
RUNTIME_MIB = 4608
"""Per GPU, what an SGLang server holds besides weights and KV pool. The tiny-model archives of
results/ (TP1, TP2, DCP2, PCP2 on the pinned release) held at most 4098 MiB per GPU while running (GpuSample
"running" less "before", pool of 64 MiB included); 4608 is that with an eighth of margin.
cptest.suite.demand plans with it too."""
MIN_FREE_DISK = 512 << 20
"""An archive of the two-GPU suite is 1-3 MB, but a long run's rank files grow by about 30 MB per
rank and 4 minutes of decode (results/_measure): below this a run may die writing its evidence."""


@dataclass(frozen=True)
class Cause:
    code: CauseCode
    message: str
    remedy: str

    def line(self) -> str:
        return f"unknown ({self.code}): {self.message}; {self.remedy}"


class InfrastructureError(RunError):
    """The machine could not give the run what it needs: exit code 3, the verdict unknown, one line
    per cause (what is wrong; what to do)."""

    def __init__(self, causes: list[Cause]) -> None:
        self.causes = list(causes)
        super().__init__([Problem(None, f"unknown ({c.code}): {c.message}", hint=c.remedy)
                          for c in self.causes])

    def render(self) -> str:
        return "\n".join(c.line() for c in self.causes)


GpuFree = Callable[[], dict[str, int] | None]
"""GPU index -> free MiB now, for every GPU of this machine; None when they cannot be read."""


def gpu_free_mib() -> dict[str, int] | None:
    """This machine's GPUs and their free memory (NVML, else nvidia-smi); None when unreadable."""
    from cptest.run.gpu import GpuQueryUnavailable, gpu_totals_mib, read_gpus

    totals = gpu_totals_mib()
    try:
        used = read_gpus().used_mib
    except GpuQueryUnavailable:
        return None
    if not totals:
        return None
    return {i: totals[i] - used.get(i, 0) for i in totals}


def preflight(plan: Plan, *, results: Path, gpus: GpuFree = gpu_free_mib,
              min_free_disk: int = MIN_FREE_DISK, engine_python: EnginePython | None = None) -> list[Cause]:
    """Every cause this machine gives `plan` to fail for a reason that is not the engine's.
    `engine_python` is what the SGLang interpreter said (`cptest.run.interpreter.inspect`); None
    when no SGLang server runs on a host interpreter (the reference engine, a container)."""
    causes: list[Cause] = []
    servers = plan.servers()
    causes += engine_python_causes(plan, engine_python)
    causes += _model(plan)
    for server in servers:
        causes += _ports(server)
    if any(s.engine == "sglang" for s in servers):
        causes += _gpus(servers, gpus)
    causes += _disk(results, min_free_disk)
    return causes


def require(plan: Plan, *, results: Path, gpus: GpuFree = gpu_free_mib,
            min_free_disk: int = MIN_FREE_DISK, engine_python: EnginePython | None = None) -> None:
    """Raise InfrastructureError when `preflight` finds anything."""
    causes = preflight(plan, results=results, gpus=gpus, min_free_disk=min_free_disk,
                       engine_python=engine_python)
    if causes:
        raise InfrastructureError(causes)


NAME_IT = f"--engine-python PATH or {ENV_VAR}=PATH (e.g. the environment's bin/python3)"


def engine_python_causes(plan: Plan, found: EnginePython | None) -> list[Cause]:
    """The SGLang interpreter's causes: it cannot say which SGLang it runs (`engine_python`), or it
    runs another release than a server of the plan pins (`sglang_mismatch`)."""
    if found is None:
        return []
    if not found.ok:
        return [Cause("engine_python", found.error or "no SGLang version",
                      f"name the interpreter of an SGLang environment: {NAME_IT}")]
    assert found.version is not None
    pinned = sorted({s.release for s in plan.servers() if s.engine == "sglang"})
    other = [r for r in pinned if not same_release(found.version, r)]
    if not other:
        return []
    return [Cause("sglang_mismatch", f"{found.path} (named by {found.named_by}) imports SGLang "
                  f"{found.version}; the plan pins {', '.join(other)}, whose flags, admission rules and lint "
                  "findings it was made from",
                  f"run it with a {other[0]} environment ({NAME_IT}), or pin the scenario's `engine sglang` "
                  "to the release installed")]


def _model(plan: Plan) -> list[Cause]:
    pin = plan.pins.model
    mount = plan.main.nodes[0].model_mount
    if not mount:
        return []
    d = Path(mount)
    remedy = _model_remedy(d, pin.id, pin.revision)
    if not d.is_dir():
        return [Cause("model_missing", f"model directory {d} does not exist", remedy)]
    roots = [Path(r) for token, r in current_roots().items() if token in (MODELS, SCENARIO)]
    if roots and outside_roots(d, roots):
        # Checked before anything of it is read: config.json and the weights are not opened.
        return [Cause("model_outside", f"model directory {d} lies outside the model store and the "
                      f"scenario's folder ({', '.join(str(r) for r in roots)})",
                      "copy it into the store (`cptest models add DIR`), or name its folder as the store "
                      "(--models DIR)")]
    if pin.kind == "hub" and is_commit(pin.revision or ""):
        # A branch or tag names no fixed commit to compare with; a commit hash does.
        other = recorded_revisions(d) - {pin.revision}
        if other:
            return [Cause("revision_mismatch", f"{d} was downloaded at revision {', '.join(sorted(other))}, "
                          f"the scenario pins {pin.revision}", remedy)]
    try:
        (d / "config.json").read_bytes()
    except OSError as e:
        return [Cause("model_missing", f"{d / 'config.json'} cannot be read ({e.strerror})", remedy)]
    if not any(d.glob("*.safetensors")) and not any(d.glob("*.bin")):
        return [Cause("model_missing", f"{d} holds no weights (*.safetensors, *.bin)", remedy)]
    if pin.sha256:
        from cptest.run.models import model_tree_sha256

        found = model_tree_sha256(d)
        if found != pin.sha256:
            remedy = ("these synthetic weights came out other bytes on this machine (torch build or CPU): "
                      "rerun where the archive was made" if pin.kind == "synthetic"
                      else "restore the pinned files, or pin what is there if it is meant to be used")
            return [Cause("weights_mismatch", f"{d} is not the pinned checkpoint (tree sha256 {found}, "
                          f"pinned {pin.sha256})", remedy)]
    return []


def _model_remedy(d: Path, hub_id: str | None = None, revision: str | None = None) -> str:
    from cptest.run.models import TINY

    if hub_id:
        return (f"put the snapshot there (cptest never downloads): huggingface-cli download {hub_id} "
                f"--revision {revision} --local-dir {d}")
    if d.name in TINY:
        return f"make it: cptest models make {d.name} --models {d.parent}"
    return "put the checkpoint there, or point the scenario's `model local` at where it is"


def _ports(server: ServerPlan) -> list[Cause]:
    causes = []
    wanted = [(node.host, node.port, "port") for node in server.nodes]
    if server.colocated:
        # Its nodes meet at node 0's rendezvous, on this host too.
        head = server.nodes[0]
        wanted.append((head.host, head.port + RENDEZVOUS_PORT_OFFSET, "rendezvous port"))
    for host, port, what in wanted:
        if not server_can_bind(host, port):
            causes.append(Cause("port_in_use", f"{server.role} server's {what} {host}:{port} is "
                                "in use by another process",
                                f"stop it (`ss -ltnp | grep :{port}` names it) or give other ports: "
                                "--ports MAIN,BASELINE"))
    return causes


def server_can_bind(host: str, port: int) -> bool:
    """Whether a server could bind `host:port` now. SO_REUSEADDR as the engine's server sets it: a
    port left in TIME_WAIT by an earlier run is free for it; one that something listens on, or holds
    bound without SO_REUSEADDR, is not. `host` "" is every address: any holder of the port refuses."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            return False
    return True


def _gpus(servers: list[ServerPlan], gpus: GpuFree) -> list[Cause]:
    free = gpus()
    if free is None:
        return []  # unreadable here: `pipeline.runnable` already refuses SGLang without a GPU
    wanted = sorted({g for s in servers if s.engine == "sglang" for n in s.nodes for g in n.gpu_ids})
    missing = [g for g in wanted if str(g) not in free]
    if missing:
        have = sorted(map(int, free))
        return [Cause("gpus_missing", f"the plan needs GPU(s) {wanted}; this machine has {have}",
                      "run it on a machine with those GPUs, or choose others: --gpus IDS")]
    busy = [(g, free[str(g)]) for g in wanted if free[str(g)] < RUNTIME_MIB]
    if busy:
        what = ", ".join(f"GPU {g}: {mib} MiB free" for g, mib in busy)
        return [Cause("gpu_memory_busy", f"{what}; a server needs at least {RUNTIME_MIB} MiB on each GPU",
                      "wait for or stop what holds them (nvidia-smi lists it), or choose others: --gpus IDS")]
    return []


def _disk(results: Path, min_free: int) -> list[Cause]:
    where = results
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if free < min_free:
        return [Cause("disk_full", f"{free >> 20} MiB free at {where}; a run needs {min_free >> 20} MiB",
                      "free space there, or archive elsewhere: --results DIR")]
    return []
