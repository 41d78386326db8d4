"""Run a Plan: launch, wait for readiness, record, drive the workload (with faults), shut down, record.

`run_plan` is the only function the pipeline calls. It owns no verdicts: it writes what it observes
into the archive as it happens (evidence first), at the paths `cptest.store.Layout` names, and
returns a `RunOutcome` summary for the log. It writes:
    logs/<role>-node<k>.log                   engine stdout+stderr (`-<node name>` added by a
                                              launcher that names nodes: Slurm)
    evidence/<role>/rank<r>.jsonl             written by the probe inside ranks (CPTEST_PROBE_DIR)
    evidence/<role>/runner.jsonl              RequestResult, ProcessSample, GpuSample, ServerInfo,
                                              Lifecycle, ProbeNote (runner-side notes, rank null)
    evidence/cptest.jsonl                     cptest's outline log
The scenario, the plan and the manifest are the store's (`cptest.store.begin`/`finish`).

Servers in order: when the plan scores (`workload.score_topk`), the baseline, the noise-floor
control (when planned and the baseline answered), the eager twin (when planned), then the main
server; otherwise the main server, then the baseline and the eager twin (both skipped when the main
server did not become ready; without a baseline the twin runs before the main server); a baseline
or control whose evidence the cache holds is copied instead of run (`cptest.run.baseline_cache`).
Per server: sample GPUs and host processes (`before`); start every node; poll
`GET /health_generate` with `retry` until 200, while watching every main process (an exit during
launch is `launch_failed` with the status and the log's last lines: a *result*, for scenarios that
expect a rejection, not an infrastructure error); record `/server_info`; run the workload (main:
with the plan's faults); SIGTERM each main process and time until every process of every tree is
gone (within `shutdown_timeout_s`, else `timeout` and a forced teardown); sample again (`after`),
and wait up to `gpu_settle_s` for GPU memory to return to its `before` level (`final`). The
baseline, the control and the eager twin run the same requests without faults. When the plan
scores (`workload.score_topk`), every server scores the baseline's sequences (`cptest.run.scoring`)
on an empty prefix cache: the baseline after its workload (its own answers), the others before
theirs (a fault may end the main server during the workload), with `/flush_cache` between scoring
and workload.

Ctrl-C or SIGTERM to cptest (see `process.install_signal_handlers`): a Lifecycle `interrupted`
record, teardown of everything, then KeyboardInterrupt (Ctrl-C) or RunError exit 3 (SIGTERM/SIGHUP).
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import httpx

from cptest.engines import colocated_launch, engine_for
from cptest.errors import RunError
from cptest.evidence import Lifecycle, ProbeNote, RequestResult, ServerInfo, read_records
from cptest.outline import JsonLinesSink, Logger
from cptest.plan.model import Plan, ServerPlan
from cptest.retry import Abort, retry
from cptest.run.baseline_cache import BaselineCache
from cptest.run.driver import WorkloadDriver, WorkloadSummary
from cptest.run.evidence_writer import RecordWriter
from cptest.run.faults import FaultInjector, probe_env
from cptest.run.gpu import GpuReading, read_gpus
from cptest.run.launcher import ExitInfo, Launcher
from cptest.run.process import Interrupted
from cptest.run.scoring import Sequence, score, sequences_from
from cptest.run.supervisor import Owned, Supervisor, gpu_settled
from cptest.store import Layout, existing_file

Role = Literal["main", "baseline", "control", "eager"]

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
    control: ServerOutcome | None = None
    eager: ServerOutcome | None = None
    """The main server's eager twin (`graph parity vs eager`), when planned."""
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
    control_key: tuple[str, dict] | None = None
    """The same for the noise-floor control."""


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
    layout.make_dirs([s.role for s in plan.servers()])
    sink = JsonLinesSink(layout.cptest_log)
    log.add_sink(sink)
    writers: dict[Role, RecordWriter] = {}
    current: list[Role] = ["main"]
    for_main: list[Lifecycle] = []  # cache hits and stores, told in the main runner file
    disarm = _arm_deadline(plan.deadline_s)  # the whole run, teardown included, is bounded
    try:
        with Supervisor(launcher, log=log, sample_interval_s=opts.sample_interval_s, gpu_query=opts.gpu_query,
                        title_prefix=plan.main.process_title_prefix.split("::")[0] + "::") as sup:
            try:
                skipped: list[str] = []
                seqs: list[Sequence] | None = None
                base_out = ctl_out = None
                if plan.baseline is not None and not plan.workload.score_topk:
                    # Nothing to score: main first, and no baseline at all when main never came up.
                    writers["main"] = _runner_writer(layout, "main")
                    main = _run_server(sup, plan, plan.main, writers["main"], layout, opts, log, faults=True)
                    twin_out = None
                    if main.ready:
                        current[0] = "baseline"
                        base_out = _reference(sup, plan, plan.baseline, opts.baseline_key, None, writers,
                                              layout, opts, log, for_main)
                        twin_out = _eager_twin(sup, plan, None, writers, current, layout, opts, log)
                    else:
                        skipped.append("baseline skipped: the main server did not become ready")
                        log.info(skipped[-1])
                    for note in for_main:
                        writers["main"].write(note)
                    return RunOutcome(out_dir, main, baseline=base_out, eager=twin_out, skipped=skipped)
                if plan.baseline is not None:
                    current[0] = "baseline"
                    base_out = _reference(sup, plan, plan.baseline, opts.baseline_key, None, writers, layout,
                                          opts, log, for_main)
                    if plan.workload.score_topk:
                        seqs = _baseline_sequences(layout, plan)
                if plan.control is not None:
                    if seqs:
                        current[0] = "control"
                        ctl_out = _reference(sup, plan, plan.control, opts.control_key, seqs, writers, layout,
                                             opts, log, for_main)
                    else:
                        skipped.append("control skipped: the baseline gave no sequence to score")
                        log.info(skipped[-1])
                twin_out = _eager_twin(sup, plan, seqs, writers, current, layout, opts, log)
                current[0] = "main"
                writers["main"] = _runner_writer(layout, "main")
                for note in for_main:
                    writers["main"].write(note)
                main = _run_server(sup, plan, plan.main, writers["main"], layout, opts, log, faults=True,
                                   seqs=seqs)
                return RunOutcome(out_dir, main, baseline=base_out, control=ctl_out, eager=twin_out,
                                  skipped=skipped)
            except KeyboardInterrupt as e:
                reason = signal.Signals(e.signum).name if isinstance(e, Interrupted) else "SIGINT"
                reason = "deadline" if isinstance(e, DeadlineExceeded) else reason
                w = writers.get(current[0])
                if w is not None:
                    w.write(Lifecycle(run=current[0], event="interrupted", detail={"reason": reason}))
                log.error(f"interrupted ({reason}); tearing down every started process")
                raise
    except DeadlineExceeded:
        raise RunError(f"the run's deadline of {plan.deadline_s:g} s was reached (declare a longer one: "
                       f"deadline 2h); every started process was torn down; the partial evidence is in "
                       f"{out_dir}") from None
    except Interrupted as e:
        raise RunError(f"cptest was interrupted by {signal.Signals(e.signum).name}; every started process "
                       f"was torn down; the partial evidence is in {out_dir}") from None
    finally:
        disarm()
        for w in writers.values():
            w.close()
        log.remove_sink(sink)


