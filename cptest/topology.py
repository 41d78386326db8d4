"""Rank geometry and the layout contracts derived from it, exactly as SGLang builds them.

Pure: no I/O, no clock, no SGLang import. Every formula cites the line it mirrors in the pinned
SGLang release (paths relative to `sglang/srt/` in its wheel, `engines.sglang.releases.PINNED_RELEASE`);
where another release differs, the difference is a parameter whose value lives in the release table
(`cptest.engines.sglang.releases`), never an `if` on a version here.

Numbering (`distributed/parallel_state.py:2191-2547`, `entrypoints/engine.py:1755-1772`,
`layers/dp_attention.py:317-331`):

- world rank `= tp * pp_rank + tp_rank`; TP groups are contiguous blocks of `tp` ranks;
- attention layout inside a TP group is `(attn_dp, attn_cp, attn_tp)`, attn_tp fastest:
  `tp_rank = (attn_dp_rank * attn_cp + attn_cp_rank) * attn_tp + attn_tp_rank`,
  `attn_tp = tp // attn_dp // attn_cp`;
- DCP groups are contiguous `dcp`-slices of each TP group, so `dcp_rank = tp_rank % dcp`
  (`parallel_state.py:2334-2355`; `model_executor/model_runner.py:288`);
- ATTN_CP groups stride by `attn_tp` inside each attention-DP block (`parallel_state.py:2361-2393`);
  ATTN_TP groups are contiguous `attn_tp` blocks (`parallel_state.py:2397-2430`); PP groups stride by
  `world // pp`.
- GPUs: each node runs a contiguous slice of world ranks; local GPU id
  `= (pp_rank % pp_per_node) * tp_per_node + tp_rank % tp_per_node` (`engine.py:856-862`,
  `_calculate_rank_ranges` at `engine.py:1720-1752`; base_gpu_id 0, gpu_id_step 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from cptest.errors import PlanError

KvHeadsRule = Literal["attn_tp", "attn_tp_over_dcp"]
"""How a release sizes the per-rank KV pool in heads (see `kv_heads_per_rank`)."""

CP_STRATEGIES = ("zigzag", "interleave")

PlacementMode = Literal["physical", "colocated"]
"""`physical`: one rank per GPU, a server's ranks in as many processes as it has nodes (SGLang's
default). `colocated`: every rank of a multi-rank server is its own local node process, and ranks
share GPUs (docs/placement.md says what that proves and what it cannot). Every stage that labels
evidence (the plan, the evidence a checker reads, the verdict, the reports) uses this one type."""


class Degrees(BaseModel):
    """The parallel degrees of one server: the one type for them, from the scenario to both engines' argv.

    `scenario.Topology` *is* a `Degrees` (with source positions); the plan stores one per server;
    SGLang's and the reference engine's argv builders and the admission rules take one. `attn_dp` is
    attention data parallelism (its argv spelling is the release's `spellings["attn_dp"]`). `gpus` None
    means `tp * pp` (SGLang runs one scheduler process per GPU). Values are not range-checked here:
    `layout_problems` says what is wrong with them, so that a scenario *about* a rejected launch can
    still carry its impossible degrees to the engine.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpus: int | None = None
    nodes: int = 1
    tp: int
    dcp: int = 1
    attn_cp: int = 1
    attn_dp: int = 1
    pp: int = 1
    prefill_cp: bool = False
    cp_strategy: str | None = None

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def attn_tp(self) -> int:
        """`tp // attn_dp // attn_cp` (at least 1, so that admission can reason about bad degrees)."""
        return max(self.tp // max(self.attn_dp, 1) // max(self.attn_cp, 1), 1)

    @property
    def pcp(self) -> bool:
        """Prefill context parallelism is switched on and has more than one rank to split over."""
        return self.prefill_cp and self.attn_cp > 1

    def as_degrees(self) -> Degrees:
        """This value as a plain `Degrees` (a scenario's Topology sheds its source positions)."""
        if type(self) is Degrees:
            return self
        return Degrees.model_validate({k: getattr(self, k) for k in Degrees.model_fields})


@dataclass(frozen=True)
class LayoutProblem:
    """Why a set of degrees cannot be laid out. `code` names the rule (the release tables' admission
    rules use the same codes where SGLang enforces it too), `field` the setting to change."""

    code: str
    field: str
    message: str
    expected: str | None = None

    def __str__(self) -> str:
        return self.message


ADMISSION_CODES = frozenset({"tp_divisible_by_dcp", "tp_divisible_by_attn_cp", "tp_divisible_by_dp_attn_cp",
                             "cp_strategy_required", "prefill_cp_needs_attn_cp"})
"""Layout rules that SGLang also enforces (or silently ignores) itself: a scenario *about* that
rejection may break them. The other rules (gpus, nodes, positive degrees) describe what cptest can
launch at all."""


def layout_problems(d: Degrees) -> list[LayoutProblem]:
    """Every reason `d` cannot be laid out (empty when it can): the one place for topology arithmetic.

    These are impossibilities of the groups themselves (SGLang's numbering in the module docstring),
    whatever the release: `tp % dcp`, `tp % (attn_dp * attn_cp)`, a prefill CP split with nothing to
    split over or no strategy. What a *release* does with them (reject, at which stage, with which
    message) is data in `cptest.engines.sglang.releases`.
    """
    out: list[LayoutProblem] = []
    for name in ("tp", "dcp", "attn_cp", "attn_dp", "pp", "nodes"):
        v = getattr(d, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            out.append(LayoutProblem(f"{name}_at_least_1", name,
                                     f"{name} must be an integer >= 1, got {v!r}"))
    if out:
        return out
    if d.tp % d.dcp:
        out.append(LayoutProblem("tp_divisible_by_dcp", "dcp", f"dcp {d.dcp} does not divide tp {d.tp}",
                                 expected=f"dcp among {divisors(d.tp)}"))
    if d.tp % d.attn_cp:
        out.append(LayoutProblem("tp_divisible_by_attn_cp", "attn_cp",
                                 f"attn_cp {d.attn_cp} does not divide tp {d.tp}",
                                 expected=f"attn_cp among {divisors(d.tp)}"))
    elif d.tp % (d.attn_dp * d.attn_cp):
        out.append(LayoutProblem("tp_divisible_by_dp_attn_cp", "attn_dp",
                                 f"attn_dp x attn_cp ({d.attn_dp * d.attn_cp}) does not divide tp {d.tp}"))
    world = d.world_size
    if d.gpus is not None and d.gpus != world:
        out.append(LayoutProblem("gpus_are_world", "gpus", f"gpus {d.gpus} != tp {d.tp} x pp {d.pp}",
                                 expected=f"gpus {world}"))
    if world % d.nodes:
        out.append(LayoutProblem("nodes_divide_world", "nodes",
                                 f"nodes {d.nodes} does not divide gpus {world}"))
    elif d.nodes > 1:
        # _calculate_rank_ranges (engine.py:1720-1752) only splits evenly in these two shapes.
        nodes_split_pp = d.pp % d.nodes == 0
        nodes_split_tp = d.nodes % d.pp == 0 and d.tp % (d.nodes // d.pp) == 0
        if not (nodes_split_pp or nodes_split_tp):
            out.append(LayoutProblem("nodes_split_evenly", "nodes",
                                     f"nodes {d.nodes} must divide pp {d.pp} or be pp times a divisor of tp"))
    if d.cp_strategy is not None and d.cp_strategy not in CP_STRATEGIES:
        out.append(LayoutProblem("cp_strategy_known", "cp_strategy",
                                 f"cp_strategy must be zigzag or interleave, got {d.cp_strategy!r}",
                                 expected="zigzag or interleave"))
    if d.prefill_cp and d.cp_strategy is None:
        out.append(LayoutProblem("cp_strategy_required", "prefill_cp", "prefill_cp needs a cp_strategy",
                                 expected="zigzag or interleave"))
    if d.prefill_cp and d.attn_cp <= 1:
        # Nothing to split over: SGLang (layers/cp/base.py:245-256) silently runs without CP.
        out.append(LayoutProblem("prefill_cp_needs_attn_cp", "prefill_cp",
                                 "prefill CP needs attn_cp > 1 (with one CP rank nothing is split)"))
    return out


SPLIT_RULES = frozenset({"cp_strategy_known", "cp_strategy_required", "prefill_cp_needs_attn_cp"})
"""Rules about the prefill row split only: the process groups can still be built."""


def group_problems(d: Degrees) -> list[LayoutProblem]:
    """The layout problems that make the process groups impossible to build."""
    return [p for p in layout_problems(d) if p.code not in SPLIT_RULES]


def layout_codes(d: Degrees) -> frozenset[str]:
    """The codes of `layout_problems(d)`: what admission conditions test."""
    return frozenset(p.code for p in layout_problems(d))


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class RankGeometry(BaseModel):
    """Where one world rank sits in every process group SGLang builds. Groups hold world ranks.

    The plan stores one per rank with the rank's scheduler `process_title` (what a fault targets).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    world_rank: int
    node: int
    local_gpu: int
    tp_rank: int
    pp_rank: int
    dcp_rank: int
    attn_cp_rank: int
    attn_tp_rank: int
    attn_dp_rank: int
    tp_group: tuple[int, ...]
    dcp_group: tuple[int, ...]
    attn_cp_group: tuple[int, ...]
    attn_tp_group: tuple[int, ...]
    pp_group: tuple[int, ...]
    process_title: str = ""

    def group(self, name: str) -> tuple[int, ...]:
        """The `name` group (tp, dcp, attn_cp, attn_tp, pp) this rank belongs to."""
        return getattr(self, f"{name}_group")


def geometry(d: Degrees, title_prefix: str | None = None) -> list[RankGeometry]:
    """One `RankGeometry` per world rank, in world-rank order, each with its `process_title` when a
    `title_prefix` is given. Raises `PlanError` if impossible."""
    problems = group_problems(d)
    if problems:
        raise PlanError("; ".join(p.message for p in problems))
    tp, pp, dcp, acp = d.tp, d.pp, d.dcp, d.attn_cp
    atp = d.attn_tp
    world = d.world_size
    pp_per_node = max(pp // d.nodes, 1)
    nodes_per_pp = max(d.nodes // pp, 1)
    tp_per_node = tp // nodes_per_pp
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
        rank = RankGeometry(
            world_rank=w,
            node=(pp_rank // pp_per_node) * nodes_per_pp + tp_rank // tp_per_node,
            local_gpu=(pp_rank % pp_per_node) * tp_per_node + tp_rank % tp_per_node,
            tp_rank=tp_rank,
            pp_rank=pp_rank,
            dcp_rank=tp_rank % dcp,
            attn_cp_rank=attn_cp_rank,
            attn_tp_rank=attn_tp_rank,
            attn_dp_rank=attn_dp_rank,
            tp_group=tuple(range(base, base + tp)),
            dcp_group=tuple(range(dcp_start, dcp_start + dcp)),
            attn_cp_group=tuple(range(cp_start, cp_start + atp * acp, atp)),
            attn_tp_group=tuple(range(atp_start, atp_start + atp)),
            pp_group=tuple(range(tp_rank, world, tp)),
            process_title="" if title_prefix is None else _title(d, title_prefix, attn_dp_rank, pp_rank,
                                                                  attn_cp_rank, tp_rank),
        )
        out.append(rank)
    return out


def process_title(rank: RankGeometry, d: Degrees, prefix: str = "sglang::scheduler") -> str:
    """The scheduler's process title, `<prefix>_DP<d>_PP<p>_ATTN_CP<c>_TP<r>`.

    Each part appears only when its size is > 1 (`managers/scheduler.py:4843-4859`; DP is
    the attention-DP rank, `data_parallel_controller.py:636-644`). A TP1 server's title is the bare
    prefix. cptest has no expert-parallel degrees, so SGLang's MOE_DP and EP parts never appear.
    """
    return _title(d, prefix, rank.attn_dp_rank, rank.pp_rank, rank.attn_cp_rank, rank.tp_rank)


def _title(d: Degrees, prefix: str, attn_dp: int, pp: int, attn_cp: int, tp: int) -> str:
    parts = []
    if d.attn_dp > 1:
        parts.append(f"DP{attn_dp}")
    if d.pp > 1:
        parts.append(f"PP{pp}")
    if d.attn_cp > 1:
        parts.append(f"ATTN_CP{attn_cp}")
    if d.tp > 1:
        parts.append(f"TP{tp}")
    return prefix + "".join("_" + p for p in parts)


def titled_geometry(d: Degrees, prefix: str = "sglang::scheduler") -> list[RankGeometry]:
    """`geometry(d)` with each rank's process title; empty when `d` cannot be laid out (a scenario
    that expects the engine to reject the launch may declare such degrees)."""
    if group_problems(d):
        return []
    return geometry(d, prefix)


# ---------------------------------------------------------------- PCP row split


def zigzag_block_sizes(extend_len: int, cp: int) -> list[int]:
    """The `2*cp` block sizes of one sequence: the first `len % 2cp` blocks get one extra token.

    Mirrors `layers/cp/zigzag.py:150-158` exactly.
    """
    segments = 2 * cp
    base, rem = divmod(extend_len, segments)
    return [base + 1 if b < rem else base for b in range(segments)]


def zigzag_split(extend_len: int, cp: int) -> list[list[tuple[int, int]]]:
    """Per CP rank, the half-open token ranges it owns of one sequence's extend tokens.

    Rank `r` owns blocks `r` and `2cp-1-r` (`zigzag.py:15-29, 160-168`); empty blocks (when
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

    `zigzag.py:109-119` (`can_apply`): false if `cp <= 1`, if the total is `< 2*cp`, or if
    any one sequence's extend length is `< 2*cp` (one short request disables CP for the batch).
    The forward-mode condition (only CP extend batches) is not a function of lengths; callers
    apply it themselves.
    """
    if cp <= 1 or sum(extend_lens) < 2 * cp:
        return False
    return all(int(n) >= 2 * cp for n in extend_lens)


def interleave_split(n: int, cp: int) -> list[range]:
    """Per CP rank, the packed token indices it owns under `--cp-strategy interleave`: `i % cp == r`.

    `layers/cp/interleave.py` (round-robin over the packed batch).
    """
    _check_degree(cp, "cp")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [range(r, n, cp) for r in range(cp)]


def interleave_applies(extend_lens: Sequence[int], cp: int) -> bool:
    """`interleave.py:64-69`: splits only when `cp > 1` and the batch has `>= cp` extend tokens."""
    total = sum(int(n) for n in extend_lens)
    return cp > 1 and total > 0 and total >= cp


# ---------------------------------------------------------------- DCP ownership and capacity


def dcp_owner(pos: int, dcp: int, interleave: int = 1) -> int:
    """DCP rank that writes KV position `pos`: `(pos // interleave) % dcp`.

    The pinned release has only interleave 1 (`Release.dcp_interleave_sizes`): owner `pos % dcp`
    (`layers/dcp/layout.py:13-31`; triton write mask `positions % dcp_size == dcp_rank`,
    `layers/attention/triton_backend.py:1230-1238`).
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


def capacity_groups(spec: Degrees) -> list[list[int]]:
    """The ranks that together hold one logical KV space: the DCP groups (singletons without DCP)."""
    seen: dict[tuple[int, ...], None] = {}
    for g in geometry(spec):
        seen.setdefault(g.dcp_group, None)
    return [list(g) for g in seen]


def kv_heads_per_rank(tp: int, dcp: int, kv_heads: int, rule: KvHeadsRule = "attn_tp") -> int:
    """KV heads one rank's pool holds (MHA/GQA). `tp` here is the attention-TP size.

    - `"attn_tp"` (the pinned release's): `max(1, kv_heads // tp)`; DCP does not change it
      (`configs/model_config.py:1121-1128`, called with `attn_tp_size` by
      `model_executor/pool_configurator.py:292` and `mem_cache/kv_cache_configurator.py:1442`).
    - `"attn_tp_over_dcp"`: `max(1, kv_heads // (tp // dcp))`, the DCP group's heads on every
      member (`configs/model_config.py:1700-1711` in the wheel of a release whose table names it).
    `Release.kv_heads_rule` says which one a release follows.
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
    (`triton_backend.py:1797-1810`), which is only right when the group's ranks hold the same
    heads: true iff `dcp == 1` or `kv_heads <= tp // dcp` with the replica blocks aligned to the
    groups. Nothing in the pinned release checks this on CUDA (docs/sglang.md §2.4).
    """
    if dcp == 1:
        return True
    for start in range(0, tp, dcp):
        heads = {kv_heads_of_rank(r, tp, kv_heads) for r in range(start, start + dcp)}
        if len(heads) != 1:
            return False
    return True


def expected_capacity_multiplier(
    spec: Degrees, kv_heads: int, is_mla: bool, rule: KvHeadsRule = "attn_tp"
) -> float:
    """Logical KV capacity of `spec` relative to a TP-only server with the same `tp` and memory.

    Logical capacity is `rows * dcp` (`managers/tp_worker.py:405-411`); rows per rank are
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


def logical_capacity(rows_per_rank: int, spec: Degrees) -> int:
    """Scheduler capacity (`max_total_num_tokens`) from one rank's physical rows: `rows * dcp`."""
    return rows_per_rank * spec.dcp


def _check_degree(v: int, name: str) -> None:
    if not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
