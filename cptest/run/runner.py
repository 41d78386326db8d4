"""Run a Plan: launch, wait for readiness, record, drive the workload (with faults), shut down, record.

`run_plan` is the only function the pipeline calls. It owns no verdicts: it writes what it observes
into the archive as it happens (evidence first), at the paths `cptest.store.Layout` names, and
returns a `RunOutcome` summary for the log. It writes:
    logs/<role>-node<k>.log                   engine stdout+stderr
    evidence/<role>/rank<r>.jsonl             written by the probe inside ranks (CPTEST_PROBE_DIR)
    evidence/<role>/runner.jsonl              RequestResult, ProcessSample, GpuSample, ServerInfo,
                                              Lifecycle, ProbeNote (runner-side notes, rank null)
    evidence/cptest.jsonl                     cptest's outline log
The scenario, the plan and the manifest are the store's (`cptest.store.begin`/`finish`).

Per server (main, then baseline if planned): sample GPUs and host processes (`before`); start every
node; poll `GET /health_generate` with `retry` until 200, while watching every main process (an exit
during launch is `launch_failed` with the status and the log's last lines: a *result*, for scenarios
that expect a rejection, not an infrastructure error); record `/server_info`; run the workload (main:
with the plan's faults); SIGTERM each main process and time until every process of every tree is gone
(within `shutdown_timeout_s`, else `timeout` and a forced teardown); sample again (`after`), and wait
up to `gpu_settle_s` for GPU memory to return to its `before` level (`final`). The baseline runs the
same requests without faults; it is skipped when the main server did not become ready.

Ctrl-C or SIGTERM to cptest (see `process.install_signal_handlers`): a Lifecycle `interrupted`
record, teardown of everything, then KeyboardInterrupt (Ctrl-C) or RunError exit 3 (SIGTERM/SIGHUP).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from cptest.errors import RunError
from cptest.evidence import Lifecycle, ProbeNote, ServerInfo
from cptest.outline import JsonLinesSink, Logger
from cptest.plan.model import Plan, ServerPlan
from cptest.retry import Abort, retry
from cptest.run.baseline_cache import BaselineCache
from cptest.run.driver import WorkloadDriver, WorkloadSummary
from cptest.run.evidence_writer import RecordWriter
from cptest.run.faults import FaultInjector
from cptest.run.gpu import GpuReading, read_gpus
from cptest.run.launcher import ExitInfo, Launcher
from cptest.run.process import Interrupted
from cptest.run.supervisor import Owned, Supervisor, gpu_settled
from cptest.store import Layout

Role = Literal["main", "baseline"]

LOG_TAIL_LINES = 30
"""How many last log lines a `launch_failed` record carries."""


@dataclass
class ServerOutcome:
    role: Role
    ready: bool = False
    ready_after_s: float | None = None
    launch_failed: dict | None = None
    workload: WorkloadSummary | None = None
    shutdown_s: float | None = None
    all_exited: bool | None = None
    exits: list[ExitInfo] = field(default_factory=list)
    reused: str | None = None
    """The baseline cache key whose evidence this archive holds instead of a new run, if any."""


@dataclass
class RunOutcome:
    out_dir: Path
    main: ServerOutcome
    baseline: ServerOutcome | None = None
    skipped: list[str] = field(default_factory=list)
    """Why a planned phase did not run (e.g. the baseline after a failed main launch)."""


@dataclass
class RunOptions:
    """Knobs of the run stage that are not part of the plan (test seams and local settings)."""

    sample_interval_s: float = 2.0
    gpu_query: Callable[[], GpuReading] = read_gpus
    gpu_settle_s: float = 15.0
    http_timeout_s: float = 10.0
    ready_poll_s: float = 1.0
    incremental_stream: bool = False
    """True when the plan's argv has --incremental-streaming-output (delta chunks)."""
    labels: dict[str, str] = field(default_factory=dict)
    baseline_cache: BaselineCache | None = None
    """Where baselines are kept and found (`cptest.run.baseline_cache`); None: always run them."""
    baseline_key: tuple[str, dict] | None = None
    """The plan's baseline key and what it was computed from (the pipeline sets it: it needs the
    machine's environment); None: the baseline cannot be cached."""


