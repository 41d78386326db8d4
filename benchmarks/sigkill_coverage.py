"""SIGKILL cptest at many points of a run; count the engine processes and bound ports left behind.

Issue 14, "Orphan the engine": a SIGKILL of cptest within the first ~20 ms after an engine was spawned
left the whole tree running in 4 of 5 tries. Done when: ">= 200 points of a run, including >= 50
within the first 50 ms after an engine process is spawned: 0 processes left, 0 ports left bound".

Each point is a fresh *run process* (this script with `--child`, a stand-in for `cptest run` that
uses cptest's own run stage): it runs a one-server plan through `cptest.run.runner.run_plan` with
the process launcher (launch, readiness, workload, SIGTERM shutdown), and prints `spawned <pid>
<monotonic time>` the instant the engine's first process exists (`ProcessLauncher.on_spawn`).
This script SIGKILLs it at a chosen offset from that instant (CLOCK_MONOTONIC is system-wide), then
waits up to `--settle` seconds and counts what is left:
- processes: every live process of the engine's session (the engine keeps its session id; orphans
  too), and the run process's reapers;
- ports: a TCP listener on the engine's port.
Whatever is left is then killed by this script, so a failure does not spoil the next point.

Engines: `fake` (tests/run/fake_engine.py: an SGLang-like tree of a server, 2 schedulers with a
helper each and a double-forked orphan; starts in ~0.1 s) and `reference` (the CPU reference engine,
TP2: a server and 2 forked ranks; ~2-3 s to be ready, needs a model, `--model DIR`).

    python benchmarks/sigkill_coverage.py --points 200 --early 60 --reference-points 20

Prints one line per point (`--verbose`) and a summary with the figures; exit 1 if anything was left.
The script also runs against a cptest from before issue 14 (no `on_spawn`: it then reports the
engine's Popen), as the control: copy it into such a checkout and run it there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FAKE_ENGINE = ROOT / "tests" / "run" / "fake_engine.py"
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------- the child
def child(engine: str, port: int, out: Path, model: str | None) -> None:
    """One run: a one-server plan through the run stage; `spawned <pid> <t>` on stdout at spawn."""
    from cptest.outline import null_logger
    from cptest.plan.model import ModelPin, NodeLaunch, Pins, Plan, PlannedRequest, ServerPlan, WorkloadPlan
    from cptest.run.gpu import GpuQueryUnavailable, GpuReading
    from cptest.run.process import ProcessLauncher, install_signal_handlers
    from cptest.run.runner import RunOptions, run_plan

    def no_gpu() -> GpuReading:
        raise GpuQueryUnavailable("no GPU in this benchmark")

    def spawned(pid: int) -> None:
        os.write(1, f"spawned {pid} {time.monotonic():.6f}\n".encode())

    install_signal_handlers()
    if engine == "fake":
        argv = [sys.executable, str(FAKE_ENGINE), "--port", str(port), "--orphan"]
        reqs = [PlannedRequest(index=i, input_ids=[i + 1, 2, 3, 4], max_new_tokens=8,
                               sampling={"temperature": 0.0}) for i in range(8)]
    else:
        assert model is not None
        argv = ["python3", "-m", "cptest.reference.server", "--model-path", model, "--port", str(port),
                "--tp-size", "2", "--dcp-size", "2"]
        reqs = [PlannedRequest(index=i, input_ids=[(7 * i + j) % 400 + 2 for j in range(32)],
                               max_new_tokens=8, sampling={"temperature": 0.0}) for i in range(8)]
    node = NodeLaunch(node_rank=0, gpu_ids=[], env={}, port=port, argv=argv)
    server = ServerPlan(role="main", engine="reference", release="bench", nodes=[node],
                        base_url=f"http://127.0.0.1:{port}", world_size=2, topology={"tp": 2}, geometry=[],
                        ready_timeout_s=60, shutdown_timeout_s=2)
    plan = Plan(scenario="sigkill_bench", main=server,
                workload=WorkloadPlan(seed=1, concurrency=4, rate_per_s=None, timeout_s=30, requests=reqs),
                faults=[], pins=Pins(engine="reference", release="bench",
                                     model=ModelPin(kind="local", path="x", architecture="X"),
                                     cptest_version="0", scenario_sha256="ab" * 32))
    try:
        launcher = ProcessLauncher(on_spawn=spawned)
    except TypeError:  # a cptest before issue 14 (the control): report the engine's Popen instead
        import cptest.run.process as process

        class Spawned(subprocess.Popen):  # type: ignore[type-arg]
            def __init__(self, args: list[str], *a: object, **kw: object) -> None:
                super().__init__(args, *a, **kw)  # type: ignore[arg-type]
                if "cptest.run.reaper" not in args:
                    spawned(self.pid)

        process.subprocess.Popen = Spawned  # type: ignore[misc]
        launcher = ProcessLauncher()
    run_plan(plan, out, launcher=launcher, log=null_logger(),
             options=RunOptions(sample_interval_s=0.2, gpu_query=no_gpu, ready_poll_s=0.05, gpu_settle_s=0))
    os.write(1, b"done\n")


# ---------------------------------------------------------------------------------------- the parent
def session_members(session: int) -> list[int]:
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(OSError):
            if os.getsid(p.info["pid"]) == session:
                found.append(p.info["pid"])
    return found


def reapers_of(run_pid: int) -> list[int]:
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = p.info.get("cmdline") or []
        if p.info["status"] != psutil.STATUS_ZOMBIE and "cptest.run.reaper" in cmd \
                and cmd[cmd.index("cptest.run.reaper") + 1:][:1] == [str(run_pid)]:
            found.append(p.info["pid"])
    return found


def port_bound(port: int) -> bool:
    import psutil

    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
               for c in psutil.net_connections(kind="tcp"))


def leftovers(run_pid: int, sessions: list[int], port: int) -> dict[str, list[int] | bool]:
    procs = sorted({p for s in sessions for p in session_members(s)} | set(reapers_of(run_pid)))
    return {"procs": procs, "port": port_bound(port)}


def clean(found: dict[str, list[int] | bool], sessions: list[int]) -> None:
    for s in sessions:
        with contextlib.suppress(OSError):
            os.killpg(s, signal.SIGKILL)
    for pid in found["procs"]:  # type: ignore[union-attr]
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def one_point(engine: str, offset_s: float | None, settle_s: float, model: str | None,
              tmp: Path) -> dict[str, object]:
    """Start a run process, SIGKILL it `offset_s` after its (first) engine spawn (None: let it end)."""
    import select

    port = free_port()
    out = tmp / f"run-{port}-{time.monotonic_ns()}"
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", engine, str(port), str(out)]
    if model:
        argv += ["--model", model]
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
    assert run.stdout is not None
    sessions: list[int] = []
    t_spawn = None
    killed_at = None
    buf = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        wait = 0.5
        if offset_s is not None and t_spawn is not None:
            wait = max(t_spawn + offset_s - time.monotonic(), 0.0)
            if wait == 0.0:
                run.kill()
                killed_at = time.monotonic() - t_spawn
                break
        ready, _, _ = select.select([run.stdout], [], [], wait)
        if ready:
            chunk = os.read(run.stdout.fileno(), 4096)
            if not chunk:
                break  # the run ended before the offset
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                parts = line.split()
                if parts[:1] == [b"spawned"]:
                    sessions.append(int(parts[1]))
                    if t_spawn is None:
                        t_spawn = float(parts[2])
    else:
        run.kill()
    run.wait()
    t_dead = time.monotonic()
    found: dict[str, list[int] | bool] = {"procs": [], "port": False}
    while True:
        found = leftovers(run.pid, sessions, port)
        if (not found["procs"] and not found["port"]) or time.monotonic() - t_dead > settle_s:
            break
        time.sleep(0.05)
    cleared_after = time.monotonic() - t_dead
    if found["procs"] or found["port"]:
        clean(found, sessions)
    return {"engine": engine, "offset_s": killed_at, "spawned": bool(sessions), "port": port,
            "left_procs": len(found["procs"]), "left_port": bool(found["port"]),  # type: ignore[arg-type]
            "cleared_after_s": round(cleared_after, 3), "exit": run.returncode}


def run_duration(engine: str, model: str | None, tmp: Path) -> float:
    t0 = time.monotonic()
    r = one_point(engine, None, 5.0, model, tmp)
    if r["left_procs"] or r["left_port"]:
        raise SystemExit(f"a run that ended by itself left {r}")
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", nargs=3, metavar=("ENGINE", "PORT", "OUT"))
    ap.add_argument("--points", type=int, default=200, help="fake-engine points in all")
    ap.add_argument("--early", type=int, default=60, help="of which within 50 ms of the spawn")
    ap.add_argument("--reference-points", type=int, default=20)
    ap.add_argument("--reference-early", type=int, default=8)
    ap.add_argument("--model", default=None, help="reference model dir (default: the store's llama-kv1)")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds to wait for the tree to vanish")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--json", type=Path, default=None, help="write every point here")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    if a.child:
        child(a.child[0], int(a.child[1]), Path(a.child[2]), a.model)
        return 0
    import tempfile

    rng = random.Random(a.seed)
    model = a.model
    if a.reference_points and model is None:
        from cptest.run.models import make_named, store_dir

        model = str(make_named("llama-kv1", store_dir(None))[0])
    points: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="cptest-sigkill-") as tmpdir:
        tmp = Path(tmpdir)
        plan: list[tuple[str, float]] = []
        for engine, n, early in (("fake", a.points, a.early),
                                 ("reference", a.reference_points, a.reference_early)):
            if n <= 0:
                continue
            span = run_duration(engine, model, tmp)
            print(f"{engine}: a whole run takes {span:.2f} s; {n} points, {early} within 50 ms of the spawn",
                  flush=True)
            plan += [(engine, rng.uniform(0.0, 0.05)) for _ in range(early)]
            plan += [(engine, rng.uniform(0.05, span)) for _ in range(n - early)]
        rng.shuffle(plan)
        for i, (engine, offset) in enumerate(plan):
            r = one_point(engine, offset, a.settle, model if engine == "reference" else None, tmp)
            points.append(r)
            if a.verbose or r["left_procs"] or r["left_port"]:
                print(f"{i + 1:4d} {json.dumps(r)}", flush=True)
            elif (i + 1) % 25 == 0:
                print(f"{i + 1} points done", flush=True)
    killed = [p for p in points if p["offset_s"] is not None]
    early = [p for p in killed if float(p["offset_s"]) < 0.05]  # type: ignore[arg-type]
    left_p = sum(int(p["left_procs"]) for p in points)  # type: ignore[call-overload]
    left_ports = sum(bool(p["left_port"]) for p in points)
    worst = max((float(p["cleared_after_s"]) for p in killed), default=0.0)  # type: ignore[arg-type]
    summary = {
        "points": len(points), "killed": len(killed), "within_50ms_of_spawn": len(early),
        "by_engine": {e: sum(p["engine"] == e for p in killed) for e in ("fake", "reference")},
        "processes_left": left_p, "ports_left_bound": left_ports,
        "points_with_leftovers": sum(bool(p["left_procs"] or p["left_port"]) for p in points),
        "slowest_cleanup_s": worst,
    }
    print(json.dumps(summary, indent=1))
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "points": points}, indent=1))
    return 1 if left_p or left_ports else 0


if __name__ == "__main__":
    sys.exit(main())
