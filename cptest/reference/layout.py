"""Rank layout of a reference server: groups, head shards and row splits (pure, no torch).

The numbering is SGLang's (`cptest.topology`, docs/sglang.md §6): TP blocks contiguous,
`tp_rank = (attn_dp_rank * attn_cp + attn_cp_rank) * attn_tp + attn_tp_rank`, DCP groups contiguous
slices of the TP group with `dcp_rank = tp_rank % dcp`. The reference runs pp 1, on one node or
several (`node_ranks`: node k runs the k-th contiguous block of world ranks, as SGLang).

Attention DP: each attention-DP rank is a contiguous block of `attn_cp * attn_tp` ranks (group
`dp_block`) that runs its own batch through attention; the MLP runs over the buffer of every DP
rank's rows (`cptest.reference.modeling.DpSizes`), sharded over the whole TP group, as SGLang's
dense MLP does. DCP runs beside attention DP where each DCP group lies inside one DP rank
(`attn_tp % dcp == 0`): the group's ranks share one batch, so gathering its queries is sound.

Head shards: query heads are split over attention TP (`heads / attn_tp` per rank, contiguous). The
K/V heads a rank *stores* are the ones its attention needs: under DCP the queries of the whole DCP
group are gathered, so every rank of a DCP group stores the K/V heads of the group's query heads
(KV heads replicated within the group, the layout under which DCP is correct, §3 admission); without
DCP, the K/V heads of the rank's own query heads (replicated when kv_heads < attn_tp).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from cptest.topology import (
    Degrees,
    RankGeometry,
    dcp_owner,
    geometry,
    interleave_split,
    layout_problems,
    zigzag_applies,
    zigzag_split,
)


def unsupported(d: Degrees) -> list[str]:
    """Degrees this engine has no flag or no contract for (`server_args.py`): it would silently run
    something else."""
    if d.pp != 1:
        return [f"the reference engine runs pp 1 (got pp {d.pp})"]
    if d.attn_dp > 1 and d.dcp > 1 and d.attn_tp % d.dcp:
        return [f"the reference engine runs DCP beside attention DP only inside each attention-DP rank "
                f"(attention TP {d.attn_tp} divisible by dcp {d.dcp}): a DCP group spanning attention-DP "
                "ranks gathers queries of different batches, which is not a contract of the reference engine"]
    return []


def node_ranks(d: Degrees, node_rank: int) -> range:
    """The world ranks node `node_rank` runs: SGLang's contiguous blocks of `world / nodes`."""
    per = d.world_size // max(d.nodes, 1)
    return range(node_rank * per, (node_rank + 1) * per)


TOLERATED = frozenset({"cp_strategy_required", "prefill_cp_needs_attn_cp"})


def reference_problems(d: Degrees) -> list[str]:
    """Why the reference engine cannot run degrees `d` (empty when it can): the layout rules of
    `cptest.topology`, then what this engine does not implement. The plan asks this before anything
    starts; the server asks again, so that a hand-written argv fails with the same words."""
    # A prefill_cp switch without a strategy or a second CP rank is tolerated: no split happens.
    out = [p.message for p in layout_problems(d) if p.code not in TOLERATED] + unsupported(d)
    if d.dcp > 1 and d.pcp:
        out.append("--dcp-size > 1 does not support --enable-prefill-cp (PCP with DCP is not a contract "
                   "of the reference engine)")
    return out


