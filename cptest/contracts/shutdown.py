"""shutdown: after the signal every process exits in time, nothing is left, GPU memory comes back.

    expect { shutdown within 30s gpu_memory_released no_orphans exit_status in (-9, 137) }

Without `exit_status`, the accepted statuses are the engine release's own (`EngineFacts`: SGLang
ends itself with SIGKILL by design, and otherwise after a rank was killed), resolved by the plan.

Evidence: the role's Lifecycle events (`signal`, `exited` {node, status, after_s_since_signal},
`teardown` {leftover_pids, killed}, `shutdown_done` {after_s, all_exited}), the last ProcessSample
(phase "final", else "after"; the runner lists an engine-titled process outside the trees as this
run's, scope `host`, only when it is in one of this run's sessions or carries this run's label, and
as `foreign` otherwise: another run's engines on a shared machine are never this run's orphans),
and the GpuSamples. Where they attribute memory to processes (NVML), GPU
memory is released when no process of this run holds any after shutdown: the judgement is the run's
own, so runs may share GPUs. Otherwise the device total "after"/"final" is compared with "before",
with a slack of 64 MiB per GPU (driver context noise), except for a co-located server: its ranks
share GPUs, so a device total mixes them and the part is unknown (co-located) with the reason. Each
part is pass, fail or unknown on its own; the verdict is the worst.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import model_validator

from cptest.contracts.base import Contract, Declared, Misread, Params, PlanContext, Syntax, Written, invalid
from cptest.evidence import Evidence, RoleEvidence, RunnerEvidence
from cptest.values import describe
from cptest.verdict import Status, Verdict, combine, unknown

NAME = "shutdown"
GPU_SLACK_MIB = 64


class ShutdownExpect(Declared):
    within_s: float = 30.0
    gpu_memory_released: bool = False
    no_orphans: bool = False
    exit_status: list[int] | None = None
    """Accepted exit statuses of the server process; None: the engine's own (see the module)."""

    @model_validator(mode="before")
    @classmethod
    def _within(cls, data: Any) -> Any:
        # The statement says `within 30s`: a duration (anything with `seconds`), never a bare number.
        if not isinstance(data, dict) or "within" not in data:
            return data
        data = dict(data)
        within = data.pop("within")
        seconds = getattr(within, "seconds", None)
        if not isinstance(seconds, int | float) or seconds <= 0:
            hint = "durations need a unit: 30s" if isinstance(within, int | float) else None
            raise invalid("shutdown 'within' needs a duration > 0", found=describe(within), hint=hint)
        data["within_s"] = float(seconds)
        return data


class ShutdownParams(Params):
    kind: Literal["shutdown"] = "shutdown"
    within_s: float = 30.0
    gpu_memory_released: bool = True
    no_orphans: bool = True
    exit_statuses: list[int] | None = None


def resolve(expect: ShutdownExpect, ctx: PlanContext) -> ShutdownParams:
    statuses = expect.exit_status
    if statuses is None:
        known = ctx.facts.rank_kill_exit_statuses if ctx.kills_a_rank else ctx.facts.sigterm_exit_statuses
        statuses = sorted(known) if known is not None else None
    return ShutdownParams(within_s=expect.within_s, gpu_memory_released=expect.gpu_memory_released,
                          no_orphans=expect.no_orphans, exit_statuses=statuses)


