"""The slurm launcher: a planned server becomes one Slurm job, one step per node (docs/slurm.md).

How a server maps onto Slurm:

- **Allocation.** At the server's node 0, `salloc --no-shell -N <nodes> --ntasks-per-node=1
  --job-name <job_name> --time <limit>` asks for the job; no shell runs in it, the allocation is held
  until cptest cancels it (or the time limit, the run's deadline, ends it). The number of nodes is
  the engine's own `--nnodes` in the node's argv (1 without). Before salloc runs, a reaper
  (`python -m cptest.run.reaper slurm ...`) is watching for cptest's death, told the job's name; the
  id follows on its lifeline as soon as salloc returns, before any step starts.
- **Nodes.** Node rank k runs on the k-th node of the job's node list (`scontrol show job`, expanded
  by `scontrol show hostnames`). Node names may not resolve, so the leader's address is its
  `NodeAddr` (`scontrol show node`): `--dist-init-addr` is rewritten to `<NodeAddr of node 0>:<port>`,
  and `--nnodes`/`--node-rank` to the job's node count and the node's index in it.
- **Steps.** Each node is `srun --jobid=J -N1 -n1 -w NODE --job-name <job_name>.node<k> argv`, the
  srun client a child of cptest in its own session, with stdout+stderr to
  `logs/<role>-node<k>-<NODE>.log` (srun forwards the task's output: no shared file system needed
  for logs). The step id comes from `squeue --steps`, by the step's name. The environment is the
  process launcher's (`engine_env`) without the caller's `SLURM_*` (a cptest itself inside a job
  must not lend its job's settings to srun), and `CPTEST_PROBE_DIR` becomes
  `evidence/<role>/<NODE>/`: the ranks write there, so the archive's folder must be on a file system
  the nodes share (the usual Slurm setup; the emulated cluster is one host).
- **Signals.** `send_signal` (cptest's shutdown SIGTERM) and a rank fault reach one process of a
  node through a step on that node (`cptest.run.slurm_node`, `srun --overlap`); a fault on the
  `server` is `scancel --signal=SIG <job>`: Slurm's signal to every process of every step, what a
  job gets when it is cancelled or preempted.
- **Exit status.** srun's: the task's exit code, and 128+N for a task killed by signal N, which is
  reported as -N (the process launcher's convention, as the docker launcher does).
- **Teardown.** `scancel --signal=TERM J` the first time (every node at once), else `J.S`, up to
  `grace_s`, then `scancel --signal=KILL J.S`; when the
  last node of a job is torn down, `scancel J` until squeue no longer lists it, then the reaper is
  stopped. `atexit` cancels every job still held; SIGKILL of cptest is the reaper's.
- **Processes.** Where a node's slurmd runs on this host (the emulated cluster), the node's processes
  are the descendants of `slurmstepd: [J.S]`: process samples, `no_orphans` and readiness identity
  work as under the process launcher. On another host they cannot be seen from here: `pids()` is
  empty and a node's end is its step's end.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from cptest.errors import RunError
from cptest.plan.model import NodeLaunch, Plan, ServerPlan
from cptest.run.faults import SIGNAL_OF
from cptest.run.launcher import ExitInfo
from cptest.run.preflight import Cause
from cptest.run.process import REAPER_READY_S, engine_env, listening_pids, resolve_argv, start_reaper
from cptest.run.reaper import ident
from cptest.store import node_named, valid_name

COMMANDS = ("salloc", "srun", "scancel", "squeue", "scontrol", "sinfo")
"""The Slurm client commands the launcher runs (argv lists, never a shell)."""

CMD_TIMEOUT_S = 30.0
STEP_APPEAR_S = 60.0
"""How long a step may take to show in squeue after srun started (srun exiting first ends the wait)."""
TASK_APPEAR_S = 5.0
"""How long `start` waits for the step's task on a node of this host (its pid goes into the archive)."""
ALLOC_WAIT_S = 120
"""salloc's `--immediate`: an allocation not granted by then is an infrastructure failure."""
JOB_GONE_S = 30.0
KILL_WAIT_S = 10.0
USABLE_STATES = ("idle", "mix", "alloc", "comp")
"""sinfo states of a node that can run a step now or soon (`idle`, `mixed`, `allocated`, `completing`)."""
_SIGNAL_BASE = 128
_MAX_SIGNAL = 64