@dataclass(frozen=True)
class Layout:
    """One rank of a reference server: its degrees and world rank; groups from `cptest.topology`."""

    degrees: Degrees
    rank: int

    # ------------------------------------------------------------------ degrees and ranks
    @property
    def tp(self) -> int:
        return self.degrees.tp

    @property
    def dcp(self) -> int:
        return self.degrees.dcp

    @property
    def attn_cp(self) -> int:
        return self.degrees.attn_cp

    @property
    def strategy(self) -> str:
        """The prefill split strategy (zigzag when none is named: it only matters under PCP)."""
        return self.degrees.cp_strategy or "zigzag"

    @property
    def world(self) -> int:
        return self.degrees.world_size

    @property
    def attn_tp(self) -> int:
        return self.degrees.attn_tp

    @functools.cached_property
    def _geometry(self) -> list[RankGeometry]:
        return geometry(self.degrees)

    @property
    def me(self) -> RankGeometry:
        return self._geometry[self.rank]

    @property
    def attn_cp_rank(self) -> int:
        return self.me.attn_cp_rank

    @property
    def attn_tp_rank(self) -> int:
        return self.me.attn_tp_rank

    @property
    def dcp_rank(self) -> int:
        return self.me.dcp_rank

    @property
    def pcp(self) -> bool:
        """Prefill context parallelism splits extend rows over the ATTN_CP group."""
        return self.degrees.pcp

    @property
    def attn_dp(self) -> int:
        return self.degrees.attn_dp

    @property
    def attn_dp_rank(self) -> int:
        return self.me.attn_dp_rank

    @property
    def attention_group(self) -> str:
        """The name of the group of this rank's attention-DP rank (its ATTN_CP x ATTN_TP block): the
        whole TP group without attention DP, so that a one-DP-rank server uses the groups it always did."""
        return "tp" if self.attn_dp == 1 else "dp_block"

    def dp_leader(self, dp_rank: int) -> int:
        """The first world rank of attention-DP rank `dp_rank`: the one that speaks for its batch."""
        return dp_rank * self.attn_cp * self.attn_tp

    def problems(self) -> list[str]:
        """Why this layout cannot run on the reference engine (empty when it can)."""
        out = reference_problems(self.degrees)
        if not out and not 0 <= self.rank < self.world:
            out.append(f"rank {self.rank} outside tp {self.tp}")
        return out

    # ------------------------------------------------------------------ groups
    def all_groups(self, name: str) -> list[list[int]]:
        """Every group of kind `name` (world, tp, dcp, attn_cp, attn_tp, pp, dp_block), in creation order."""
        if name == "world":
            return [list(range(self.world))]
        if name == "dp_block":
            block = self.attn_cp * self.attn_tp
            return [list(range(b, b + block)) for b in range(0, self.world, block)]
        seen: dict[tuple[int, ...], None] = {}
        for g in self._geometry:
            seen.setdefault(g.group(name), None)
        return [list(g) for g in seen]

    def group(self, name: str) -> list[int]:
        if name == "world":
            return list(range(self.world))
        if name == "dp_block":
            return next(g for g in self.all_groups(name) if self.rank in g)
        return list(self.me.group(name))

    # ------------------------------------------------------------------ heads
    def q_heads(self, heads: int, rank: int | None = None) -> list[int]:
        """Query heads computed by `rank` (default: this rank): a contiguous attention-TP shard."""
        if heads % self.attn_tp:
            raise ValueError(f"{heads} attention heads cannot be split over attention TP {self.attn_tp}")
        r = self.rank if rank is None else rank
        per = heads // self.attn_tp
        t = r % self.attn_tp
        return list(range(t * per, (t + 1) * per))

    def attn_q_heads(self, heads: int) -> list[int]:
        """Query heads this rank's attention kernel sees: its own, or the DCP group's (gathered)."""
        if self.dcp == 1:
            return self.q_heads(heads)
        return [h for r in self.group("dcp") for h in self.q_heads(heads, r)]

    def kv_heads(self, heads: int, kv_heads: int) -> list[int]:
        """K/V heads this rank computes and stores (see the module docstring)."""
        group = heads // kv_heads
        return sorted({h // group for h in self.attn_q_heads(heads)})

    # ------------------------------------------------------------------ rows
    def owner(self, position: int) -> int:
        """DCP rank that stores K/V of `position` (interleave 1)."""
        return dcp_owner(position, self.dcp)


def pcp_local_rows(extend_lens: list[int], cp: int, strategy: str) -> tuple[bool, list[list[int]]]:
    """(split applies, per CP rank the packed row indices it computes) for an extend batch.

    zigzag: rank r owns blocks r and 2cp-1-r of each request (`topology.zigzag_split`), and falls
    back silently to no split when any extend is shorter than 2cp (SGLang's rule, docs/sglang.md §5);
    interleave: packed index i goes to rank i % cp (needs >= cp rows in the batch).
    """
    total = sum(extend_lens)
    if strategy == "zigzag":
        if not zigzag_applies(extend_lens, cp):
            return False, [list(range(total)) for _ in range(cp)]
        out: list[list[int]] = [[] for _ in range(cp)]
        start = 0
        for n in extend_lens:
            for r, ranges in enumerate(zigzag_split(n, cp)):
                for a, b in ranges:
                    out[r].extend(range(start + a, start + b))
            start += n
        return True, out
    if cp <= 1 or total < cp:
        return False, [list(range(total)) for _ in range(cp)]
    return True, [list(rs) for rs in interleave_split(total, cp)]
