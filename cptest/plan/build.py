"""Scenario -> Plan: pure, deterministic, JSON-serialisable.

`plan(scenario)` decides everything a run needs before any process starts: per node the argv,
GPU ids, environment and port; the baseline server; the workload as concrete token ids; the fault
schedule with the process title of each targeted rank; the expectations with every figure resolved;
the derived layout contracts; the pins. No clock, no network, no processes, no shell strings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from cptest import __version__
from cptest.engines.sglang.argv import ServeConfig, build_argv
from cptest.engines.sglang.releases import Release, get_release
from cptest.errors import PlanError, Problem, ProblemCollector, Span
from cptest.plan.model import (
    Expectation,
    FaultPlan,
    NodeLaunch,
    Pins,
    Plan,
    ServerPlan,
    WorkloadPlan,
)
from cptest.plan.workload import Dist, build_workload, load_dataset
from cptest.probe.forward_hooks import spec as probe_hooks_spec
from cptest.scenario import Dist as DistNode
from cptest.scenario import ExpectEntry, Scenario, Topology
from cptest.topology import (
    expected_capacity_multiplier,
    group_problems,
    kv_replicated_in_dcp_group,
    titled_geometry,
)

ENGINE_ENV = {
    # NVLink multicast must stay off on the shared GPU hosts (device README); harmless elsewhere.
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
}
"""Environment every engine process gets, before the scenario's own `serve { env ... }`."""

SYNTHETIC_FIELDS = (
    "architecture", "layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "intermediate", "seed",
    "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
)  # fmt: skip
"""What cptest.run.models needs to write the same synthetic weights again on any machine."""
MAIN_PORT = 30000
BASELINE_PORT = 30100
NEEDS_EAGER = {"rows"}
"""Checkers whose evidence is per-step records, which Python hooks only write on eager forwards
(hooks do not fire on CUDA-graph replay, sglang-cp.md §7)."""