def slurm_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a Slurm client command: ours without the `SLURM_*` a surrounding job set
    (they would override the flags given), keeping `SLURM_CONF` (which cluster)."""
    src = dict(os.environ if base is None else base)
    return {k: v for k, v in src.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def run(argv: list[str], timeout_s: float = CMD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command; RunError when it cannot run or does not answer in time."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=slurm_env(),
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise RunError(f"{argv[0]} is not installed (no Slurm client here)") from None
    except subprocess.TimeoutExpired:
        raise RunError(f"{' '.join(argv[:3])} did not answer within {timeout_s:.0f} s") from None


def key_values(text: str) -> dict[str, str]:
    """`scontrol show ... -o` output (`Key=Value Key=Value`) as a dict (a value has no space)."""
    out: dict[str, str] = {}
    for token in text.split():
        k, sep, v = token.partition("=")
        if sep:
            out.setdefault(k, v)
    return out


def node_address(name: str) -> str:
    """The address of node `name`: its NodeAddr (names may not resolve), else its NodeHostname."""
    r = run(["scontrol", "--oneliner", "show", "node", name])
    if r.returncode != 0:
        raise RunError(f"scontrol show node {name} failed: {r.stderr.strip()}")
    kv = key_values(r.stdout)
    return kv.get("NodeAddr") or kv.get("NodeHostName") or name


def job_nodes(job: str) -> list[str]:
    """The job's nodes in Slurm's order (`NodeList` expanded)."""
    r = run(["scontrol", "--oneliner", "show", "job", job])
    if r.returncode != 0:
        raise RunError(f"scontrol show job {job} failed: {r.stderr.strip()}")
    nodelist = key_values(r.stdout).get("NodeList", "")
    if not nodelist or nodelist == "(null)":
        raise RunError(f"job {job} holds no nodes ({r.stdout.strip()[:200]})")
    h = run(["scontrol", "show", "hostnames", nodelist])
    names = h.stdout.split()
    if h.returncode != 0 or not names:
        raise RunError(f"scontrol show hostnames {nodelist} failed: {h.stderr.strip()}")
    return names


def job_listed(name: str) -> bool:
    """Whether squeue lists a job named `name` (any state, completing included)."""
    r = run(["squeue", "--noheader", "--format=%i", f"--name={name}"])
    return r.returncode == 0 and bool(r.stdout.split())


def is_local(addr: str) -> bool:
    """Whether `addr` (a node's NodeAddr) is this host: its processes can be seen from here."""
    if addr in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        infos = socket.getaddrinfo(addr, None)
    except OSError:
        return False
    mine = {"127.0.0.1", "::1"}
    with contextlib.suppress(OSError, AttributeError):
        for addrs in psutil.net_if_addrs().values():
            mine.update(a.address.split("%")[0] for a in addrs)
    return any(info[4][0] in mine for info in infos)


def nodes_of(node: NodeLaunch) -> int:
    """How many nodes the server spans: the engine's own `--nnodes` (both engines' flag), else 1."""
    argv = node.argv
    if "--nnodes" in argv[:-1]:
        value = argv[argv.index("--nnodes") + 1]
        if value.isdigit() and int(value) >= 1:
            return int(value)
    return 1


def with_job(argv: list[str], nnodes: int, node_rank: int, leader_addr: str) -> list[str]:
    """argv with the engine's rendezvous flags set from the job: `--nnodes`, `--node-rank` and the
    host of `--dist-init-addr` (its port kept), where argv has them."""
    out = list(argv)
    for flag, value in (("--nnodes", str(nnodes)), ("--node-rank", str(node_rank))):
        if flag in out[:-1]:
            out[out.index(flag) + 1] = value
    if "--dist-init-addr" in out[:-1]:
        i = out.index("--dist-init-addr") + 1
        port = out[i].rpartition(":")[2]
        host = f"[{leader_addr}]" if ":" in leader_addr else leader_addr
        out[i] = f"{host}:{port}"
    return out


def exit_status(code: int | None) -> int | None:
    """srun's exit code as the process launcher reports statuses: 128+N (a task killed by signal N)
    becomes -N."""
    if code is not None and _SIGNAL_BASE < code <= _SIGNAL_BASE + _MAX_SIGNAL:
        return -(code - _SIGNAL_BASE)
    return code


def job_name(labels: dict[str, str]) -> str:
    """A job name unique to this server of this run: what the reaper cancels by before the id exists."""
    run_id = re.sub(r"[^A-Za-z0-9_.-]", "_", labels.get("cptest.run", "run"))[:48]
    role = re.sub(r"[^A-Za-z0-9_.-]", "_", labels.get("cptest.role", "server"))[:16]
    return f"cptest-{run_id}-{role}-{secrets.token_hex(3)}"


# --------------------------------------------------------------------------------------------------
# Preflight


def preflight_causes(plan: Plan) -> list[Cause]:
    """Why this machine cannot run `plan` through Slurm (empty when it can): no Slurm client, no
    controller answering, fewer usable nodes than the widest server. Infrastructure, never FAIL."""
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        return [Cause("slurm_missing", f"no Slurm client here ({', '.join(missing)} not on PATH)",
                      "install slurm-client and point SLURM_CONF at the cluster's slurm.conf, or use "
                      "--launcher process; for a test cluster on this host: .ci/slurm-cluster.sh start")]
    try:
        r = run(["sinfo", "--noheader", "--Node", "--format=%N %t"])
    except RunError as e:
        return [Cause("slurm_down", str(e), "start the controller (.ci/slurm-cluster.sh start for the test "
                                            "cluster) or check SLURM_CONF")]
    if r.returncode != 0:
        first = (r.stderr.strip().splitlines() or ["no answer"])[0]
        return [Cause("slurm_down", f"sinfo failed: {first}",
                      "start slurmctld (.ci/slurm-cluster.sh start for the test cluster) or check "
                      "SLURM_CONF")]
    usable = sorted({line.split()[0] for line in r.stdout.splitlines()
                     if len(line.split()) == 2 and line.split()[1].rstrip("*~#!%$@^-") in USABLE_STATES})
    need = max(len(s.nodes) for s in plan.servers())
    if len(usable) < need:
        return [Cause("slurm_nodes", f"the plan needs {need} node(s); Slurm has {len(usable)} usable "
                      f"({', '.join(usable) or 'none'})",
                      "bring nodes up (scontrol update NodeName=... State=RESUME) or plan fewer nodes")]
    return []


# --------------------------------------------------------------------------------------------------
# Jobs and handles


@dataclass
class SlurmJob:
    """One allocation: a server's nodes. Cancelled when its last node is torn down."""

    name: str
    nodes_wanted: int
    id: str | None = None
    nodes: list[str] = field(default_factory=list)
    addrs: dict[str, str] = field(default_factory=dict)
    reaper: subprocess.Popen[bytes] | None = None
    live: int = 0
    """Nodes started and not yet torn down."""
    cancelled: bool = False
    termed: bool = False
    """Teardown sent the job-wide SIGTERM (`SlurmLauncher.teardown`)."""

    def tell_reaper(self, line: str) -> None:
        if self.reaper is not None and self.reaper.stdin is not None:
            with contextlib.suppress(OSError):
                self.reaper.stdin.write(f"{line}\n".encode())
                self.reaper.stdin.flush()


@dataclass
class SlurmHandle:
    """A node of a server as a Slurm step (see the module docstring)."""

    node: NodeLaunch
    log_path: Path
    job: SlurmJob
    node_name: str
    node_addr: str
    srun: subprocess.Popen[bytes]
    argv: list[str]
    probe_dir: Path | None
    step: str | None = None
    local: bool = False
    known: dict[int, float] = field(default_factory=dict)
    exit: ExitInfo | None = None
    torn_down: bool = False
    _stepd: psutil.Process | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def describe(self) -> dict[str, Any]:
        """What the archive records of where this node ran (Lifecycle `launched`, `slurm`)."""
        return {"launcher": "slurm", "job": self.job.id, "job_name": self.job.name, "step": self.step,
                "node_name": self.node_name, "node_addr": self.node_addr, "job_nodes": list(self.job.nodes)}

    def _stepd_process(self) -> psutil.Process | None:
        if not self.local or self.step is None:
            return None
        if self._stepd is not None and self._stepd.is_running():
            return self._stepd
        from cptest.run.slurm_node import stepd

        self._stepd = stepd(self.step)
        return self._stepd

    def pids(self) -> list[int]:
        """This node's processes, main first, where the node is this host; else []."""
        d = self._stepd_process()
        found: dict[int, float] = {}
        main: list[int] = []
        if d is not None:
            with contextlib.suppress(psutil.Error):
                main = [c.pid for c in d.children()]
                for c in d.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        found[c.pid] = c.create_time()
        with self._lock:
            for pid, created in found.items():
                self.known.setdefault(pid, created)
            items = list(self.known.items())
        alive = [pid for pid, created in items if ident(pid) == created]
        alive.sort(key=lambda p: (p not in main, p))
        return alive

    def main_pid(self) -> int | None:
        d = self._stepd_process()
        if d is None:
            return None
        with contextlib.suppress(psutil.Error):
            children = d.children()
            if children:
                return children[0].pid
        return None

    def poll(self) -> int | None:
        code = self.srun.poll()
        if code is None:
            return None
        status = exit_status(code)
        if self.exit is None:
            self.exit = ExitInfo(status, time.monotonic())
        return status

    def send_signal(self, sig: int) -> None:
        """Deliver `sig` to the node's main process only, through a step on the node."""
        if self.srun.poll() is None and self.step is not None:
            signal_on_node(self, sig, "main")

    def serves(self, port: int) -> tuple[bool | None, list[int]]:
        """As `ProcessHandle.serves`, for a node on this host; (None, []) elsewhere."""
        if not self.local:
            return None, []
        listeners = listening_pids(port)
        if not listeners:
            return None, []
        tree = set(self.pids()) | set(self.known)
        return bool(tree & set(listeners)), listeners


def signal_on_node(handle: SlurmHandle, sig: int, target: str) -> dict[str, Any]:
    """Run `cptest.run.slurm_node signal` as a step on the handle's node; its JSON answer (with
    `error` when the step could not run)."""
    argv = ["srun", f"--jobid={handle.job.id}", "--overlap", "-N1", "-n1", f"--nodelist={handle.node_name}",
            f"--job-name={handle.job.name}.signal", "--quiet", sys.executable, "-m", "cptest.run.slurm_node",
            "signal", str(handle.step), str(int(sig)), target]
    try:
        r = run(argv)
    except RunError as e:
        return {"pid": None, "title": None, "error": str(e)}
    try:
        out: dict[str, Any] = json.loads((r.stdout.strip().splitlines() or ["{}"])[-1])
    except ValueError:
        out = {}
    if r.returncode != 0 and not out.get("error"):
        out["error"] = f"srun exited {r.returncode}: {r.stderr.strip()[-300:]}"
    out.setdefault("pid", None)
    return out


_LIVE: dict[str, tuple[SlurmLauncher, SlurmJob]] = {}
_LIVE_LOCK = threading.Lock()


def cancel_all() -> None:
    """Cancel every job still held by this process (atexit, last resort). Never raises."""
    with _LIVE_LOCK:
        entries = list(_LIVE.values())
    for launcher, job in entries:
        try:
            launcher.cancel(job)
        except Exception as e:  # keep going: the next job must still be cancelled
            print(f"cptest: cancelling Slurm job {job.id or job.name} failed: {e}", file=sys.stderr)


atexit.register(cancel_all)


class SlurmLauncher:
    """Launcher of servers as Slurm jobs (see the module docstring)."""

    name = "slurm"

    def __init__(self, *, partition: str | None = None, time_limit_s: float = 24 * 3600.0,
                 reaper: bool = True, engine_python: str | None = None) -> None:
        self.engine_python = engine_python
        """SGLang's interpreter, as for the process launcher; a path every node sees (shared file
        system), inspected on the host cptest runs on."""
        self.partition = partition
        self.time_limit_s = time_limit_s
        self.use_reaper = reaper
        self.jobs: dict[tuple[str, str], SlurmJob] = {}

    # ------------------------------------------------------------------ pipeline hooks
    def preflight(self, plan: Plan) -> list[Cause]:
        """Called by the pipeline before anything is archived; the job's time limit is the run's deadline."""
        self.time_limit_s = plan.deadline_s + 300.0
        return preflight_causes(plan)

    def fault(self, handles: list[SlurmHandle], server: ServerPlan) -> SlurmFault:
        return SlurmFault(handles, server)

    # ------------------------------------------------------------------ allocation
    def _allocate(self, node: NodeLaunch, labels: dict[str, str]) -> SlurmJob:
        job = SlurmJob(job_name(labels), nodes_of(node))
        if self.use_reaper:
            job.reaper = _start_reaper(job.name)
        with _LIVE_LOCK:
            _LIVE[job.name] = (self, job)
        minutes = max(int(self.time_limit_s // 60) + 1, 1)
        argv = ["salloc", "--no-shell", f"--job-name={job.name}", f"--nodes={job.nodes_wanted}",
                "--ntasks-per-node=1", f"--time={minutes}", f"--immediate={ALLOC_WAIT_S}"]
        if self.partition:
            argv.append(f"--partition={self.partition}")
        try:
            r = run(argv, timeout_s=ALLOC_WAIT_S + CMD_TIMEOUT_S)
            m = re.search(r"Granted job allocation (\d+)", r.stderr + r.stdout)
            if r.returncode != 0 or m is None:
                raise RunError(f"salloc could not allocate {job.nodes_wanted} node(s): "
                               f"{(r.stderr.strip() or r.stdout.strip())[-400:]}")
            job.id = m.group(1)
            job.tell_reaper(f"job {job.id}")  # before any step starts
            job.nodes = job_nodes(job.id)
            if len(job.nodes) != job.nodes_wanted or not all(valid_name(n) for n in job.nodes):
                raise RunError(f"job {job.id} got nodes {job.nodes}, not {job.nodes_wanted} usable names")
            job.addrs = {n: node_address(n) for n in job.nodes}
        except BaseException:
            self.cancel(job)
            raise
        return job

    # ------------------------------------------------------------------ Launcher protocol
    def start(self, node: NodeLaunch, log_path: Path, labels: dict[str, str]) -> SlurmHandle:
        """Start `node` as a step of its server's job (allocated at the first node started)."""
        key = (labels.get("cptest.run", ""), labels.get("cptest.role", ""))
        job = self.jobs.get(key)
        if job is None or job.cancelled:
            job = self.jobs[key] = self._allocate(node, labels)
        if not 0 <= node.node_rank < len(job.nodes):
            raise RunError(f"node {node.node_rank} outside job {job.id}'s {len(job.nodes)} node(s)")
        name = job.nodes[node.node_rank]
        addr = job.addrs[name]
        env = slurm_env(engine_env(node, labels=labels))
        probe_dir = None
        if env.get("CPTEST_PROBE_DIR"):
            probe_dir = node_named(Path(env["CPTEST_PROBE_DIR"]), name)
            probe_dir.mkdir(parents=True, exist_ok=True)
            env["CPTEST_PROBE_DIR"] = str(probe_dir)
        argv = resolve_argv(with_job(node.argv, len(job.nodes), node.node_rank, job.addrs[job.nodes[0]]), env,
                            self.engine_python)
        log_path = node_named(log_path, name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        step_name = f"{job.name}.node{node.node_rank}"
        srun = ["srun", f"--jobid={job.id}", "-N1", "-n1", f"--nodelist={name}", f"--job-name={step_name}",
                "--kill-on-bad-exit=0", "--input=none", "--unbuffered", *argv]
        if probe_dir is not None:
            srun[1:1] = [f"--chdir={probe_dir}"]
        with log_path.open("ab") as log_file:
            try:
                popen = subprocess.Popen(srun, env=env, stdin=subprocess.DEVNULL, stdout=log_file,
                                         stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
            except OSError as e:
                raise RunError(f"cannot run srun: {e}") from None
        job.live += 1
        handle = SlurmHandle(node, log_path, job, name, addr, popen, argv, probe_dir, local=is_local(addr))
        handle.step = self._step_id(job, step_name, popen)
        if handle.local:  # the task is forked a moment after the step shows: record its pid
            _wait(lambda: handle.main_pid() is not None or popen.poll() is not None, TASK_APPEAR_S)
        handle.pids()
        return handle

    @staticmethod
    def _step_id(job: SlurmJob, step_name: str, popen: subprocess.Popen[bytes]) -> str | None:
        """`J.S` of the step named `step_name`, once squeue lists it; None when srun ended first."""
        deadline = time.monotonic() + STEP_APPEAR_S
        while time.monotonic() < deadline:
            r = run(["squeue", "--noheader", "--steps", f"--jobs={job.id}", "--format=%i|%j"])
            for line in r.stdout.splitlines():
                step, _, name = line.strip().partition("|")
                if name == step_name:
                    return step
            if popen.poll() is not None:
                return None
            time.sleep(0.1)
        raise RunError(f"the step {step_name} of job {job.id} did not start within {STEP_APPEAR_S:.0f} s")

    def teardown(self, handle: SlurmHandle, grace_s: float = 10.0) -> ExitInfo:  # type: ignore[override]
        """SIGTERM the node's step, wait up to `grace_s`, SIGKILL it; the last node of a job cancels
        the job. Idempotent; never raises for a step that is already gone."""
        if handle.srun.poll() is None and handle.step is not None:
            # The whole job at once, the first time: the supervisor tears nodes down one after the
            # other (node 1 first), and a follower waits for node 0 to end its ranks; one SIGTERM to
            # every step overlaps their ends instead of costing each node its grace period.
            target = handle.step if handle.job.termed else str(handle.job.id)
            handle.job.termed = True
            with contextlib.suppress(RunError):
                run(["scancel", "--quiet", "--signal=TERM", target])
            _wait(lambda: handle.srun.poll() is not None, grace_s)
        if handle.srun.poll() is None:
            if handle.step is not None:
                with contextlib.suppress(RunError):
                    run(["scancel", "--quiet", "--signal=KILL", handle.step])
            if not _wait(lambda: handle.srun.poll() is not None, KILL_WAIT_S):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(handle.srun.pid, signal.SIGKILL)  # the client; Slurm ends the step with it
        with contextlib.suppress(subprocess.TimeoutExpired):
            handle.srun.wait(timeout=KILL_WAIT_S)
        if not handle.torn_down:
            handle.torn_down = True
            handle.job.live -= 1
        if handle.job.live <= 0:
            self.cancel(handle.job)
        leftover = handle.pids()
        if leftover:
            _wait(lambda: not handle.pids(), KILL_WAIT_S)
            leftover = handle.pids()
        info = ExitInfo(handle.poll(), handle.exit.ended_at if handle.exit else None, leftover)
        handle.exit = info
        return info

    def cancel(self, job: SlurmJob) -> None:
        """Cancel the job until squeue no longer lists it, then stop its reaper. Idempotent."""
        if not job.cancelled:
            from cptest.run.reaper import cancel_job

            gone = cancel_job(job.name, job.id, gone_s=JOB_GONE_S)
            job.cancelled = True
            if not gone:
                print(f"cptest: Slurm job {job.id or job.name} still listed {JOB_GONE_S:.0f} s after scancel",
                      file=sys.stderr)
        if job.reaper is not None and job.reaper.poll() is None:
            job.tell_reaper("done")
            with contextlib.suppress(subprocess.TimeoutExpired):
                job.reaper.wait(timeout=KILL_WAIT_S)
            if job.reaper.poll() is None:
                job.reaper.kill()
                job.reaper.wait()
        if job.reaper is not None and job.reaper.stdin is not None:
            with contextlib.suppress(OSError):
                job.reaper.stdin.close()
        with _LIVE_LOCK:
            _LIVE.pop(job.name, None)

    def sweep(self, labels: dict[str, str]) -> list[str]:
        """Cancel every job of this run's name prefix (`job_name`) still listed (crash recovery)."""
        run_id = re.sub(r"[^A-Za-z0-9_.-]", "_", labels.get("cptest.run", ""))[:48]
        if not run_id:
            return []
        r = run(["squeue", "--noheader", "--format=%i %j"])
        removed = []
        for line in r.stdout.splitlines():
            jid, _, name = line.strip().partition(" ")
            if name.startswith(f"cptest-{run_id}-"):
                run(["scancel", "--quiet", jid])
                removed.append(f"Slurm job {jid} ({name})")
        return removed


def _wait(done: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _start_reaper(name: str) -> subprocess.Popen[bytes]:
    """The reaper of job `name`, watching before salloc runs (`process.start_reaper`)."""
    return start_reaper(name, lambda _status: (
        f"the reaper of Slurm job {name} did not start within {REAPER_READY_S:.0f} s; nothing was allocated"),
        mode="slurm", env=slurm_env())


# --------------------------------------------------------------------------------------------------
# Faults


class SlurmFault:
    """Faults through Slurm: a rank's signal by a step on its node (`cptest.run.slurm_node`), a
    server's by `scancel --signal=SIG <job>` (every process of every step: Slurm's own delivery)."""

    supported_kinds = frozenset(SIGNAL_OF)

    def __init__(self, handles: list[SlurmHandle], server: ServerPlan) -> None:
        self.handles = sorted(handles, key=lambda h: h.node.node_rank)
        self.per_node = max(server.world_size // max(len(server.nodes), 1), 1)

    def inject(self, fault: Any) -> dict[str, Any]:
        sig = SIGNAL_OF[fault.action]
        head = self.handles[0]
        detail: dict[str, Any] = {"index": fault.index, "action": fault.action, "target": fault.target,
                                  "rank": fault.rank, "job": head.job.id}
        if fault.target == "server":
            argv = ["scancel", f"--signal={sig.name.removeprefix('SIG')}", str(head.job.id)]
            detail.update(via="scancel", pid=head.main_pid(), title=None)
            try:
                r = run(argv)
                if r.returncode != 0:
                    detail["error"] = f"{' '.join(argv)}: {r.stderr.strip()[-300:]}"
            except RunError as e:
                detail["error"] = str(e)
            return detail
        node = (fault.rank or 0) // self.per_node
        handle = next((h for h in self.handles if h.node.node_rank == node), None)
        if handle is None or not fault.process_title:
            detail.update(pid=None, title=fault.process_title,
                          error=f"fault {fault.index}: no node {node} or no process title for rank "
                                f"{fault.rank}")
            return detail
        out = signal_on_node(handle, sig, f"title={fault.process_title}")
        detail.update(via="srun", node_name=handle.node_name, step=handle.step, pid=out.get("pid"),
                      title=out.get("title") or fault.process_title)
        if out.get("error"):
            detail["error"] = out["error"]
        return detail

    def settle(self, timeout_s: float) -> None:
        """Nothing to wait for here: a killed rank runs on another node, and the job's shutdown
        (`scancel`) ends whatever is left of it."""

    def heal(self, fault: Any, injected: dict[str, Any]) -> dict[str, Any] | None:
        if fault.action != "stop" or injected.get("error"):
            return None
        if fault.target == "server":
            with contextlib.suppress(RunError):
                run(["scancel", "--signal=CONT", str(injected.get("job"))])
            return {"sig": "SIGCONT", "job": injected.get("job"), "fault_index": fault.index,
                    "via": "scancel"}
        handle = next((h for h in self.handles if h.node_name == injected.get("node_name")), None)
        pid = injected.get("pid")
        if handle is None or pid is None:
            return None
        signal_on_node(handle, signal.SIGCONT, f"pid={pid}")
        return {"sig": "SIGCONT", "pid": pid, "fault_index": fault.index, "via": "srun"}
