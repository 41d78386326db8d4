"""An archived plan against this cptest's re-plan of its scenario: what `cptest check` refuses as
tampering (`integrity_differences`) and what `cptest rerun` shows before it runs (`plan_changes`).

Both plans are read through `cptest.plan.archive_reader`, which leaves out what the archive's
planner generation decided differently and what legitimately differs between the run and now; what
remains must be equal.
"""

from __future__ import annotations

import json
from typing import Any

from cptest.errors import Problem, Span
from cptest.plan.archive_reader import comparable
from cptest.plan.model import Plan

FAILED = "integrity check failed"


def short(value: Any, width: int = 300) -> str:
    """`value` as JSON, cut to `width` characters for a message."""
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= width else text[: width - 3] + "..."


def integrity_differences(archived: Plan, planned: Plan, plan_file: str, hint: str) -> list[Problem]:
    """What the archived plan says that the re-plan does not, one problem each, placed at
    `plan_file`: the scenario's name, each expectation (kind and parameters), the servers (roles,
    engines, releases, sizes, degrees), what each node executes (argv, environment, image, model
    mount, GPUs, host) and the serve options that are not argv, the faults, the workload and the
    layout contracts."""
    out: list[Problem] = []

    def bad(message: str, expected: Any = None, found: Any = None) -> None:
        out.append(Problem(Span(plan_file, 1, 1), f"{FAILED}: {message}", hint=hint,
                           expected=None if expected is None else short(expected),
                           found=None if found is None else short(found)))

    old, new = comparable(archived, planned)
    if archived.scenario != planned.scenario:
        bad("plan.json names another scenario than scenario.cps", planned.scenario, archived.scenario)
    ours, theirs = old.expectations(), new.expectations()
    if len(ours) != len(theirs):
        bad(f"plan.json holds {len(ours)} expectations, scenario.cps compiles to {len(theirs)}",
            [e["kind"] for e in theirs], [e["kind"] for e in ours])
    else:
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            if keys:
                bad(f"expectation {i + 1} ({b['kind']}) differs from scenario.cps in {', '.join(keys)}",
                    {k: b.get(k) for k in keys}, {k: a.get(k) for k in keys})
    same_servers = old.servers() == new.servers()
    if not same_servers:
        bad("plan.json's servers (roles, engines, sizes, degrees) differ from scenario.cps",
            new.servers(), old.servers())
    faults = [[f.model_dump(mode="json") for f in p.faults] for p in (archived, planned)]
    if faults[0] != faults[1]:
        bad("plan.json's faults differ from scenario.cps", faults[1], faults[0])
    counts = [len(p.workload.requests) for p in (archived, planned)]
    if counts[0] != counts[1]:
        bad(f"plan.json plans {counts[0]} requests, scenario.cps {counts[1]}")
    if same_servers:  # else named above; nodes cannot be paired
        before, after = old.launch(), new.launch()
        for role in before:
            for k, (a, b) in enumerate(zip(before[role]["nodes"], after[role]["nodes"], strict=True)):
                for key in (key for key in a if a[key] != b[key]):
                    bad(f"{role} node {k} {key} differs from what scenario.cps plans", b[key], a[key])
            was, now = before[role]["serve"], after[role]["serve"]
            for key in (key for key in was if was[key] != now[key]):
                bad(f"the {role} server's {key} differs from what scenario.cps plans", now[key], was[key])
    if counts[0] == counts[1]:
        ours_w, theirs_w = old.workload(), new.workload()
        for key in (key for key in ours_w if ours_w[key] != theirs_w[key]):
            bad(f"plan.json's workload {key} differs from what scenario.cps plans",
                theirs_w[key], ours_w[key])
    for key in ("contracts", "model_facts", "deadline_s", "unsafe"):
        a, b = (getattr(p, key) for p in (archived, planned))
        if a != b:
            bad(f"plan.json's {key} differs from what scenario.cps plans",
                None if b is None else b.model_dump(mode="json") if hasattr(b, "model_dump") else b,
                None if a is None else a.model_dump(mode="json") if hasattr(a, "model_dump") else a)
    return out


def plan_changes(archived: Plan, planned: Plan) -> list[Problem]:
    """What the new plan would execute that the archived one did not, one problem per difference
    (`Reading.executed`), plus another scenario name (it decides where the new archive is written).
    The model path is compared as written, unless the archive's planner named it by an absolute
    path: then by the pinned hash alone."""
    out = []
    if archived.scenario != planned.scenario:
        out.append(Problem(None, "plan.json names another scenario than scenario.cps",
                           expected=short(planned.scenario), found=short(archived.scenario)))
    was, now = comparable(archived, planned)
    old, new = was.executed(), now.executed()
    for role in sorted(set(old) | set(new)):
        if role not in new or role not in old:
            where = "archived plan" if role in old else "new plan"
            out.append(Problem(None, f"the {role} server is only in the {where}"))
            continue
        if len(old[role]) != len(new[role]):
            counts = f"{len(old[role])} nodes archived, {len(new[role])} now"
            out.append(Problem(None, f"the {role} server has {counts}"))
            continue
        for k, (a, b) in enumerate(zip(old[role], new[role], strict=True)):
            for key in a:
                if a[key] != b[key]:
                    out.append(Problem(None, f"{role} node {k} {key} differs",
                                       expected=f"now {short(b[key])}", found=f"archived {short(a[key])}"))
    return out