def canonical_sha256(scenario: Scenario) -> str:
    """Hash of the scenario's value (not its text): reformatting a file does not change it, and
    neither does where the checkout lives (paths the parser resolved are hashed relative to the
    scenario file's folder)."""
    base = os.path.dirname(os.path.abspath(scenario.source_file))

    def portable(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: portable(x) for k, x in v.items()}
        if isinstance(v, list):
            return [portable(x) for x in v]
        if isinstance(v, str) and os.path.isabs(v):
            return os.path.relpath(v, base)
        return v

    text = json.dumps(portable(scenario.model_dump(mode="json")), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def plan(scenario: Scenario, *, model_cache: Path = Path(".cptest/models")) -> Plan:
    """The plan of `scenario`. Raises PlanError naming the scenario position of each problem.

    `model_cache` is where synthetic weights will be written at run time (an argument, so that
    the plan stays a function of its inputs only).
    """
    problems = ProblemCollector()
    release = _release(scenario, problems)
    eager_reason = _needs_eager(scenario)
    eager = eager_reason is not None
    main = _server(scenario, scenario.topology, "main", MAIN_PORT, release, eager, problems, model_cache)
    baseline = None
    base_topo = scenario.baseline_topology()
    if scenario.baseline is not None:
        if base_topo is None:
            problems.add(scenario.baseline.span, "the baseline topology is impossible")
        else:
            baseline = _server(
                scenario, base_topo, "baseline", BASELINE_PORT, release, eager, problems, model_cache
            )
    workload = _workload(scenario, problems)
    faults = _faults(scenario, main, problems)
    problems.raise_if_any(PlanError)
    assert main is not None and workload is not None
    return Plan(
        scenario=scenario.name,
        description=scenario.description or "",
        main=main,
        baseline=baseline,
        workload=workload,
        faults=faults,
        expectations=_expectations(scenario, release),
        pins=_pins(scenario, release),
        model_facts=scenario.model.facts.model_dump(),
        contracts=_contracts(scenario, release) | {"eager": eager_reason},
    )


# ------------------------------------------------------------------------------------ pieces
def _release(scenario: Scenario, problems: ProblemCollector) -> Release | None:
    if scenario.engine.kind != "sglang":
        return None
    try:
        return get_release(scenario.engine.release)
    except PlanError as e:
        for p in e.problems:
            problems.add(scenario.engine.where("release"), p.message, hint=p.hint)
        return None


def _needs_eager(scenario: Scenario) -> str | None:
    """Why the servers must run eager, or None. Per-step records (rows) are only written on eager
    forwards: hooks do not fire on CUDA-graph replay (sglang-cp.md §7). The semantic pass already
    rejects a scenario that also expects decode graphs to be captured; a declared graph mode in
    `serve` is overridden, and the plan says so in `contracts["eager"]`."""
    needs = sorted({name for name, _ in scenario.expect.entries()} & NEEDS_EAGER)
    if not needs:
        return None
    return f"{', '.join(needs)} evidence needs per-step records: every CUDA-graph phase disabled"


def _geometry(topo: Topology) -> list[dict[str, Any]]:
    # Scenarios that expect SGLang to reject the launch may declare layouts that cannot be
    # built (tp 2 dcp 3); the plan then carries no geometry and the launch checker decides.
    return [g.model_dump(mode="json") for g in titled_geometry(topo.as_degrees())]


def _server(
    scenario: Scenario,
    topo: Topology,
    role: str,
    port: int,
    release: Release | None,
    eager: bool,
    problems: ProblemCollector,
    model_cache: Path,
) -> ServerPlan | None:
    serve = scenario.serve
    model_path = _model_path(scenario, model_cache)
    declared = {"decode": serve.cuda_graph_decode, "prefill": serve.cuda_graph_prefill}
    graphs = {phase: mode for phase, mode in declared.items() if mode is not None}
    cfg = ServeConfig(
        model_path=model_path,
        host="127.0.0.1",
        port=port,
        degrees=topo.as_degrees(),
        attention_backend=serve.attention_backend,
        cuda_graph=graphs,
        # Per-step evidence needs every phase eager: prefill graphs would hide extend steps too.
        eager=eager,
        page_size=serve.page_size,
        max_total_tokens=serve.max_total_tokens,
        mem_fraction_static=serve.mem_fraction,
        context_length=serve.context_length,
        sampling_backend=serve.sampling_backend,
        skip_tokenizer_init=serve.skip_tokenizer_init,
        # Rows entering attention, the MLP and the logits are read by forward hooks on modules
        # (the plugin's method hooks cannot see module inputs); see cptest/probe/forward_hooks.py.
        forward_hooks=tuple(json.loads(probe_hooks_spec())),
        extra=tuple((f[0], f[1] if len(f) > 1 else None) for f in serve.extra_flags),
    )
    geometry = _geometry(topo)
    title_prefix = ServerPlan.model_fields["process_title_prefix"].default
    if release is None:
        if scenario.engine.kind == "sglang":
            return None
        from cptest.reference import plan as reference_plan

        argv = reference_plan.argv(topo, serve, model_path, port)
        geometry = reference_plan.geometry(geometry)
        title_prefix = reference_plan.TITLE_PREFIX
    else:
        if topo.nodes > 1:
            cfg = dataclasses.replace(cfg, dist_init_addr=f"127.0.0.1:{port + 50}")
        try:
            argv = build_argv(release, cfg)
        except PlanError as e:
            for p in e.problems:
                problems.add(p.span or serve.span or scenario.span, p.message, hint=p.hint,
                             expected=p.expected, found=p.found)
            return None
    env = dict(ENGINE_ENV, **serve.env)
    world = topo.tp * topo.pp
    per_node = max(world // max(topo.nodes, 1), 1)
    nodes = []
    for n in range(topo.nodes):
        node_argv = list(argv)
        if topo.nodes > 1 and release is not None:
            # Every node runs the same server with its own rank; node 0 hosts the rendezvous.
            node_cfg = dataclasses.replace(cfg, node_rank=n, dist_init_addr=f"127.0.0.1:{port + 50}")
            node_argv = build_argv(release, node_cfg)
        nodes.append(
            NodeLaunch(
                node_rank=n, gpu_ids=list(range(per_node)), env=env, argv=node_argv, port=port,
                image=scenario.engine.image, model_mount=model_path,
            )
        )
    return ServerPlan(
        role=role,  # type: ignore[arg-type]
        engine=scenario.engine.kind,
        release=scenario.engine.release,
        nodes=nodes,
        base_url=f"http://127.0.0.1:{port}",
        world_size=world,
        topology=topo.model_dump(),
        geometry=geometry,
        probe=True,
        eager=eager,
        process_title_prefix=title_prefix,
    )


def _model_path(scenario: Scenario, model_cache: Path) -> str:
    m = scenario.model
    if m.kind == "local":
        return str(m.path)
    if m.kind == "hub":
        return str(m.id)
    # Synthetic weights are written at run time into a cache keyed by their geometry and seed.
    key = hashlib.sha256(m.model_dump_json().encode()).hexdigest()[:16]
    return str(model_cache / f"{m.architecture}-{key}")


def _dist(d: DistNode) -> Dist:
    if d.kind == "fixed":
        return Dist("fixed", (int(d.n or 0),))
    if d.kind == "uniform":
        return Dist("uniform", (int(d.lo or 0), int(d.hi or 0)))
    return Dist("choice", tuple(d.choices or ()))


def _workload(scenario: Scenario, problems: ProblemCollector) -> WorkloadPlan | None:
    w = scenario.workload
    s = w.sampling
    sampling: dict[str, Any] = {"temperature": 0.0} if s.mode == "greedy" else {
        k: v for k, v in {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k,
                          "sampling_seed": s.seed}.items() if v is not None
    }  # fmt: skip
    sampling["ignore_eos"] = w.ignore_eos
    dataset = None
    if w.source == "dataset" and w.dataset_path:
        try:
            # The parser resolved the path against the scenario file; reading it is the one input
            # the plan takes from disk besides the scenario, and its content is hashed into the plan.
            dataset = load_dataset(Path(w.dataset_path))
        except PlanError as e:
            for p in e.problems:
                problems.add(w.where("dataset_path"), p.message)
            return None
    return build_workload(
        requests=w.requests, seed=w.seed, prompt_tokens=_dist(w.prompt_tokens),
        output_tokens=_dist(w.output_tokens), sampling=sampling, vocab=scenario.model.facts.vocab,
        concurrency=w.concurrency, rate=w.rate, timeout_s=w.timeout_s, logprobs=w.logprobs,
        dataset=dataset,
    )  # fmt: skip


def _faults(scenario: Scenario, main: ServerPlan | None, problems: ProblemCollector) -> list[FaultPlan]:
    out = []
    for i, f in enumerate(scenario.faults):
        title = None
        if f.target == "rank" and f.rank is not None and main is not None:
            if f.rank >= main.world_size:
                problems.add(f.where("rank"), f"rank {f.rank} does not exist (world size {main.world_size})",
                             expected=f"a rank in 0..{main.world_size - 1}")
                continue
            if main.geometry:
                title = main.geometry[f.rank]["process_title"]
        out.append(
            FaultPlan(
                index=i, action=f.action, target=f.target, rank=f.rank, process_title=title,
                at_s=f.at_s, after_requests=f.after_requests, after_decode_steps=f.after_decode_steps,
                heal_after_s=f.heal_after_s,
            )
        )
    return out


def _source(entry: ExpectEntry) -> str:
    return str(entry.span) if isinstance(entry.span, Span) else ""


def _expectations(scenario: Scenario, release: Release | None) -> list[Expectation]:
    topo = scenario.topology
    out: list[Expectation] = []
    for name, e in scenario.expect.entries():
        params: dict[str, Any]
        if name == "launch":
            params = {"accepted": e.accepted, "match": e.matching}
        elif name == "rows":
            mode = {"kv_owner": "dcp_owner", "split": "pcp_split", "replicated": "replicated"}[e.mode]
            params = {"mode": mode, "dcp": e.modulus or topo.dcp, "cp": topo.attn_cp,
                      "strategy": e.strategy or topo.cp_strategy, "ffn": e.ffn}
        elif name == "capacity":
            params = {"multiplier": e.multiplier, "tolerance": e.tolerance}
        elif name == "generation":
            params = {"tokens_agree": e.tokens_agree, "logprob_within": e.logprob_within}
        elif name == "graph":
            params = {"phase": e.phase, "state": e.mode}
        elif name == "serving":
            total = scenario.workload.requests
            params = {"completed_min": total if e.all_complete else (e.completed or 0), "of": e.of or total}
        elif name == "shutdown":
            statuses = e.exit_status
            if statuses is None and release is not None:
                killed = any(f.action == "kill" for f in scenario.faults)
                accepted = release.rank_kill_exit_statuses if killed else release.sigterm_exit_statuses
                statuses = sorted(accepted)
            params = {"within_s": e.within_s, "gpu_memory_released": e.gpu_memory_released,
                      "no_orphans": e.no_orphans, "exit_statuses": statuses}
        elif name == "log":
            params = {"pattern": e.pattern, "present": e.mode == "contains"}
        else:  # pragma: no cover - Expect.entries() names only the checkers above
            raise PlanError(Problem(e.span, f"no checker for expectation {name!r}"))
        out.append(Expectation(checker=name, params=params, expect_violation=e.violated, source=_source(e)))
    return out


def _contracts(scenario: Scenario, release: Release | None) -> dict[str, Any]:
    topo, facts = scenario.topology, scenario.model.facts
    spec = topo.as_degrees()
    if group_problems(spec):
        return {"layout": "impossible"}
    rule = release.kv_heads_rule if release is not None else "attn_tp"
    return {
        "capacity_multiplier": expected_capacity_multiplier(spec, facts.kv_heads, facts.is_mla, rule),
        "kv_owner": f"position % {topo.dcp}" if topo.dcp > 1 else None,
        "kv_replicated_in_dcp_group": facts.is_mla or kv_replicated_in_dcp_group(spec.attn_tp, topo.dcp,
                                                                                  facts.kv_heads),
        "pcp_split": topo.cp_strategy if topo.prefill_cp and topo.attn_cp > 1 else None,
        "min_prompt_for_split": 2 * topo.attn_cp if topo.cp_strategy == "zigzag" else topo.attn_cp,
    }


def _pins(scenario: Scenario, release: Release | None) -> Pins:
    m = scenario.model
    model: dict[str, Any] = {"kind": m.kind, "path": m.path, "id": m.id, "revision": m.revision,
                             "sha256": m.sha256, "architecture": m.facts.architecture}
    if m.kind == "synthetic":
        # Everything cptest.run.models needs to write the same weights again on any machine.
        model["synthetic"] = {k: getattr(m, k) for k in SYNTHETIC_FIELDS}
    return Pins(
        engine=scenario.engine.kind,
        release=scenario.engine.release,
        image=scenario.engine.image,
        image_digest=None,
        model=model,
        cptest_version=__version__,
        scenario_sha256=canonical_sha256(scenario),
    )