class DeadlineExceeded(Interrupted):
    """The plan's `deadline_s` passed: the run unwinds and tears down as on SIGTERM (exit 3, unknown)."""


def _arm_deadline(seconds: float) -> Callable[[], None]:
    """Raise `DeadlineExceeded` in the main thread `seconds` from now; returns the disarm function.
    Off the main thread (a test harness) no signal can be delivered, and nothing is armed."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_alarm(signum: int, frame: object) -> None:
        raise DeadlineExceeded(signum)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)

    def disarm() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

    return disarm


def _runner_writer(layout: Layout, role: Role) -> RecordWriter:
    """A role's runner.jsonl, written from the writer's own thread: the workload driver writes a
    result as each request ends, on its event loop, where the next requests connect."""
    return RecordWriter(layout.runner_file(role), background=True)


def _reference(sup: Supervisor, plan: Plan, server: ServerPlan, key: tuple[str, dict] | None,
               seqs: list[Sequence] | None, writers: dict[Role, RecordWriter], layout: Layout,
               opts: RunOptions,
               log: Logger, for_main: list[Lifecycle]) -> ServerOutcome:
    """A server the main one is compared with (baseline, control): copied from the cache when it
    holds the same evidence, else run (and stored when clean)."""
    role: Role = server.role
    if (reused := _reuse(role, key, layout, opts, log, for_main)) is not None:
        return reused
    writers[role] = _runner_writer(layout, role)
    out = _run_server(sup, plan, server, writers[role], layout, opts, log, faults=False, seqs=seqs)
    writers[role].close()
    _keep(role, key, out, len(plan.workload.requests), layout, opts, log, for_main)
    return out


def _eager_twin(sup: Supervisor, plan: Plan, seqs: list[Sequence] | None, writers: dict[Role, RecordWriter],
                current: list[Role], layout: Layout, opts: RunOptions, log: Logger) -> ServerOutcome | None:
    """The main server's eager twin (`graph parity vs eager`, docs/language.md "Graph parity"), when
    planned: the main layout with
    every CUDA-graph phase disabled, scoring the baseline's sequences and running the workload like
    the control, without faults. Never cached: it is the layout under test, on the engine under test."""
    if plan.eager is None:
        return None
    current[0] = "eager"
    writers["eager"] = _runner_writer(layout, "eager")
    return _run_server(sup, plan, plan.eager, writers["eager"], layout, opts, log, faults=False, seqs=seqs)


def _baseline_sequences(layout: Layout, plan: Plan) -> list[Sequence]:
    """What every server scores: the baseline's answers, read back from its runner file (a run or a
    cache copy alike)."""
    path = layout.runner_file("baseline")
    if not existing_file(path):  # a cached baseline's copy may come from a finished, packed archive
        return []
    records, _ = read_records(path)
    return sequences_from((r for r in records if isinstance(r, RequestResult)), plan.workload)


def _reuse(role: Role, key: tuple[str, dict] | None, layout: Layout, opts: RunOptions, log: Logger,
           for_main: list[Lifecycle]) -> ServerOutcome | None:
    """Copy a cached server's evidence into the archive instead of running it; None on a miss."""
    if opts.baseline_cache is None or key is None:
        return None
    entry = opts.baseline_cache.lookup(key[0])
    if entry is None:
        return None
    opts.baseline_cache.restore(key[0], layout, role)
    for_main.append(Lifecycle(run=role, event=f"{role}_reused",
                              detail={"key": key[0], "archive": entry.get("archive"),
                                      "stored": entry.get("stored")}))
    log.info(f"{role} reused from the cache ({key[0][:12]}, made by {entry.get('archive')})")
    return ServerOutcome(role, ready=True, reused=key[0])