def log_tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def run_plan(plan: Plan, out_dir: Path, *, launcher: Launcher, log: Logger,
             options: RunOptions | None = None) -> RunOutcome:
    """Execute `plan`, writing the archive layout under `out_dir` (see the module docstring).

    Raises RunError for infrastructure faults (cannot start the engine, sampler crash, SIGTERM to
    cptest) and KeyboardInterrupt on Ctrl-C; in every case every started process is torn down first.
    A rejected launch or a failing server is a recorded result, not an exception.
    """
    opts = options or RunOptions()
    layout = Layout(out_dir)
    layout.make_dirs(["main"] + (["baseline"] if plan.baseline is not None else []))
    sink = JsonLinesSink(layout.cptest_log)
    log.add_sink(sink)
    writers: dict[Role, RecordWriter] = {}
    current: list[Role] = ["main"]
    try:
        with Supervisor(launcher, log=log, sample_interval_s=opts.sample_interval_s, gpu_query=opts.gpu_query,
                        title_prefix=plan.main.process_title_prefix.split("::")[0] + "::") as sup:
            try:
                writers["main"] = RecordWriter(layout.runner_file("main"))
                outcome = RunOutcome(out_dir, _run_server(sup, plan, plan.main, writers["main"], layout,
                                                          opts, log, faults=True))
                if plan.baseline is not None:
                    if not outcome.main.ready:
                        why = "baseline skipped: the main server did not become ready"
                        outcome.skipped.append(why)
                        log.info(why)
                    elif (reused := _reuse_baseline(layout, opts, writers["main"], log)) is not None:
                        outcome.baseline = reused
                    else:
                        current[0] = "baseline"
                        writers["baseline"] = RecordWriter(layout.runner_file("baseline"))
                        outcome.baseline = _run_server(sup, plan, plan.baseline, writers["baseline"], layout,
                                                       opts, log, faults=False)
                        writers["baseline"].close()
                        _keep_baseline(outcome.baseline, len(plan.workload.requests), layout, opts,
                                       writers["main"], log)
                return outcome
            except KeyboardInterrupt as e:
                reason = signal.Signals(e.signum).name if isinstance(e, Interrupted) else "SIGINT"
                w = writers.get(current[0])
                if w is not None:
                    w.write(Lifecycle(run=current[0], event="interrupted", detail={"reason": reason}))
                log.error(f"interrupted ({reason}); tearing down every started process")
                raise
    except Interrupted as e:
        raise RunError(f"cptest was interrupted by {signal.Signals(e.signum).name}; every started process "
                       f"was torn down; the partial evidence is in {out_dir}") from None
    finally:
        for w in writers.values():
            w.close()
        log.remove_sink(sink)


def _reuse_baseline(layout: Layout, opts: RunOptions, writer: RecordWriter,
                    log: Logger) -> ServerOutcome | None:
    """Copy a cached baseline into the archive instead of running it; None on a miss."""
    if opts.baseline_cache is None or opts.baseline_key is None:
        return None
    key = opts.baseline_key[0]
    entry = opts.baseline_cache.lookup(key)
    if entry is None:
        return None
    opts.baseline_cache.restore(key, layout)
    writer.write(Lifecycle(run="baseline", event="baseline_reused",
                           detail={"key": key, "archive": entry.get("archive"),
                                   "stored": entry.get("stored")}))
    log.info(f"baseline reused from the cache ({key[:12]}, made by {entry.get('archive')})")
    return ServerOutcome("baseline", ready=True, reused=key)


def _keep_baseline(out: ServerOutcome, requests: int, layout: Layout, opts: RunOptions, writer: RecordWriter,
                   log: Logger) -> None:
    """Store a clean baseline (ready, every request completed, every process exited) in the cache."""
    if opts.baseline_cache is None or opts.baseline_key is None:
        return
    w = out.workload
    if not (out.ready and out.all_exited and w is not None and w.completed == requests):
        return
    key, material = opts.baseline_key
    if opts.baseline_cache.store(key, material, layout):
        writer.write(Lifecycle(run="baseline", event="baseline_cached", detail={"key": key}))
        log.info(f"baseline stored in the cache ({key[:12]})")


