"""Rank layout of a reference server: groups, head shards and row splits (pure, no torch).

The numbering is SGLang's (architecture.md §3, `cptest.topology`): TP blocks contiguous,
`tp_rank = attn_cp_rank * attn_tp + attn_tp_rank` (one attention-DP group), DCP groups contiguous
slices of the TP group with `dcp_rank = tp_rank % dcp`. The reference runs one node, pp 1, attn_dp 1.

Head shards: query heads are split over attention TP (`heads / attn_tp` per rank, contiguous). The
K/V heads a rank *stores* are the ones its attention needs: under DCP the queries of the whole DCP
group are gathered, so every rank of a DCP group stores the K/V heads of the group's query heads
(KV heads replicated within the group, the layout under which DCP is correct, §3 admission); without
DCP, the K/V heads of the rank's own query heads (replicated when kv_heads < attn_tp).
"""

from __future__ import annotations

from dataclasses import dataclass

from cptest.topology import interleave_split, zigzag_applies, zigzag_split

STRATEGIES = ("zigzag", "interleave")


@dataclass(frozen=True)
class Layout:
    """One rank of a reference server. Raises ValueError from `check` on an impossible layout."""

    tp: int
    rank: int
    dcp: int = 1
    attn_cp: int = 1
    prefill_cp: bool = False
    strategy: str = "zigzag"

    # ------------------------------------------------------------------ derived ranks
    @property
    def world(self) -> int:
        return self.tp

    @property
    def attn_tp(self) -> int:
        return self.tp // self.attn_cp

    @property
    def attn_cp_rank(self) -> int:
        return self.rank // self.attn_tp

    @property
    def attn_tp_rank(self) -> int:
        return self.rank % self.attn_tp

    @property
    def dcp_rank(self) -> int:
        return self.rank % self.dcp

    @property
    def pcp(self) -> bool:
        """Prefill context parallelism splits extend rows over the ATTN_CP group."""
        return self.prefill_cp and self.attn_cp > 1

    def problems(self) -> list[str]:
        """Why this layout cannot run on the reference engine (empty when it can)."""
        out = []
        if self.tp < 1 or not 0 <= self.rank < self.tp:
            out.append(f"rank {self.rank} outside tp {self.tp}")
        if self.dcp < 1 or self.tp % self.dcp:
            out.append(f"tp {self.tp} is not a multiple of dcp {self.dcp}")
        if self.attn_cp < 1 or self.tp % self.attn_cp:
            out.append(f"tp {self.tp} is not a multiple of attn_cp {self.attn_cp}")
        if self.dcp > 1 and self.attn_cp > 1:
            out.append("--dcp-size > 1 does not support --enable-prefill-cp (PCP with DCP is not a contract "
                       "of the reference engine)")
        if self.strategy not in STRATEGIES:
            out.append(f"unknown cp strategy {self.strategy!r} (known: zigzag, interleave)")
        return out

    # ------------------------------------------------------------------ groups
    def all_groups(self, name: str) -> list[list[int]]:
        """Every group of kind `name` (world, tp, dcp, attn_cp, attn_tp, pp), in creation order."""
        ranks = list(range(self.tp))
        if name in ("world", "tp"):
            return [ranks]
        if name == "pp":
            return [[r] for r in ranks]
        if name == "dcp":
            return [ranks[i : i + self.dcp] for i in range(0, self.tp, self.dcp)]
        if name == "attn_cp":
            return [[c * self.attn_tp + t for c in range(self.attn_cp)] for t in range(self.attn_tp)]
        if name == "attn_tp":
            return [[c * self.attn_tp + t for t in range(self.attn_tp)] for c in range(self.attn_cp)]
        raise ValueError(f"unknown group {name!r}")

    def group(self, name: str) -> list[int]:
        return next(g for g in self.all_groups(name) if self.rank in g)

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
        return position % self.dcp


def pcp_local_rows(extend_lens: list[int], cp: int, strategy: str) -> tuple[bool, list[list[int]]]:
    """(split applies, per CP rank the packed row indices it computes) for an extend batch.

    zigzag: rank r owns blocks r and 2cp-1-r of each request (`topology.zigzag_split`), and falls
    back silently to no split when any extend is shorter than 2cp (SGLang's rule, sglang-cp.md §5);
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
