"""What one planned scenario needs of the machine while it runs.

A scenario runs its servers one after the other (main, then baseline), so it holds the most any of
them needs: GPUs (one host: a suite cannot run a physical server of several nodes, while a
co-located server's nodes are local processes), GPU memory per GPU, CPUs. Nothing is measured here;
the figures come from the plan, the scenario's serve settings and the model.

GPU memory of an SGLang server, per GPU (the pinned release, `mem_cache/kv_cache_configurator.py:1614-1657`):
the KV pool gets the memory free after loading the weights, less (1 - mem_fraction) of what was free
before loading, and `--max-total-tokens` caps it. So a capped server holds its weights, its pool
(rows x bytes per row) and a runtime part (CUDA context, NCCL buffers, activations, kernels); an
uncapped one holds up to mem_fraction of the GPU plus the runtime part. The runtime part is measured,
not guessed: `RUNTIME_MIB`. A co-located server's ranks are each such a server on their own (their
memory fraction the plan's `Colocation.mem_fraction`), so a GPU they share holds the sum of theirs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from cptest.plan.build import DEFAULT_MEM_FRACTION
from cptest.plan.model import PlacementMode, Plan, ServerPlan
from cptest.run.preflight import RUNTIME_MIB
from cptest.scenario import Scenario


@dataclass(frozen=True)
class Demand:
    name: str
    gpus: int
    """GPUs the largest server uses (all on this host; a co-located server's ranks share them)."""
    gpu_mib: int
    """MiB that server may hold on each of its GPUs (co-located: the most ranks sharing one GPU,
    each a whole process)."""
    cpus: int
    exclusive: str | None = None
    """Why it must run with nothing else on the machine (the scenario's `exclusive`), or None."""
    cannot_run: str | None = None
    """Why no placement on one host can run it (several physical nodes), or None."""
    basis: str = ""
    """How gpu_mib was estimated, for the suite record."""
    placement: PlacementMode = "physical"
    """How the plan places its ranks: `colocated` ranks share the GPUs granted (`Plan.placement`)."""


def demand_of(scenario: Scenario, planned: Plan, gpu_total_mib: int) -> Demand:
    """What `planned` needs of a machine whose GPUs have `gpu_total_mib` each, placed as it is planned
    (`Plan.placement`): one host, or `Demand.cannot_run` saying why not."""
    servers = planned.servers()
    mode = planned.placement
    spread = [s for s in servers if len(s.nodes) > 1 and not s.colocated]
    if spread:
        nodes = max(len(s.nodes) for s in spread)
        return Demand(planned.scenario, 0, 0, 0, scenario.exclusive,
                      cannot_run=f"{nodes} nodes: a suite packs one host", placement=mode)
    cpus = max(_cpus(s.engine, s.world_size) for s in servers)
    if planned.main.engine == "reference":
        return Demand(planned.scenario, 0, 0, cpus, scenario.exclusive, basis="reference engine: no GPU",
                      placement=mode)
    needs = [_server_gpus(scenario, s, gpu_total_mib) for s in servers]
    fullest = max(needs, key=lambda n: n.mib)
    return Demand(planned.scenario, max(n.gpus for n in needs), fullest.mib, cpus, scenario.exclusive,
                  basis=fullest.basis, placement=mode)


def _cpus(engine: str, world: int) -> int:
    # SGLang: one per rank (a scheduler process each, busy while it runs batches), one for the HTTP
    # and tokenizer process, one for the detokenizer. The reference engine's ranks are small CPU
    # models whose timing nothing judges: one core per server keeps servers off each other's cores.
    return world + 2 if engine == "sglang" else 1


class GpuNeed(NamedTuple):
    gpus: int
    mib: int
    """On the fullest of them."""
    basis: str


def _server_gpus(scenario: Scenario, server: ServerPlan, gpu_total_mib: int) -> GpuNeed:
    """GPUs an SGLang server uses, the MiB it may hold on the fullest of them, and how that was
    reckoned. Co-located ranks are each a whole process (its own CUDA context, pool and weights
    shard, sized by the rank's own memory fraction), so a GPU holds the sum over the ranks on it."""
    t = server.topology
    shards = t.tp * t.pp
    colo = server.colocation
    if colo is None:
        mib, basis = _sglang_gpu_mib(scenario, t.attn_tp, shards, gpu_total_mib, scenario.serve.mem_fraction)
        return GpuNeed(len(server.nodes[0].gpu_ids), mib, basis)
    rank_mib, rank_basis = _sglang_gpu_mib(scenario, t.attn_tp, shards, gpu_total_mib, colo.mem_fraction)
    sharing = colo.ranks_per_gpu
    return GpuNeed(len(set(colo.rank_gpus)), sharing * rank_mib,
                   f"{sharing} co-located rank(s) per GPU x {rank_mib} MiB each ({rank_basis})")


def _sglang_gpu_mib(scenario: Scenario, attn_tp: int, shards: int, gpu_total_mib: int,
                    mem_fraction: float | None) -> tuple[int, str]:
    """What one SGLang process holds on its GPU when it runs with `mem_fraction` (None: the engine's
    own choice, `DEFAULT_MEM_FRACTION`)."""
    fraction = mem_fraction or DEFAULT_MEM_FRACTION
    budget = int(fraction * gpu_total_mib)
    weights = _weights_mib(scenario, shards)
    rows = scenario.serve.max_total_tokens
    if rows is None:
        return budget + RUNTIME_MIB, f"uncapped pool: mem_fraction {fraction} x {gpu_total_mib} + runtime"
    f = scenario.model.facts
    if f.is_mla:
        per_row = f.layers * f.head_dim * 2  # one latent vector per layer, bf16
    else:
        per_row = f.layers * 2 * math.ceil(f.kv_heads / max(attn_tp, 1)) * f.head_dim * 2
    pool = math.ceil(rows * per_row / (1 << 20))
    static = min(budget, pool + weights)
    return static + RUNTIME_MIB, (f"pool {rows} rows x {per_row} B = {pool} MiB + weights {weights} MiB "
                                  f"+ runtime {RUNTIME_MIB} MiB")


def _weights_mib(scenario: Scenario, shards: int) -> int:
    """The checkpoint's size on disk split over the shards, when it is a local folder; else an
    estimate from the geometry (bf16, 12 hidden^2 per layer, embedding and head)."""
    m = scenario.model
    if m.kind == "local" and m.path and Path(m.path).is_dir():
        size = sum(p.stat().st_size for p in Path(m.path).glob("*.safetensors"))
        if size:
            return math.ceil(size / shards / (1 << 20))
    f = m.facts
    params = 2 * f.vocab * f.hidden + f.layers * 12 * f.hidden * f.hidden
    return math.ceil(params * 2 / shards / (1 << 20))
