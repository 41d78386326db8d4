"""shutdown: after the signal every process exits in time, nothing is left, GPU memory comes back.

params: {"within_s": float, "gpu_memory_released": bool, "no_orphans": bool,
         "exit_statuses": list[int] | None, "role": "main"}

Evidence: the role's Lifecycle events (`signal`, `exited` {node, status, after_s_since_signal},
`teardown` {leftover_pids, killed}, `shutdown_done` {after_s, all_exited}), the last ProcessSample
(phase "final", else "after"), and GpuSample "before" vs "after"/"final". Each part is pass, fail or
unknown on its own; the verdict is the worst. GPU slack: 64 MiB per GPU (driver context noise).
"""

from __future__ import annotations

from typing import Any

from cptest.checks.load import Archive
from cptest.checks.verdict import Status, Verdict, combine, unknown
from cptest.plan.model import Expectation

NAME = "shutdown"
GPU_SLACK_MIB = 64


def check(archive: Archive, expect: Expectation) -> Verdict:
    p = expect.params
    role = p.get("role", "main")
    ev = archive.role(role).runner
    server = archive.server(role)
    if ev is None or server is None:
        return unknown(NAME, f"no runner evidence for {role} (evidence/{role}/runner.jsonl missing)")
    parts: list[tuple[str, Status, str]] = []
    figures: dict[str, Any] = {}
    nodes = [n.node_rank for n in server.nodes]
    exited = {int(e.detail.get("node", 0)): e.detail for e in ev.events("exited")}
    figures["exited"] = {str(k): v for k, v in sorted(exited.items())}
    teardown = ev.events("teardown")
    killed = [pid for e in teardown for pid in e.detail.get("killed", [])]
    leftover = [pid for e in teardown for pid in e.detail.get("leftover_pids", [])]
    figures["killed_by_teardown"] = killed

    within = float(p.get("within_s", server.shutdown_timeout_s))
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

    if p.get("no_orphans", True):
        final = [s for s in ev.processes if s.phase == "final"] or [
            s for s in ev.processes if s.phase == "after"
        ]
        if leftover:
            parts.append(("no_orphans", "fail", f"pid(s) {leftover} survived teardown"))
        elif not final:
            parts.append(("no_orphans", "unknown", "no final process sample"))
        elif final[-1].procs:
            procs = final[-1].procs
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

    if p.get("gpu_memory_released", True):
        before = [s for s in ev.gpu if s.phase == "before"]
        after = [s for s in ev.gpu if s.phase in ("after", "final")]
        if not before or not after:
            if archive.plan.main.engine == "reference" and not any(s.used_mib for s in ev.gpu):
                # The CPU reference engine allocates no GPU memory: nothing to return.
                parts.append(("gpu_memory", "pass", "not applicable: the reference engine uses no GPU"))
            else:
                parts.append(("gpu_memory", "unknown", "no GPU memory samples before and after"))
        else:
            b, a = before[0].used_mib, after[-1].used_mib
            grew = {g: a[g] - b.get(g, 0) for g in sorted(a) if a[g] - b.get(g, 0) > GPU_SLACK_MIB}
            figures["gpu_used_mib"] = {"before": b, "after": a}
            if grew:
                g = next(iter(grew))
                parts.append(
                    ("gpu_memory", "fail", f"GPU {g} still holds {grew[g]} MiB more than before launch")
                )
            else:
                parts.append(("gpu_memory", "pass", f"GPU memory back within {GPU_SLACK_MIB} MiB of before"))

    accepted = p.get("exit_statuses")
    if accepted is not None:
        statuses = {n: d.get("status") for n, d in exited.items()}
        figures["exit_statuses"] = {str(k): v for k, v in sorted(statuses.items())}
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
