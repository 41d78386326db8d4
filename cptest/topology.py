"""Rank geometry and the layout contracts derived from it, exactly as SGLang builds them.

Pure: no I/O, no clock, no SGLang import. Every formula cites the SGLang 0.5.17 line it mirrors
(paths relative to `sglang/srt/` in the 0.5.17 wheel); where 0.5.23 differs, the difference is a
parameter whose value lives in the release table (`cptest.engines.sglang.releases`), never an `if`
on a version here.

Numbering (0.5.17 `distributed/parallel_state.py:2191-2545`, `entrypoints/engine.py:1754-1772`,
`layers/dp_attention.py:317-331`):

- world rank `= tp * pp_rank + tp_rank`; TP groups are contiguous blocks of `tp` ranks;
- attention layout inside a TP group is `(attn_dp, attn_cp, attn_tp)`, attn_tp fastest:
  `tp_rank = (attn_dp_rank * attn_cp + attn_cp_rank) * attn_tp + attn_tp_rank`,
  `attn_tp = tp // attn_dp // attn_cp`;
- DCP groups are contiguous `dcp`-slices of each TP group, so `dcp_rank = tp_rank % dcp`
  (`parallel_state.py:2296-2317`; `model_executor/model_runner.py:288`);
- ATTN_CP groups stride by `attn_tp` inside each attention-DP block (`parallel_state.py:2323-2355`);
  ATTN_TP groups are contiguous `attn_tp` blocks (`:2363-2394`); PP groups stride by `world // pp`.
- GPUs: each node runs a contiguous slice of world ranks; local GPU id
  `= (pp_rank % pp_per_node) * tp_per_node + tp_rank % tp_per_node` (`engine.py:856-862`,
  `_calculate_rank_ranges` at `engine.py:1720-1752`; base_gpu_id 0, gpu_id_step 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cptest.errors import PlanError

KvHeadsRule = Literal["attn_tp", "attn_tp_over_dcp"]
"""How a release sizes the per-rank KV pool in heads (see `kv_heads_per_rank`)."""


@dataclass(frozen=True)
class TopologySpec:
    """Parallel degrees of one SGLang server. `attn_dp` is `--dp-size N --enable-dp-attention` in 0.5.17.

    `gpus` defaults to the world size (`tp * pp`); SGLang runs one scheduler process per GPU.
    `ep` and `moe_dp` only matter for process titles here.
    """

    tp: int
    dcp: int = 1
    attn_cp: int = 1
    attn_dp: int = 1
    pp: int = 1
    nodes: int = 1
    gpus: int | None = None
    prefill_cp: bool = False
    cp_strategy: str | None = None
    ep: int = 1
    moe_dp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def attn_tp(self) -> int:
        return self.tp // self.attn_dp // self.attn_cp


@dataclass(frozen=True)
class RankGeometry:
    """Where one world rank sits in every process group SGLang builds. Groups hold world ranks."""

    world_rank: int
    node: int
    local_gpu: int
    tp_rank: int
    pp_rank: int
    dcp_rank: int
    attn_cp_rank: int
    attn_tp_rank: int
    attn_dp_rank: int
    moe_dp_rank: int
    moe_ep_rank: int
    tp_group: tuple[int, ...]
    dcp_group: tuple[int, ...]
    attn_cp_group: tuple[int, ...]
    attn_tp_group: tuple[int, ...]
    pp_group: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form stored in `plan.json` (`ServerPlan.geometry`)."""
        # Flat fields only, so a comprehension does what dataclasses.asdict would, ~10x faster
        # (the plan builds one per rank for every scenario it compiles).
        return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items()}