def _keep(role: Role, key: tuple[str, dict] | None, out: ServerOutcome, requests: int, layout: Layout,
          opts: RunOptions, log: Logger, for_main: list[Lifecycle]) -> None:
    """Store a clean server (ready, every request completed, every process exited) in the cache."""
    if opts.baseline_cache is None or key is None:
        return
    w = out.workload
    if not (out.ready and out.all_exited and w is not None and w.completed == requests):
        return
    if opts.baseline_cache.store(key[0], key[1], layout, role):
        for_main.append(Lifecycle(run=role, event=f"{role}_cached", detail={"key": key[0]}))
        log.info(f"{role} stored in the cache ({key[0][:12]})")


def _run_server(sup: Supervisor, plan: Plan, server: ServerPlan, writer: RecordWriter, layout: Layout,
                opts: RunOptions, log: Logger, *, faults: bool,
                seqs: list[Sequence] | None = None) -> ServerOutcome:
    role: Role = server.role
    out = ServerOutcome(role)
    probe_dir = layout.role_dir(role)
    with log.step(f"{role} server: {server.engine} {server.release}, {len(server.nodes)} node(s)"):
        gpu_before = sup.sample("before", role, writer, host=True)
        owned: list[Owned] = []
        with log.step(f"launching {role} server"):
            gate = _ports_checked(server)
            nodes = sorted(server.nodes, key=lambda n: n.node_rank)
            if gate is not None:
                nodes = nodes[1:] + nodes[:1]  # node 0 last: it binds the ports the followers check
            for node in nodes:
                if gate is not None and node.node_rank == 0 and owned:
                    _await_followers(owned, gate, log)
                env = dict(node.env)
                if server.probe:
                    env["CPTEST_PROBE_DIR"] = str(probe_dir)
                    if faults:
                        env.update(probe_env(plan.faults))
                launch = node.model_copy(update={"env": env})
                labels = {"cptest.scenario": plan.scenario, "cptest.role": role,
                          "cptest.run": layout.root.name, **opts.labels}
                owned.append(sup.start(launch, layout.log(role, node.node_rank),
                                       labels, role, writer))
            owned.sort(key=lambda o: o.handle.node.node_rank)
        _wait_ready(sup, server, owned, writer, out, opts, log)
        if out.ready:
            _record_server_info(server, writer, opts)
            sup.sample("running", role, writer)  # the ready tree, even for a workload shorter than a period
            sup.start_sampling(role, writer)
            try:
                # Every server scores on an empty prefix cache (a whole prefill of each sequence),
                # and every workload runs on one: the main server and the control score before
                # their workload (a fault may end the server during it), the baseline after (it
                # scores its own answers); the cache is flushed in between.
                scoring = bool(plan.workload.score_topk)
                if scoring and seqs and server.role != "baseline":
                    _score(sup, plan, server, seqs, writer, log)
                    _flush_cache(server, writer, opts, log)
                out.workload = _drive(sup, plan, server, owned, writer, probe_dir, opts, log, faults=faults)
                if scoring and server.role == "baseline":
                    own = sequences_from(out.workload.results, plan.workload)
                    if own:
                        _flush_cache(server, writer, opts, log)
                        _score(sup, plan, server, own, writer, log)
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


