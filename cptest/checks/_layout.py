"""Rank groups and row layouts the checkers judge evidence against.

Groups come from the evidence first (the probe's `Geometry.groups`: what the engine built), and
only when no rank reported them from the planned topology, with SGLang's numbering
(shared/reference/sglang-cp.md §6; 0.5.17 `distributed/parallel_state.py`): TP blocks contiguous,
DCP contiguous slices of a TP block, ATTN_CP strided by attn_tp inside an attention-DP block.

`zigzag_blocks` and `dcp_owner` are private equivalents of `cptest.topology`'s helpers, kept here
so that checks do not depend on the planner's module (0.5.17 `layers/cp/zigzag.py:150-160`).
"""

from __future__ import annotations

from cptest.checks.load import Archive


def zigzag_blocks(length: int, cp: int, rank: int) -> list[tuple[int, int]]:
    """Half-open offsets (within one extend of `length` tokens) that CP rank `rank` owns: blocks
    `rank` and `2cp-1-rank` of `2cp` blocks whose sizes differ by at most one, larger ones first."""
    n = 2 * cp
    base, rem = divmod(length, n)
    sizes = [base + 1 if b < rem else base for b in range(n)]
    starts = [0]
    for s in sizes:
        starts.append(starts[-1] + s)
    out = []
    for b in sorted({rank, n - 1 - rank}):
        if sizes[b]:
            out.append((starts[b], starts[b + 1]))
    return out


def dcp_owner(position: int, dcp: int, interleave: int = 1) -> int:
    """The DCP rank that writes K/V of `position` (layers/dcp/layout.py: slot % dcp, pages aligned)."""
    return (position // interleave) % dcp


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
