"""Rank groups and row layouts the checkers judge evidence against.

Groups come from the evidence first (the probe's `Geometry.groups`: what the engine built), and
only when no rank reported them from the planned topology, with SGLang's numbering
(shared/reference/sglang-cp.md §6; 0.5.17 `distributed/parallel_state.py`): TP blocks contiguous,
DCP contiguous slices of a TP block, ATTN_CP strided by attn_tp inside an attention-DP block.

Row layouts come from `cptest.topology` (pure), so the planner and the checkers share one
implementation of each contract.
"""

from __future__ import annotations

from cptest.checks.load import Archive
from cptest.checks.verdict import Verdict, unknown
from cptest.topology import dcp_owner, zigzag_split

__all__ = ["all_ranks", "dcp_owner", "groups", "zigzag_blocks"]


def zigzag_blocks(length: int, cp: int, rank: int) -> list[tuple[int, int]]:
    """Half-open offsets (within one extend of `length` tokens) that CP rank `rank` owns, empty
    blocks dropped: `cptest.topology.zigzag_split`, the one implementation of the contract."""
    return [(lo, hi) for lo, hi in zigzag_split(length, cp)[rank] if hi > lo]


def _from_topology(archive: Archive, role: str, name: str) -> list[list[int]]:
    server = archive.server(role)
    if server is None:
        return []
    topo = server.topology
    world = server.world_size
    tp = int(topo.get("tp") or world)
    dcp = int(topo.get("dcp") or 1)
    cp = int(topo.get("attn_cp") or 1)
    dp = int(topo.get("attn_dp") or 1)
    attn_tp = max(tp // max(dp * cp, 1), 1)
    blocks = [list(range(b, min(b + tp, world))) for b in range(0, world, tp)]
    if name == "tp":
        return blocks
    if name == "dcp":
        return [blk[i : i + dcp] for blk in blocks for i in range(0, len(blk), dcp)]
    if name == "attn_cp":
        groups = []
        for blk in blocks:
            for d in range(dp):
                for t in range(attn_tp):
                    groups.append(
                        [
                            blk[(d * cp + c) * attn_tp + t]
                            for c in range(cp)
                            if (d * cp + c) * attn_tp + t < len(blk)
                        ]
                    )
        return groups
    raise ValueError(f"unknown group {name!r}")


def groups(archive: Archive, role: str, name: str) -> tuple[list[list[int]], str]:
    """The `name` groups (tp, dcp, attn_cp) of a server as lists of world ranks, and where they came
    from ("probe" or "plan"). Ranks within a group are in group-rank order."""
    seen: dict[tuple[int, ...], None] = {}
    for rank in archive.role(role).ranks.values():
        for g in rank.geometry[-1:]:
            members = g.groups.get(name)
            if members:
                seen[tuple(members)] = None
    if seen:
        return [list(k) for k in sorted(seen)], "probe"
    return _from_topology(archive, role, name), "plan"


def all_ranks(archive: Archive, role: str, checker: str) -> list[int] | Verdict:
    """Every planned world rank of `role`, or the `unknown` verdict saying which one left no
    evidence (a checker that compares all ranks cannot judge a partial set)."""
    server = archive.server(role)
    if server is None:
        return unknown(checker, f"the plan has no {role} server")
    ranks = list(range(server.world_size))
    absent = [w for w in ranks if w not in archive.role(role).ranks]
    if absent:
        return unknown(checker, f"no evidence from rank {absent[0]} of {role}", missing_ranks=absent)
    return ranks