def topology_problems(spec: TopologySpec) -> list[str]:
    """Every reason `spec` cannot be laid out (empty when it can). Messages say what to change.

    These are layout impossibilities (the groups cannot be built), not SGLang's admission rules:
    those, with SGLang's exact messages, live in `cptest.engines.sglang.admission`.
    """
    out: list[str] = []
    for name in ("tp", "dcp", "attn_cp", "attn_dp", "pp", "nodes", "ep", "moe_dp"):
        v = getattr(spec, name)
        if not isinstance(v, int) or v < 1:
            out.append(f"{name} must be an integer >= 1, got {v!r}")
    if out:
        return out
    if spec.tp % spec.dcp:
        out.append(f"tp {spec.tp} is not divisible by dcp {spec.dcp}; choose dcp among {divisors(spec.tp)}")
    if spec.tp % (spec.attn_cp * spec.attn_dp):
        out.append(f"tp {spec.tp} is not divisible by attn_dp*attn_cp = {spec.attn_dp * spec.attn_cp}")
    if spec.tp % (spec.ep * spec.moe_dp):
        out.append(f"tp {spec.tp} is not divisible by ep*moe_dp = {spec.ep * spec.moe_dp}")
    world = spec.world_size
    if spec.gpus is not None and spec.gpus != world:
        out.append(f"gpus {spec.gpus} != tp*pp = {world}; SGLang runs one rank per GPU")
    if world % spec.nodes:
        out.append(f"world size {world} is not divisible by nodes {spec.nodes}")
    elif spec.nodes > 1:
        # _calculate_rank_ranges (engine.py:1720-1752) only splits evenly in these two shapes.
        nodes_split_pp = spec.pp % spec.nodes == 0
        nodes_split_tp = spec.nodes % spec.pp == 0 and spec.tp % (spec.nodes // spec.pp) == 0
        if not (nodes_split_pp or nodes_split_tp):
            out.append(f"nodes {spec.nodes} must divide pp {spec.pp} or be pp times a divisor of tp")
    if spec.cp_strategy is not None and spec.cp_strategy not in ("zigzag", "interleave"):
        out.append(f"cp_strategy must be zigzag or interleave, got {spec.cp_strategy!r}")
    return out


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def geometry(spec: TopologySpec) -> list[RankGeometry]:
    """One `RankGeometry` per world rank, in world-rank order. Raises `PlanError` if impossible."""
    problems = topology_problems(spec)
    if problems:
        raise PlanError("; ".join(problems))
    tp, pp, dcp, acp = spec.tp, spec.pp, spec.dcp, spec.attn_cp
    atp = spec.attn_tp
    world = spec.world_size
    pp_per_node = max(pp // spec.nodes, 1)
    nodes_per_pp = max(spec.nodes // pp, 1)
    tp_per_node = tp // nodes_per_pp
    moe_block = tp // spec.moe_dp
    out: list[RankGeometry] = []
    for w in range(world):
        pp_rank, tp_rank = divmod(w, tp)
        base = pp_rank * tp
        attn_dp_rank = tp_rank // (atp * acp)
        attn_cp_rank = (tp_rank // atp) % acp
        attn_tp_rank = tp_rank % atp
        dcp_start = base + (tp_rank // dcp) * dcp
        cp_start = base + attn_dp_rank * atp * acp + attn_tp_rank
        atp_start = base + (tp_rank // atp) * atp
        out.append(
            RankGeometry(
                world_rank=w,
                node=(pp_rank // pp_per_node) * nodes_per_pp + tp_rank // tp_per_node,
                local_gpu=(pp_rank % pp_per_node) * tp_per_node + tp_rank % tp_per_node,
                tp_rank=tp_rank,
                pp_rank=pp_rank,
                dcp_rank=tp_rank % dcp,
                attn_cp_rank=attn_cp_rank,
                attn_tp_rank=attn_tp_rank,
                attn_dp_rank=attn_dp_rank,
                moe_dp_rank=tp_rank // moe_block,
                moe_ep_rank=tp_rank % moe_block // (moe_block // spec.ep),
                tp_group=tuple(range(base, base + tp)),
                dcp_group=tuple(range(dcp_start, dcp_start + dcp)),
                attn_cp_group=tuple(range(cp_start, cp_start + atp * acp, atp)),
                attn_tp_group=tuple(range(atp_start, atp_start + atp)),
                pp_group=tuple(range(tp_rank, world, tp)),
            )
        )
    return out


def process_title(rank: RankGeometry, spec: TopologySpec) -> str:
    """The scheduler's process title, `sglang::scheduler_DP<d>_PP<p>_ATTN_CP<c>_MOE_DP<m>_TP<r>_EP<e>`.

    Each part appears only when its size is > 1 (0.5.17 `managers/scheduler.py:4843-4859`; DP is
    the attention-DP rank, `data_parallel_controller.py:636-644`). A TP1 server's title is the bare
    `sglang::scheduler`.
    """
    parts = []
    if spec.attn_dp > 1:
        parts.append(f"DP{rank.attn_dp_rank}")
    if spec.pp > 1:
        parts.append(f"PP{rank.pp_rank}")
    if spec.attn_cp > 1:
        parts.append(f"ATTN_CP{rank.attn_cp_rank}")
    if spec.moe_dp > 1:
        parts.append(f"MOE_DP{rank.moe_dp_rank}")
    if spec.tp > 1:
        parts.append(f"TP{rank.tp_rank}")
    if spec.ep > 1:
        parts.append(f"EP{rank.moe_ep_rank}")
    return "sglang::scheduler" + "".join("_" + p for p in parts)


# ---------------------------------------------------------------- PCP row split


def zigzag_block_sizes(extend_len: int, cp: int) -> list[int]:
    """The `2*cp` block sizes of one sequence: the first `len % 2cp` blocks get one extra token.

    Mirrors 0.5.17 `layers/cp/zigzag.py:150-158` exactly.
    """
    segments = 2 * cp
    base, rem = divmod(extend_len, segments)
    return [base + 1 if b < rem else base for b in range(segments)]


def zigzag_split(extend_len: int, cp: int) -> list[list[tuple[int, int]]]:
    """Per CP rank, the half-open token ranges it owns of one sequence's extend tokens.

    Rank `r` owns blocks `r` and `2cp-1-r` (0.5.17 `zigzag.py:15-29, 160-168`); empty blocks (when
    `extend_len < 2cp`, where SGLang falls back anyway, see `zigzag_applies`) are left out.
    """
    _check_degree(cp, "cp")
    if extend_len < 0:
        raise ValueError(f"extend_len must be >= 0, got {extend_len}")
    sizes = zigzag_block_sizes(extend_len, cp)
    starts = [0]
    for s in sizes:
        starts.append(starts[-1] + s)
    out: list[list[tuple[int, int]]] = []
    for r in range(cp):
        ranges = [(starts[b], starts[b + 1]) for b in (r, 2 * cp - 1 - r) if sizes[b] > 0]
        out.append(ranges)
    return out


def zigzag_rank_token_counts(extend_lens: Sequence[int], cp: int) -> list[int]:
    """Tokens each CP rank computes for a batch: SGLang's `per_rank_actual_token` (`zigzag.py:160-168`).

    Padding (`num_tokens - sum(extend_lens)`) is added to the last sequence by SGLang first
    (`zigzag.py:131-136`); pass the padded lengths if the batch was padded.
    """
    _check_degree(cp, "cp")
    counts = [0] * cp
    for length in extend_lens:
        sizes = zigzag_block_sizes(int(length), cp)
        for r in range(cp):
            counts[r] += sizes[r] + sizes[2 * cp - 1 - r]
    return counts


def zigzag_applies(extend_lens: Sequence[int], cp: int) -> bool:
    """Whether zigzag really splits this extend batch; False is SGLang's *silent* fallback to no split.

    0.5.17 `zigzag.py:109-119` (`can_apply`): false if `cp <= 1`, if the total is `< 2*cp`, or if
    any one sequence's extend length is `< 2*cp` (one short request disables CP for the batch).
    The forward-mode condition (only CP extend batches) is not a function of lengths; callers
    apply it themselves.
    """
    if cp <= 1 or sum(extend_lens) < 2 * cp:
        return False
    return all(int(n) >= 2 * cp for n in extend_lens)


def interleave_split(n: int, cp: int) -> list[range]:
    """Per CP rank, the packed token indices it owns under `--cp-strategy interleave`: `i % cp == r`.

    0.5.17 `layers/cp/interleave.py` (round-robin over the packed batch).
    """
    _check_degree(cp, "cp")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [range(r, n, cp) for r in range(cp)]


def interleave_applies(extend_lens: Sequence[int], cp: int) -> bool:
    """0.5.17 `interleave.py:64-69`: splits only when `cp > 1` and the batch has `>= cp` extend tokens."""
    total = sum(int(n) for n in extend_lens)
    return cp > 1 and total > 0 and total >= cp


# ---------------------------------------------------------------- DCP ownership and capacity


def dcp_owner(pos: int, dcp: int, interleave: int = 1) -> int:
    """DCP rank that writes KV position `pos`: `(pos // interleave) % dcp`.

    0.5.17 has only interleave 1: owner `pos % dcp` (`layers/dcp/layout.py:13-31`; triton write mask
    `positions % dcp_size == dcp_rank`, `layers/attention/triton_backend.py:1230-1238`).
    """
    _check_degree(dcp, "dcp")
    _check_degree(interleave, "interleave")
    return (pos // interleave) % dcp


def dcp_local_positions(length: int, rank: int, dcp: int, interleave: int = 1) -> Sequence[int]:
    """Positions `0..length-1` whose KV DCP rank `rank` holds, ascending.

    Its length equals SGLang's `get_dcp_lens` (`layout.py:13-31`): `length // dcp + (rank < length % dcp)`
    for interleave 1.
    """
    _check_degree(dcp, "dcp")
    if not 0 <= rank < dcp:
        raise ValueError(f"rank must be in [0, {dcp}), got {rank}")
    if interleave == 1:
        return range(rank, length, dcp)
    return [p for p in range(length) if dcp_owner(p, dcp, interleave) == rank]


def capacity_groups(spec: TopologySpec) -> list[list[int]]:
    """The ranks that together hold one logical KV space: the DCP groups (singletons without DCP)."""
    seen: dict[tuple[int, ...], None] = {}
    for g in geometry(spec):
        seen.setdefault(g.dcp_group, None)
    return [list(g) for g in seen]


def kv_heads_per_rank(tp: int, dcp: int, kv_heads: int, rule: KvHeadsRule = "attn_tp") -> int:
    """KV heads one rank's pool holds (MHA/GQA). `tp` here is the attention-TP size.

    - `"attn_tp"` (0.5.17): `max(1, kv_heads // tp)`; DCP does not change it
      (`configs/model_config.py:1121-1128`, called with `attn_tp_size` by
      `model_executor/pool_configurator.py:292` and `mem_cache/kv_cache_configurator.py:491`).
    - `"attn_tp_over_dcp"` (0.5.23): `max(1, kv_heads // (tp // dcp))`, the DCP group's heads on
      every member (0.5.23 `configs/model_config.py:1700-1711`).
    """
    _check_degree(tp, "tp")
    _check_degree(dcp, "dcp")
    divisor = tp // dcp if rule == "attn_tp_over_dcp" else tp
    return max(1, kv_heads // max(divisor, 1))


def kv_heads_of_rank(attn_tp_rank: int, attn_tp: int, kv_heads: int) -> tuple[int, ...]:
    """Which KV heads an attention-TP rank computes: a contiguous shard, or one replicated head.

    QKV parallel linear sharding: with `kv_heads >= attn_tp` rank r holds
    `[r*K/attn_tp, (r+1)*K/attn_tp)`; with fewer heads each head is replicated on `attn_tp // K`
    consecutive ranks, so rank r holds head `r * K // attn_tp`.
    """
    if kv_heads >= attn_tp:
        per = kv_heads // attn_tp
        return tuple(range(attn_tp_rank * per, (attn_tp_rank + 1) * per))
    return (attn_tp_rank * kv_heads // attn_tp,)


def kv_replicated_in_dcp_group(tp: int, dcp: int, kv_heads: int) -> bool:
    """Whether every rank of each DCP group computes the same KV heads (MHA/GQA, attention-TP = tp).

    DCP all-gathers queries over the group and attends against each rank's local KV shard
    (0.5.17 `triton_backend.py:1797-1810`), which is only right when the group's ranks hold the same
    heads: true iff `dcp == 1` or `kv_heads <= tp // dcp` with the replica blocks aligned to the
    groups. Nothing in 0.5.17 checks this on CUDA (sglang-cp.md §2.4).
    """
    if dcp == 1:
        return True
    for start in range(0, tp, dcp):
        heads = {kv_heads_of_rank(r, tp, kv_heads) for r in range(start, start + dcp)}
        if len(heads) != 1:
            return False
    return True


def expected_capacity_multiplier(
    spec: TopologySpec, kv_heads: int, is_mla: bool, rule: KvHeadsRule = "attn_tp"
) -> float:
    """Logical KV capacity of `spec` relative to a TP-only server with the same `tp` and memory.

    Logical capacity is `rows * dcp` (0.5.17 `managers/tp_worker.py:405-411`); rows per rank are
    inversely proportional to the KV heads a rank holds, so the multiplier is
    `dcp * heads(TP-only) / heads(spec)`. MLA has one latent head: `dcp`. PCP writes the full KV on
    every CP rank and shrinks attention-TP, so it never gains capacity. An estimate: it ignores the
    weights' and activations' share of memory (inferred, not a SGLang formula).
    """
    if is_mla:
        return float(spec.dcp)
    base = kv_heads_per_rank(spec.tp, 1, kv_heads, rule)
    mine = kv_heads_per_rank(spec.attn_tp, spec.dcp, kv_heads, rule)
    return spec.dcp * base / mine


def logical_capacity(rows_per_rank: int, spec: TopologySpec) -> int:
    """Scheduler capacity (`max_total_num_tokens`) from one rank's physical rows: `rows * dcp`."""
    return rows_per_rank * spec.dcp


def _check_degree(v: int, name: str) -> None:
    if not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
