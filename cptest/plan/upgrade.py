"""Reading older `plan.json` versions: each is upgraded, in memory, to the current Plan's shape.

A schema change bumps `PLAN_VERSION` and adds the function that upgrades the version before it, so
that every archive ever made stays checkable (`cptest check`) and verifiable (the file is never
rewritten). Works on the raw JSON value: it runs before the typed model validates it.
"""

from __future__ import annotations

from typing import Any

from cptest.engines import engine_for

PLAN_VERSION = 3
"""Version 2 typed the expectations (one parameter model per contract); version 3 names a synthetic
prompt by where it lies in its seed's stream instead of storing its token ids."""


def upgrade_v2(data: dict[str, Any]) -> dict[str, Any]:
    """A version 2 plan.json in version 3's shape, which it already has: each of its prompts is
    stored as its ids, one of the two forms a version 3 request's `prompt` takes."""
    return dict(data, plan_version=3)


def upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A version 1 plan.json in version 2's shape: expectations `{checker, params}` become their
    contract's parameters (capacity gains the log patterns of the plan's release table, the ones the
    version 1 checker fell back to for the pinned SGLang release); the always-zero expert-parallel ranks leave
    the geometry; a request's sampling loses its copy of `max_new_tokens`. Pure: the archived file
    is not changed."""
    out = dict(data, plan_version=2)
    main = data.get("main") or {}
    engine = engine_for(str(main.get("engine", "")), str(main.get("release", "")))
    expectations = []
    for e in data.get("expectations") or []:
        params = dict(e.get("params") or {})
        if e.get("checker") == "capacity":
            facts = engine.facts()
            source = f"{engine.name} {facts.release} release table (added when reading a version 1 plan)"
            params["log_patterns"] = {
                "source": source,
                **{k: facts.log_patterns.get(k) for k in ("kv_allocated", "max_total_num_tokens")},
            }
        expectations.append({"kind": e.get("checker"), "expect_violation": e.get("expect_violation", False),
                             "source": e.get("source", ""), **params})
    out["expectations"] = expectations
    workload = data.get("workload")
    if isinstance(workload, dict):
        requests = []
        for r in workload.get("requests") or []:
            sampling = {k: v for k, v in (r.get("sampling") or {}).items() if k != "max_new_tokens"}
            requests.append(dict(r, sampling=sampling))
        out["workload"] = dict(workload, requests=requests)
    for role in ("main", "baseline"):
        server = data.get(role)
        if isinstance(server, dict):
            geometry = [{k: v for k, v in g.items() if k not in ("moe_dp_rank", "moe_ep_rank")}
                        for g in server.get("geometry") or []]
            out[role] = dict(server, geometry=geometry)
    return out