def _run_server(sup: Supervisor, plan: Plan, server: ServerPlan, writer: RecordWriter, layout: Layout,
                opts: RunOptions, log: Logger, *, faults: bool) -> ServerOutcome:
    role: Role = server.role
    out = ServerOutcome(role)
    probe_dir = layout.role_dir(role)
    with log.step(f"{role} server: {server.engine} {server.release}, {len(server.nodes)} node(s)"):
        gpu_before = sup.sample("before", role, writer, host=True)
        owned: list[Owned] = []
        with log.step(f"launching {role} server"):
            for node in sorted(server.nodes, key=lambda n: n.node_rank):
                env = dict(node.env)
                if server.probe:
                    env["CPTEST_PROBE_DIR"] = str(probe_dir)
                launch = node.model_copy(update={"env": env})
                labels = {"cptest.scenario": plan.scenario, "cptest.role": role,
                          "cptest.run": layout.root.name, **opts.labels}
                owned.append(sup.start(launch, layout.log(role, node.node_rank),
                                       labels, role, writer))
        _wait_ready(sup, server, owned, writer, out, opts, log)
        if out.ready:
            _record_server_info(server, writer, opts)
            sup.sample("running", role, writer)  # the ready tree, even for a workload shorter than a period
            sup.start_sampling(role, writer)
            try:
                out.workload = _drive(sup, plan, server, owned, writer, probe_dir, opts, log, faults=faults)
            finally:
                sup.stop_sampling()
            sup.check()
        _shutdown(sup, server, owned, writer, out, log)
        sup.sample("after", role, writer, host=True)
        if gpu_before is not None:
            with log.step("waiting for GPU memory to return to its pre-launch level"), \
                    contextlib.suppress(RunError):
                retry(gpu_settled(sup, gpu_before), opts.gpu_settle_s, 0.5, "waiting for GPU memory")
            sup.sample_gpu("final", role, writer)
    return out


def _wait_ready(sup: Supervisor, server: ServerPlan, owned: list[Owned], writer: RecordWriter,
                out: ServerOutcome, opts: RunOptions, log: Logger) -> None:
    t0 = time.monotonic()
    url = server.base_url.rstrip("/") + "/health_generate"

    def ready(last: bool) -> bool:
        for o in owned:
            status = o.handle.poll()
            if status is not None:
                raise Abort(f"node {o.handle.node.node_rank} (pid {o.handle.main_pid()}) exited with "
                            f"status {status} during launch")
        r = httpx.get(url, timeout=opts.http_timeout_s)
        return r.status_code == 200

    limit = server.ready_timeout_s
    with log.step(f"waiting for {server.role} server readiness ({url}, up to {limit:.0f} s)"):
        try:
            _, after = retry(ready, server.ready_timeout_s, opts.ready_poll_s, f"waiting for {url}")
        except Abort as e:
            after = time.monotonic() - t0
            failed = next(o for o in owned if o.handle.poll() is not None)
            status = failed.handle.poll()
            out.launch_failed = {"node": failed.handle.node.node_rank, "status": status,
                                 "after_s": round(after, 3),
                                 "reason": f"{e}\n{log_tail(failed.handle.log_path)}".strip()}
            writer.write(Lifecycle(run=server.role, event="launch_failed", detail=out.launch_failed))
            log.warning(f"{server.role} server exited during launch (status {status}); "
                        f"see {failed.handle.log_path}")
            return
        except RunError as e:
            after = time.monotonic() - t0
            writer.write(Lifecycle(run=server.role, event="timeout", detail={"what": "ready"}))
            tail = log_tail(owned[0].handle.log_path)
            out.launch_failed = {"node": owned[0].handle.node.node_rank, "status": None,
                                 "after_s": round(after, 3), "reason": f"{e}\n{tail}".strip()}
            writer.write(Lifecycle(run=server.role, event="launch_failed", detail=out.launch_failed))
            log.warning(f"{server.role} server not ready within {server.ready_timeout_s} s; "
                        f"see {owned[0].handle.log_path}")
            return
    out.ready, out.ready_after_s = True, round(after, 3)
    writer.write(Lifecycle(run=server.role, event="ready", detail={"after_s": out.ready_after_s}))