def check(evidence: Evidence, p: ShutdownParams) -> Verdict:
    role = p.role
    server = evidence.role(role)
    ev = server.runner
    if ev is None or not server.planned:
        return unknown(NAME, f"no runner evidence for {role} (evidence/{role}/runner.jsonl missing)")
    parts: list[tuple[str, Status, str]] = []
    figures: dict[str, Any] = {}
    nodes = server.nodes
    exited = {int(e.detail.get("node", 0)): e.detail for e in ev.events("exited")}
    figures["exited"] = {str(k): v for k, v in sorted(exited.items())}
    teardown = ev.events("teardown")
    killed = [pid for e in teardown for pid in e.detail.get("killed", [])]
    leftover = [pid for e in teardown for pid in e.detail.get("leftover_pids", [])]
    figures["killed_by_teardown"] = killed

    within = p.within_s
    if not ev.events("signal") and not ev.events("shutdown_begin") and not exited:
        parts.append(("within", "unknown", "no signal, shutdown_begin or exited event recorded"))
    else:
        late = [
            (n, d.get("after_s_since_signal"))
            for n, d in exited.items()
            if d.get("after_s_since_signal") is not None and d["after_s_since_signal"] > within
        ]
        gone = [n for n in nodes if n not in exited]
        if gone:
            parts.append(
                (
                    "within",
                    "fail",
                    f"node {gone[0]} has no exited event"
                    + (f"; teardown had to kill {killed}" if killed else ""),
                )
            )
        elif late:
            parts.append(
                (
                    "within",
                    "fail",
                    f"node {late[0][0]} exited {late[0][1]:.1f} s after the signal (> {within:g} s)",
                )
            )
        elif killed:
            parts.append(("within", "fail", f"teardown had to kill pid(s) {killed}"))
        else:
            slowest = max((d.get("after_s_since_signal") or 0.0 for d in exited.values()), default=0.0)
            figures["slowest_exit_s"] = slowest
            parts.append(
                ("within", "pass", f"every node exited within {within:g} s (slowest {slowest:.1f} s)")
            )

    if p.no_orphans:
        final = [s for s in ev.processes if s.phase == "final"] or [
            s for s in ev.processes if s.phase == "after"
        ]
        if leftover:
            parts.append(("no_orphans", "fail", f"pid(s) {leftover} survived teardown"))
        elif not final:
            parts.append(("no_orphans", "unknown", "no final process sample"))
        elif [p for p in final[-1].procs if p.get("scope") != "foreign"]:
            procs = [p for p in final[-1].procs if p.get("scope") != "foreign"]
            figures["orphans"] = procs
            parts.append(
                (
                    "no_orphans",
                    "fail",
                    f"{len(procs)} process(es) left, first pid {procs[0].get('pid')} "
                    f"({procs[0].get('name', '')})",
                )
            )
        else:
            parts.append(("no_orphans", "pass", "no process of the tree left"))

    if p.gpu_memory_released:
        parts.append(_gpu_memory(server, ev, figures))

    accepted = p.exit_statuses
    if accepted is not None:
        statuses = {n: d.get("status") for n, d in exited.items()}
        figures["exit_statuses"] = {str(k): v for k, v in sorted(statuses.items())}
        if server.placement == "colocated":
            # The declared statuses are the server's, one process tree of a single-node server; a
            # co-located server's other nodes are local stand-ins for its ranks, which end however a
            # follower node ends (their statuses stay in the figures). Its head is the server.
            statuses = {n: s for n, s in statuses.items() if n == 0}
        bad = {n: s for n, s in statuses.items() if s not in accepted}
        if not statuses:
            parts.append(("exit_status", "unknown", "no exit status recorded"))
        elif bad:
            n = next(iter(bad))
            parts.append(
                ("exit_status", "fail", f"node {n} exited with {bad[n]}, accepted {sorted(accepted)}")
            )
        else:
            parts.append(("exit_status", "pass", f"exit statuses {sorted(set(statuses.values()))} accepted"))
    return combine(NAME, parts, **figures)


