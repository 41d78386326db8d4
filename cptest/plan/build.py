"""Scenario -> Plan: pure, deterministic, JSON-serialisable.

`plan(scenario)` decides everything a run needs before any process starts: per node the argv,
GPU ids, environment and port; the baseline server; the workload as concrete token ids; the fault
schedule with the process title of each targeted rank; the expectations with every figure resolved;
the derived layout contracts; the pins. No clock, no network, no processes, no shell strings.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from cptest import __version__
from cptest.contracts import CONTRACTS, EngineFacts, PlanContext, resolve
from cptest.contracts.generation import GenerationParams
from cptest.contracts.graph_parity import GraphParityParams
from cptest.engines import Engine, ServerLaunch, engine_for
from cptest.engines.protocol import MAX_COLOCATED_RANKS, node_port
from cptest.errors import PlanError, Problem, ProblemCollector
from cptest.lang import safety
from cptest.lang.model_ids import hub_store_name
from cptest.lang.safety import MACHINE_ENV
from cptest.lang.tables import DEFAULT_DEADLINE_S, MAX_PLAN_TOKENS
from cptest.paths import MODELS, SCENARIO
from cptest.plan import fill_drain
from cptest.plan.flags import flag_problems
from cptest.plan.model import (
    Colocation,
    FaultPlan,
    LayoutContracts,
    ModelPin,
    NodeLaunch,
    Pins,
    Placement,
    Plan,
    SamplingParams,
    ServerPlan,
    UnsafeDeclaration,
    WorkloadPlan,
)
from cptest.plan.workload import Dist, build_workload, load_dataset
from cptest.probe.forward_hooks import spec as probe_hooks_spec
from cptest.scenario import Dist as DistNode
from cptest.scenario import FaultSpec, Scenario, Topology
from cptest.topology import (
    Degrees,
    expected_capacity_multiplier,
    group_problems,
    kv_replicated_in_dcp_group,
    titled_geometry,
)

ENGINE_ENV = {
    # NVLink multicast must stay off on the shared GPU hosts (the GPU machine's rules); harmless elsewhere.
    **MACHINE_ENV,
    "PYTHONUNBUFFERED": "1",
}
"""Environment every engine process gets. The scenario's own `serve { env ... }` may not change it
(`cptest.lang.safety`), and is applied before it, so that nothing of the scenario can."""


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


def plan(scenario: Scenario, *, placement: Placement | None = None) -> Plan:
    """The plan of `scenario`. Raises PlanError naming the scenario position of each problem.

    `placement` is the ports, GPUs and CPUs the servers get on this machine (default:
    `Placement()`, what a lone run uses). The plan names no directory of this machine: the model is
    `<models>/NAME` in the model store or `<scenario>/PATH` next to the scenario (`cptest.paths`),
    materialised by the run.
    """
    place = placement or Placement()
    problems = ProblemCollector()
    try:
        engine = engine_for(scenario.engine.kind, scenario.engine.release)
    except PlanError as e:
        for p in e.problems:
            problems.add(scenario.engine.where("release"), p.message, hint=p.hint)
        problems.raise_if_any(PlanError)
        raise
    eager_reason = _needs_eager(scenario)
    unsafe = _unsafe(scenario, problems)
    # Bad flags first, at the value they are about; the servers' argv would repeat each at the
    # statement.
    flagged = flag_problems(scenario)
    for p in flagged:
        problems.add(p.span, p.message)
    if flagged:
        problems.raise_if_any(PlanError)
    main = _server(scenario, engine, scenario.topology, "main", place, eager_reason, problems)
    baseline = None
    if scenario.baseline is not None:
        base_topo = scenario.baseline_topology()
        if base_topo is None:
            problems.add(scenario.baseline.span, "the baseline topology is impossible")
        else:
            baseline = _server(scenario, engine, base_topo, "baseline", place, eager_reason, problems)
    workload = _workload(scenario, problems)
    faults = _faults(scenario, main, problems)
    facts = engine.facts()
    if workload is not None and scenario.workload.fill_drain is not None:
        workload = fill_drain.sized(scenario, facts, workload, problems)
    admission = engine.admission(scenario)
    expectations = _expectations(scenario, engine.name, facts,
                                 admission.split_unobserved if admission is not None else None,
                                 cp_v1=admission is not None and admission.cp_v1)
    control = None
    gen = next((e for e in expectations if isinstance(e, GenerationParams)), None)
    parity = next((e for e in expectations if isinstance(e, GraphParityParams)), None)
    compared = [e for e in (gen, parity) if e is not None]  # both score the baseline's sequences
    if compared and workload is not None:
        top = max(e.free_running_topk or 0 for e in compared)
        workload = workload.model_copy(update={"top_logprobs": top,
                                               "score_topk": max(e.score_topk() for e in compared)})
        if any(e.needs_control() for e in compared) and baseline is not None:
            control = _server(scenario, engine, control_topology(baseline.topology, scenario.topology),
                              "control", place, eager_reason, problems)
    eager = None
    if parity is not None:
        eager = _eager_twin(scenario, engine, place, eager_reason, parity, baseline, problems)
    problems.raise_if_any(PlanError)
    assert main is not None and workload is not None
    return Plan(
        scenario=scenario.name,
        description=scenario.description or "",
        main=main,
        baseline=baseline,
        control=control,
        eager=eager,
        workload=workload,
        faults=faults,
        expectations=expectations,
        pins=_pins(scenario),
        model_facts=scenario.model.facts,
        contracts=_contracts(scenario, facts, eager_reason),
        deadline_s=scenario.deadline_s or DEFAULT_DEADLINE_S,
        unsafe=unsafe,
        admission=admission,
    )


def require_allowed(planned: Plan, allow_unsafe: bool) -> None:
    """Raise `PlanError` (exit 2) when `planned` declares `unsafe` and the user did not pass
    `--allow-unsafe`: a scenario that loads its own code into the engine runs only when asked."""
    u = planned.unsafe
    if u is None or allow_unsafe:
        return
    raise PlanError(Problem(None, f"{u.source}: the scenario is declared unsafe ({u.reason}): it sets "
                            f"{', '.join(u.covers)}",
                            hint="read it, then run with --allow-unsafe if you trust it"))


def require_allowed_files(files: list[Path], allow_unsafe: bool) -> None:
    """`require_allowed` for the scenario files of a suite, before anything is planned or launched:
    every file that declares `unsafe` is reported at its declaration. Files that do not parse are
    left to the suite, which reports them as bad input."""
    from cptest.errors import ScenarioError
    from cptest.lang import parse_file

    if allow_unsafe:
        return
    problems = ProblemCollector()
    for f in files:
        try:
            scenario = parse_file(f)
        except ScenarioError:
            continue
        if scenario.unsafe is not None:
            problems.add(scenario.where("unsafe"), f"the scenario is declared unsafe ({scenario.unsafe})",
                         hint="read it, then run with --allow-unsafe if you trust it")
    problems.raise_if_any(PlanError)


def _unsafe(scenario: Scenario, problems: ProblemCollector) -> UnsafeDeclaration | None:
    """What the scenario's `unsafe` declaration covers. The language stage refuses an unsafe entry
    without one; a Scenario built in code is held to the same table here."""
    policy = safety.policy_for(scenario.engine.kind, scenario.engine.release)
    serve = scenario.serve
    covers: list[str] = []
    for i, f in enumerate(serve.extra_flags):
        verdict = safety.flag_verdict(policy, f[0])
        if verdict is not None:
            covers.append(f"flag {f[0]}")
            if scenario.unsafe is None:
                problems.add(serve.where(f"flag:{i}"), f"unsafe: {verdict.reason}")
    for name, value in serve.env.items():
        verdict = safety.env_verdict(policy, name, value)
        if verdict is not None:
            covers.append(f"env {name}")
            if scenario.unsafe is None or not verdict.escapable:
                label = "unsafe" if verdict.escapable else "not allowed"
                problems.add(serve.where(f"env:{name}"), f"{label}: {verdict.reason}")
    if scenario.unsafe is None:
        return None
    where = scenario.where("unsafe")
    base = os.path.dirname(os.path.abspath(scenario.source_file))
    source = (f"{os.path.relpath(os.path.abspath(where.file), base)}:{where.line}:{where.col}"
              if where is not None else scenario.name)
    return UnsafeDeclaration(reason=scenario.unsafe, source=source, covers=covers)


# ------------------------------------------------------------------------------------ pieces
def control_topology(baseline: Degrees, main: Topology) -> Topology:
    """The noise-floor control's topology: the baseline at another TP degree (TP1 when the baseline
    is TP > 1, else TP2), nothing else parallel. Numerically different (the partial sums of a
    sharded matmul are reduced in another order) and known to be equivalent: how far two such
    servers disagree is the floor a layout under test is measured against (docs/language.md
    "Generation parity")."""
    tp = 1 if baseline.tp > 1 else 2
    return Topology(gpus=tp, nodes=1, tp=tp, pp=1, span=main.span)


def _eager_twin(scenario: Scenario, engine: Engine, place: Placement, eager_reason: str | None,
                parity: GraphParityParams, baseline: ServerPlan | None,
                problems: ProblemCollector) -> ServerPlan | None:
    """`graph parity vs eager`'s twin: the main topology and serve options with every CUDA-graph
    phase disabled (docs/language.md "Graph parity"). Refused at the statement when the comparison could not
    be graph against eager (the main server would run eager decode too), or when a bound has no
    baseline sequences to score."""
    stmt = scenario.expect.graph_parity
    where = stmt.span if stmt is not None and stmt.span else scenario.span
    serve = scenario.serve
    mode = serve.cuda_graph_decode
    at = serve.where("cuda_graph_decode")
    set_at = f" ({at.file}:{at.line}:{at.col})" if mode is not None and at is not None else ""
    if eager_reason is not None:
        problems.add(where, f"graph parity vs eager needs the main server to run decode CUDA graphs, but "
                     f"{eager_reason}", hint="put graph parity in a scenario of its own, without the "
                     "expectations that need per-step records")
    elif mode in (None, "disabled"):
        said = "disabled" + set_at if mode else "not declared"
        problems.add(where, f"graph parity vs eager compares a main server running decode CUDA graphs "
                     f"with its eager twin, but the main server's cuda_graph_decode is {said}: both would "
                     f"run eager", expected="serve { cuda_graph_decode full } (or breakable)")
    if parity.bounds and baseline is None:
        problems.add(where, "graph parity's logprob and topk bounds score the baseline's sequences on "
                     "main and on its eager twin, and the scenario has no baseline",
                     hint="declare a baseline (baseline { tp 2 }), or keep only free_running topk K")
    return _server(scenario, engine, scenario.topology, "eager", place,
                   "graph parity's eager twin: every CUDA-graph phase disabled", problems)


def _needs_eager(scenario: Scenario) -> str | None:
    """Why the servers must run eager, or None. Per-step records are only written on eager forwards:
    hooks do not fire on CUDA-graph replay (docs/sglang.md §7). The parser already rejects a
    scenario that also expects decode graphs to be captured; a declared graph mode in `serve` is
    overridden, and the plan says so in `contracts.eager`."""
    needs = sorted({name for name, _ in scenario.expect.entries() if CONTRACTS[name].needs_eager})
    if not needs:
        return None
    return f"{', '.join(needs)} evidence needs per-step records: every CUDA-graph phase disabled"


def _server(
    scenario: Scenario,
    engine: Engine,
    topo: Topology,
    role: str,
    place: Placement,
    eager_reason: str | None,
    problems: ProblemCollector,
) -> ServerPlan | None:
    serve = scenario.serve
    degrees = topo.as_degrees()
    port = place.main_port if role == "main" else place.baseline_port
    for why in engine.unexpressible(degrees):
        problems.add(topo.span or scenario.span, f"{role}: {why}")
    model_path = model_location(scenario)
    colocation = None
    # Co-located: every rank its own local node process (one rank needs no co-location).
    launched = degrees
    if place.mode == "colocated" and degrees.world_size > 1:
        if degrees.world_size > MAX_COLOCATED_RANKS:
            problems.add(topo.span or scenario.span,
                         f"{role}: {degrees.world_size} ranks cannot be co-located",
                         expected=f"at most {MAX_COLOCATED_RANKS} ranks, or --placement physical")
            return None
        launched = degrees.model_copy(update={"nodes": degrees.world_size})
        colocation = _colocation(serve, engine, degrees.world_size, place)
    launch = ServerLaunch(
        model_path=model_path, degrees=launched, serve=serve, port=port, eager=eager_reason is not None,
        # Rows entering attention, the MLP and the logits are read by forward hooks on modules
        # (the plugin's method hooks cannot see module inputs); see cptest/probe/forward_hooks.py.
        forward_hooks=tuple(json.loads(probe_hooks_spec())),
        colocated=colocation is not None,
        mem_fraction=colocation.mem_fraction if colocation else None,
        extra_flags=tuple(colocation.flags) if colocation else (),
    )  # fmt: skip
    per_node = max(degrees.world_size // max(degrees.nodes, 1), 1)
    gpu_ids = list(range(per_node))
    if place.gpus is not None and colocation is None:
        if len(place.gpus) < per_node:
            problems.add(topo.span or scenario.span,
                         f"{role}: needs {per_node} GPU(s) per node, the placement gives {place.gpus}")
            return None
        gpu_ids = list(place.gpus[:per_node])
    nodes = []
    for n in range(launched.nodes):
        try:
            argv = engine.argv(launch, n, launched.nodes)
        except PlanError as e:
            for p in e.problems:
                problems.add(p.span or _flag_span(serve, p.message) or serve.span or scenario.span,
                             p.message, hint=p.hint, expected=p.expected, found=p.found)
            return None
        # The placement's variables come after the scenario's (which may not name them anyway,
        # `cptest.lang.safety.PLACEMENT_ENV`) and before what every engine process must have.
        env = ({**serve.env, **colocation.env, **colocation.node_env[n], **ENGINE_ENV} if colocation
               else {**serve.env, **ENGINE_ENV})
        nodes.append(NodeLaunch(node_rank=n, gpu_ids=[colocation.rank_gpus[n]] if colocation else gpu_ids,
                                env=env, argv=argv, port=node_port(port, n, colocation is not None),
                                image=scenario.engine.image, model_mount=model_path, cpus=place.cpus))
    return ServerPlan(
        role=role,  # type: ignore[arg-type]
        engine=scenario.engine.kind,
        release=scenario.engine.release,
        nodes=nodes,
        base_url=f"http://127.0.0.1:{port}",
        world_size=degrees.world_size,
        topology=degrees,
        # A layout that cannot be built (a scenario about a rejected launch) has no geometry. Ranks
        # of a co-located server sit on their own nodes (`RankGeometry.node` is the world rank).
        geometry=titled_geometry(launched, engine.title_prefix),
        probe=True,
        eager=eager_reason is not None,
        process_title_prefix=engine.title_prefix,
        colocation=colocation,
    )


EXPLICIT_MEM_FRACTION = "stated explicitly (--rank-mem-fraction)"
"""`Colocation.mem_fraction_basis` of a fraction the user gave: a rerun gives it again."""
DEFAULT_MEM_FRACTION = 0.9
"""About what SGLang picks for --mem-fraction-static by itself on an 80+ GB GPU: what a co-located
server's ranks divide, and what a suite reserves, when the scenario leaves `mem_fraction` to it."""