def _record_server_info(server: ServerPlan, writer: RecordWriter, opts: RunOptions) -> None:
    base = server.base_url.rstrip("/")
    errors = []
    for path in ("/server_info", "/get_server_info"):  # 0.5.17: /get_server_info is the deprecated alias
        try:
            r = httpx.get(base + path, timeout=opts.http_timeout_s)
            if r.status_code == 200:
                writer.write(ServerInfo(run=server.role, info=r.json()))
                return
            errors.append(f"{path}: HTTP {r.status_code}")
        except (httpx.HTTPError, ValueError) as e:
            errors.append(f"{path}: {type(e).__name__}: {e}")
    writer.write(ProbeNote(level="warning", message="server info not recorded: " + "; ".join(errors)))


def _drive(sup: Supervisor, plan: Plan, server: ServerPlan, owned: list[Owned], writer: RecordWriter,
           probe_dir: Path, opts: RunOptions, log: Logger, *, faults: bool) -> WorkloadSummary:
    n = len(plan.workload.requests)
    injector = None
    if faults and plan.faults:
        injector = FaultInjector(plan.faults, [o.handle for o in owned], writer=writer, role=server.role,
                                 probe_dir=probe_dir if server.probe else None, log=log)
    on_done = [lambda result, completed: sup.check()]
    if injector is not None:
        on_done.append(injector.on_request_done)
    driver = WorkloadDriver(server.base_url, plan.workload, role=server.role, writer=writer, on_done=on_done,
                            incremental_stream=opts.incremental_stream,
                            progress=log.progress(f"{server.role} requests", n))
    with log.step(f"{server.role} workload: {n} requests"):
        if injector is not None:
            injector.start()
        try:
            summary = driver.run()
        finally:
            if injector is not None:
                injector.stop()
    writer.write(Lifecycle(run=server.role, event="workload_done", detail=summary.as_detail()))
    return summary


def _shutdown(sup: Supervisor, server: ServerPlan, owned: list[Owned], writer: RecordWriter,
              out: ServerOutcome, log: Logger) -> None:
    role = server.role
    writer.write(Lifecycle(run=role, event="shutdown_begin", detail={}))
    exited: set[int] = set()
    for o in owned:  # already gone (a rejected launch, a fault): say so before signalling the rest
        status = o.handle.poll()
        if status is not None:
            exited.add(o.handle.node.node_rank)
            writer.write(Lifecycle(run=role, event="exited", detail={
                "node": o.handle.node.node_rank, "status": status, "after_s_since_signal": None}))
    t_sig = time.monotonic()
    for o in owned:
        pid = o.handle.main_pid()
        if o.handle.poll() is None and pid is not None:
            o.handle.send_signal(signal.SIGTERM)
            writer.write(Lifecycle(run=role, event="signal", detail={"sig": "SIGTERM", "pid": pid}))

    def all_gone(last: bool) -> bool:
        gone = all(not o.handle.pids() for o in owned)  # first: once gone, poll() below sees the exit
        for o in owned:
            k = o.handle.node.node_rank
            status = o.handle.poll()
            if status is not None and k not in exited:
                exited.add(k)
                writer.write(Lifecycle(run=role, event="exited", detail={
                    "node": k, "status": status, "after_s_since_signal": round(time.monotonic() - t_sig, 3)}))
        # The kernel may show the main process gone a moment before waitpid() reports it: ask again,
        # so that its `exited` record is not lost, unless this is the last try.
        return gone and (last or len(exited) == len(owned))

    with log.step(f"shutting down {role} server (SIGTERM, up to {server.shutdown_timeout_s:.0f} s)"):
        try:
            _, _ = retry(all_gone, server.shutdown_timeout_s, 0.05, f"waiting for the {role} tree to exit")
            out.all_exited = True
        except RunError:
            out.all_exited = False
            writer.write(Lifecycle(run=role, event="timeout", detail={"what": "shutdown"}))
            left = [p for o in owned for p in o.handle.pids()]
            log.warning(f"{role}: processes {left} still alive {server.shutdown_timeout_s} s after SIGTERM; "
                        f"killing them")
        out.shutdown_s = round(time.monotonic() - t_sig, 3)
        writer.write(Lifecycle(run=role, event="shutdown_done",
                               detail={"after_s": out.shutdown_s, "all_exited": out.all_exited}))
        for o in owned:
            out.exits.append(sup.teardown(o, grace_s=1.0))