def _gpu_memory(server: RoleEvidence, ev: RunnerEvidence, figures: dict[str, Any]) -> tuple[str, Status, str]:
    """The gpu_memory part: per process where the samples attribute memory to processes, else from
    the device totals, which a co-located server cannot be judged by."""
    before = [s for s in ev.gpu if s.phase == "before"]
    after = [s for s in ev.gpu if s.phase in ("after", "final")]
    if not before or not after:
        if server.engine == "reference" and not any(s.used_mib for s in ev.gpu):
            # The CPU reference engine allocates no GPU memory: nothing to return.
            return ("gpu_memory", "pass", "not applicable: the reference engine uses no GPU")
        return ("gpu_memory", "unknown", "no GPU memory samples before and after")
    if after[-1].processes is not None:
        return _own_gpu_memory(ev.gpu, after[-1], figures)
    b, a = before[0].used_mib, after[-1].used_mib
    figures["gpu_used_mib"] = {"before": b, "after": a}
    if server.placement == "colocated":
        # A device total mixes every rank on the GPU: it cannot say which rank reclaimed what, and
        # a failure would not say whose memory stayed.
        return ("gpu_memory", "unknown", "co-located: the ranks share GPUs and only device totals were "
                "sampled, which mix them; per-process figures judge it (run where NVML works: nvidia-ml-py)")
    grew = {g: a[g] - b.get(g, 0) for g in sorted(a) if a[g] - b.get(g, 0) > GPU_SLACK_MIB}
    if grew:
        g = next(iter(grew))
        return ("gpu_memory", "fail", f"GPU {g} still holds {grew[g]} MiB more than before launch")
    return ("gpu_memory", "pass", f"GPU memory back within {GPU_SLACK_MIB} MiB of before")


def _own_gpu_memory(samples: list[Any], last: Any, figures: dict[str, Any]) -> tuple[str, Status, str]:
    """The gpu_memory part from per-process figures: after shutdown no process of this run may hold
    GPU memory (other runs sharing the GPUs do not count)."""
    peak: dict[str, int] = {}
    for s in samples:
        for g, mib in (s.ours_mib() or {}).items():
            peak[g] = max(peak.get(g, 0), mib)
    held = [p for p in last.processes if p.ours and p.mib > 0]
    figures["gpu_own_mib"] = {"peak": peak, "after": last.ours_mib()}
    if held:
        p = held[0]
        return ("gpu_memory", "fail", f"pid {p.pid} of this run still holds {p.mib} MiB on GPU {p.gpu} "
                                      f"after shutdown ({len(held)} process(es) in all)")
    where = ", ".join(f"GPU {g} {m} MiB" for g, m in sorted(peak.items()) if m) or "none seen"
    return ("gpu_memory", "pass", f"no process of this run holds GPU memory after shutdown (peak {where})")


# The clauses of a shutdown statement, each read as (name, value).
def _within(c: list[Any]) -> tuple[str, Any]:
    return ("within", c[0])


def _gpu_memory_released(c: list[Any]) -> tuple[str, Any]:
    return ("gpu_memory_released", True)


def _no_orphans(c: list[Any]) -> tuple[str, Any]:
    return ("no_orphans", True)


def _exit_status(c: list[Any]) -> tuple[str, Any]:
    return ("exit_status", tuple(int(t) for t in c))


def _read(c: list[tuple[str, Any]]) -> Written:
    value: dict[str, Any] = {}
    for name, v in c:
        if name in value:
            raise Misread(f"'{name}' given twice in one shutdown expectation")
        value[name] = v
    return Written(NAME, value)


def _write(key: str, v: Mapping[str, Any], show: Callable[[Any], str]) -> str:
    parts = ["shutdown"]
    if "within" in v:
        parts.append(f"within {show(v['within'])}")
    if v.get("gpu_memory_released"):
        parts.append("gpu_memory_released")
    if v.get("no_orphans"):
        parts.append("no_orphans")
    if "exit_status" in v:
        parts.append(f"exit_status in ({', '.join(str(x) for x in v['exit_status'])})")
    return " ".join(parts)


CLAUSES = {"within": _within, "gpu_memory_released": _gpu_memory_released, "no_orphans": _no_orphans,
           "exit_status": _exit_status}
"""The clause rules (`shutdown_opt` in cps.lark) -> their readers."""

SYNTAX = Syntax("shutdown", {"shutdown": _read, **CLAUSES}, _write)

CONTRACT = Contract(NAME, 70, ShutdownExpect, ShutdownParams, resolve, check, SYNTAX, absence_based=True,
                    dumped_when_absent=True,
                    examples=("shutdown within 30s gpu_memory_released no_orphans",))