def rank_gpus(world: int, gpus: list[int] | None) -> list[int]:
    """World rank -> physical GPU of a co-located server: contiguous blocks of ranks over `gpus`
    (all on GPU 0 when None); with more GPUs than ranks, one rank per GPU."""
    ids = gpus or [0]
    k = min(len(ids), world)
    return [ids[r * k // world] for r in range(world)]


def _colocation(serve: Any, engine: Engine, world: int, place: Placement) -> Colocation:
    """What co-locating `world` ranks adds: the rank->GPU map, the engine's environment and flags,
    and each rank's memory fraction (`Placement.rank_mem_fraction`, else the scenario's divided by
    the ranks that share a GPU)."""
    recipe = engine.colocated()
    gpus = rank_gpus(world, place.gpus)
    sharing = max(Counter(gpus).values())
    fraction, basis = None, "the engine takes no memory fraction"
    if recipe.takes_mem_fraction:
        if place.rank_mem_fraction is not None:
            fraction, basis = place.rank_mem_fraction, EXPLICIT_MEM_FRACTION
        else:
            declared = serve.mem_fraction
            whole = declared if declared is not None else DEFAULT_MEM_FRACTION
            fraction = round(whole / sharing, 6)
            said = (f"mem_fraction {whole:g}" if declared is not None
                    else f"no mem_fraction (taken as {whole:g})")
            basis = f"the scenario's {said} / {sharing} rank(s) per GPU"
    node_env = [{recipe.host_id_var: f"cptest-node{n}"} if recipe.host_id_var else {} for n in range(world)]
    return Colocation(rank_gpus=gpus, ranks_per_gpu=sharing, transport=recipe.transport, env=dict(recipe.env),
                      node_env=node_env, flags=list(recipe.flags), mem_fraction=fraction,
                      mem_fraction_basis=basis)


def _flag_span(serve: Any, message: str) -> Any:
    """The `flag` statement a problem of the engine's argv names (`--x: takes one value`), if any."""
    for i, f in enumerate(serve.extra_flags):
        if message.startswith(f"{f[0]}:") or f" {f[0]} " in f" {message} ":
            return serve.field_spans.get(f"flag:{i}")
    return None


def model_location(scenario: Scenario) -> str:
    """Where the plan's servers find the model, in `cptest.paths` tokens: a synthetic checkpoint in
    the model store under a name keyed by its geometry and seed (`SyntheticGeometry.store_name`), a
    local one relative to the scenario's folder, a hub model as its snapshot in the model store."""
    m = scenario.model
    if m.kind == "local":
        base = os.path.dirname(os.path.abspath(scenario.source_file))
        rel = os.path.relpath(os.path.abspath(str(m.path)), base)
        return f"{SCENARIO}/{rel}" if rel != "." else SCENARIO
    if m.kind == "hub":
        # A snapshot in the store, never the id: SGLang would download it, or read the id as a path.
        return f"{MODELS}/{hub_store_name(str(m.id), str(m.revision))}"
    geometry = m.synthetic_geometry()
    assert geometry is not None
    return f"{MODELS}/{geometry.store_name()}"


def _dist(d: DistNode) -> Dist:
    if d.kind == "fixed":
        return Dist("fixed", (int(d.n or 0),))
    if d.kind == "uniform":
        return Dist("uniform", (int(d.lo or 0), int(d.hi or 0)))
    return Dist("choice", tuple(d.choices or ()))


def _workload(scenario: Scenario, problems: ProblemCollector) -> WorkloadPlan | None:
    w = scenario.workload
    s = w.sampling
    if s.mode == "greedy":
        sampling = SamplingParams(temperature=0.0, ignore_eos=w.ignore_eos)
    else:
        sampling = SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                  sampling_seed=s.seed, ignore_eos=w.ignore_eos)
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
        stored = sum(len(dataset[i % len(dataset)]) for i in range(w.requests))
        if stored > MAX_PLAN_TOKENS:
            problems.add(w.where("requests"), f"the workload would store {stored:,} prompt tokens "
                         f"({w.requests:,} requests over the dataset's {len(dataset):,} prompts)",
                         expected=f"at most {MAX_PLAN_TOKENS:,}")
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
        title, node = None, None
        if f.target == "rank" and f.rank is not None and main is not None:
            if f.rank >= main.world_size:
                problems.add(f.where("rank"), f"rank {f.rank} does not exist (world size {main.world_size})",
                             expected=f"a rank in 0..{main.world_size - 1}")
                continue
            if main.geometry:
                title = main.geometry[f.rank].process_title
            if main.colocated:
                node = f.rank
        out.append(
            FaultPlan(index=i, process_title=title, node=node,
                      **{k: getattr(f, k) for k in FaultSpec.model_fields})
        )
    return out


def _expectations(scenario: Scenario, engine: str, facts: EngineFacts, split_unobserved: str | None, *,
                  cp_v1: bool = False) -> list:
    ctx = PlanContext(
        engine=engine,
        degrees=scenario.topology.as_degrees(),
        requests=scenario.workload.requests,
        kills_a_rank=any(f.action == "kill" for f in scenario.faults),
        facts=facts,
        split_unobserved=split_unobserved,
        cp_v1=cp_v1,
    )
    base = os.path.dirname(os.path.abspath(scenario.source_file))
    out = []
    for name, entry in scenario.expect.entries():
        e = resolve(name, entry, ctx)
        if e.source:
            # `file:line:col` of the statement, relative to the scenario's folder as the archive
            # stores its includes (`defaults/tiny.cps:32:5`): not the machine's absolute path.
            e = e.model_copy(update={"source": os.path.relpath(os.path.abspath(e.source), base)})
        out.append(e)
    return out


def _contracts(scenario: Scenario, facts: EngineFacts, eager: str | None) -> LayoutContracts:
    topo, model = scenario.topology.as_degrees(), scenario.model.facts
    if group_problems(topo):
        return LayoutContracts(layout="impossible", eager=eager)
    return LayoutContracts(
        capacity_multiplier=expected_capacity_multiplier(topo, model.kv_heads, model.is_mla,
                                                         facts.kv_heads_rule),
        kv_owner=f"position % {topo.dcp}" if topo.dcp > 1 else None,
        kv_replicated_in_dcp_group=model.is_mla or kv_replicated_in_dcp_group(topo.attn_tp, topo.dcp,
                                                                               model.kv_heads),
        pcp_split=topo.cp_strategy if topo.pcp else None,
        min_prompt_for_split=2 * topo.attn_cp if topo.cp_strategy == "zigzag" else topo.attn_cp,
        eager=eager,
    )


def _pins(scenario: Scenario) -> Pins:
    m = scenario.model
    return Pins(
        engine=scenario.engine.kind,
        release=scenario.engine.release,
        image=scenario.engine.image,
        image_digest=None,
        model=ModelPin(kind=m.kind, path=model_location(scenario) if m.kind == "local" else m.path,
                       id=m.id, revision=m.revision, sha256=m.sha256,
                       architecture=m.facts.architecture, synthetic=m.synthetic_geometry()),
        cptest_version=__version__,
        scenario_sha256=canonical_sha256(scenario),
    )