def who_serves(owned: list[Owned], port: int) -> tuple[bool | None, list[int]]:
    """Whose server answers on `port`: (True, pids) when the listener is a process of this run's
    trees, (False, pids) when listeners exist and none is this run's, (None, []) when the launcher
    cannot tell (a container's port is published by the container engine's own process)."""
    seen: list[int] = []
    verdict: bool | None = None
    for o in owned:
        serves = getattr(o.handle, "serves", None)
        if serves is None:
            continue
        mine, pids = serves(port)
        seen = sorted(set(seen) | set(pids))
        if mine:
            return True, seen
        if mine is False:
            verdict = False
    return verdict, seen


def _describe_pids(pids: list[int]) -> str:
    from cptest.run.supervisor import describe_processes

    return ", ".join(f"pid {p['pid']} ({p['title'][:80] or p['name']})" for p in describe_processes(pids)) \
        or ", ".join(f"pid {p}" for p in pids)


FOLLOWERS_CHECKED_S = 120.0
"""How long a co-located node 0 waits for its followers' port check (`_await_followers`) before it
starts anyway; SGLang's followers print it seconds after they start."""


def _ports_checked(server: ServerPlan) -> re.Pattern[str] | None:
    """The engine's line for "this follower has checked its derived ports", for a co-located server
    of several nodes; None otherwise (every node then starts at once, in node order)."""
    if not server.colocated or len(server.nodes) < 2:
        return None
    recipe = colocated_launch(server.engine, server.release)
    line = recipe.follower_ports_checked if recipe is not None else None
    return re.compile(line) if line else None


def _await_followers(followers: list[Owned], line: re.Pattern[str], log: Logger,
                     limit_s: float = FOLLOWERS_CHECKED_S) -> None:
    """Wait until every started follower's log has `line` or the follower has ended (its launch
    then fails and is reported as such), at most `limit_s`. On one host the nodes of an attention-DP
    SGLang server derive the same TCP ports from the rendezvous port; node 0 binds them, and a
    follower that checks them after that gives up (SGLang's `wait_port_available`)."""
    t0 = time.monotonic()
    waiting = list(followers)
    while waiting and time.monotonic() - t0 < limit_s:
        waiting = [o for o in waiting if o.handle.poll() is None and not _log_has(o.handle.log_path, line)]
        if waiting:
            time.sleep(0.2)
    if waiting:
        log.warning(f"node(s) {[o.handle.node.node_rank for o in waiting]} did not print "
                    f"{line.pattern!r} within {limit_s:.0f} s; node 0 starts anyway")


def _log_has(path: Path, line: re.Pattern[str]) -> bool:
    try:
        return line.search(path.read_text(errors="replace")) is not None
    except OSError:
        return False


def _wait_ready(sup: Supervisor, server: ServerPlan, owned: list[Owned], writer: RecordWriter,
                out: ServerOutcome, opts: RunOptions, log: Logger) -> None:
    """Poll `/health_generate` until 200 from *this run's* server: the answer counts only when the
    process listening on the port is one of this run's trees (`who_serves`), so another run's
    server on the same port (one that bound it between preflight and our engine's bind) never makes
    this one ready. A launcher that cannot tell (containers) is taken at its word and
    `ready` says `identity: unverified`."""
    t0 = time.monotonic()
    url = server.base_url.rstrip("/") + "/health_generate"
    port = urlsplit(server.base_url).port or 80
    foreign: list[int] = []
    identity: list[tuple[bool | None, list[int]]] = []

    def ready(last: bool) -> bool:
        for o in owned:
            status = o.handle.poll()
            if status is not None:
                raise Abort(f"node {o.handle.node.node_rank} (pid {o.handle.main_pid()}) exited with "
                            f"status {status} during launch")
        r = httpx.get(url, timeout=opts.http_timeout_s)
        if r.status_code != 200:
            return False
        mine, pids = who_serves(owned, port)
        if mine is False:
            if not foreign:  # once: the answer came from someone else's server
                foreign.extend(pids)
                writer.write(Lifecycle(run=server.role, event="port_foreign", detail={
                    "port": port, "pids": pids, "who": _describe_pids(pids)}))
                log.warning(f"port {port} is answered by {_describe_pids(pids)}, not by this run's "
                            f"server; waiting for ours")
            return False
        identity[:] = [(mine, pids)]
        return True

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
            if foreign:
                e = RunError(f"{e}; port {port} was answered by {_describe_pids(foreign) or foreign}, "
                             f"a process that is not this run's")
            out.launch_failed = {"node": owned[0].handle.node.node_rank, "status": None,
                                 "after_s": round(after, 3), "reason": f"{e}\n{tail}".strip()}
            writer.write(Lifecycle(run=server.role, event="launch_failed", detail=out.launch_failed))
            log.warning(f"{server.role} server not ready within {server.ready_timeout_s} s; "
                        f"see {owned[0].handle.log_path}")
            return
    out.ready, out.ready_after_s = True, round(after, 3)
    mine, pids = identity[0] if identity else (None, [])
    writer.write(Lifecycle(run=server.role, event="ready", detail={
        "after_s": out.ready_after_s, "port": port, "listener_pids": pids,
        "identity": "tree" if mine else "unverified"}))


def _record_server_info(server: ServerPlan, writer: RecordWriter, opts: RunOptions) -> None:
    base = server.base_url.rstrip("/")
    errors = []
    for path in engine_for(server.engine, server.release).server_info_paths:
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
        handles = [o.handle for o in owned]
        # A launcher that delivers signals its own way (Slurm: a step on the node) says how; the
        # node that runs rank 0 may keep its probe files in a folder of its own (named nodes).
        make = getattr(sup.launcher, "fault", None)
        rank0_dir = (getattr(owned[0].handle, "probe_dir", None) if owned else None) or probe_dir
        injector = FaultInjector(plan.faults, handles, writer=writer, role=server.role,
                                 probe_dir=rank0_dir if server.probe else None, log=log,
                                 fault=make(handles, server) if make is not None else None)
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


def _score(sup: Supervisor, plan: Plan, server: ServerPlan, seqs: list[Sequence], writer: RecordWriter,
           log: Logger) -> None:
    """Teacher-forced scoring of the baseline's sequences (`cptest.run.scoring`), after the workload."""
    with log.step(f"{server.role} scoring: {len(seqs)} sequences of the baseline"):
        done = score(server.base_url, seqs, top_k=plan.workload.score_topk, role=server.role, writer=writer,
                     concurrency=plan.workload.concurrency or 8, timeout_s=plan.workload.timeout_s,
                     progress=log.progress(f"{server.role} scoring", len(seqs)))
    ok = sum(s.status == "ok" for s in done)
    writer.write(Lifecycle(run=server.role, event="scoring_done", detail={"sequences": len(seqs), "ok": ok}))
    sup.check()


def _flush_cache(server: ServerPlan, writer: RecordWriter, opts: RunOptions, log: Logger) -> None:
    """Empty the server's prefix cache (SGLang's `/flush_cache`: 200 when done, 400 while
    requests are pending, so it is asked again for a few seconds); the outcome is recorded."""
    url = server.base_url.rstrip("/") + "/flush_cache"
    detail: dict[str, object] = {}
    deadline = time.monotonic() + 10.0
    while True:
        try:
            r = httpx.post(url, timeout=opts.http_timeout_s)
            detail = {"status": r.status_code, "message": r.text.strip()[:200]}
            if r.status_code == 200:
                break
        except httpx.HTTPError as e:
            detail = {"status": None, "message": f"{type(e).__name__}: {e}"}
        if time.monotonic() > deadline:
            log.warning(f"{server.role}: prefix cache not flushed ({detail['message']}); the next phase "
                        f"may reuse cached prompts")
            break
        time.sleep(0.5)
    writer.write(Lifecycle(run=server.role, event="cache_flushed", detail=detail))


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
        # A co-located server is one deployment of several local nodes: like an operator, cptest stops
        # its head (node 0), whose shutdown request reaches every rank; the other nodes follow, or
        # are killed at the timeout. Signalled too, they would die at once under their peers' feet.
        if server.colocated and o.handle.node.node_rank != 0:
            continue
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
