"""Rank groups the checkers judge evidence against, and the one guard for "every rank reported".

Groups come from the evidence first (the probe's `Geometry.groups`: what the engine built), and
only when no rank reported them from the planned degrees, through `cptest.topology.geometry`
(SGLang's numbering), so the planner, the checkers and the reference engine share one
implementation of the layout.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from cptest.evidence import RoleEvidence, Step
from cptest.topology import geometry, group_problems, zigzag_split
from cptest.verdict import Verdict, unknown


def zigzag_blocks(length: int, cp: int, rank: int) -> list[tuple[int, int]]:
    """Half-open offsets (within one extend of `length` tokens) that CP rank `rank` owns, empty
    blocks dropped: `cptest.topology.zigzag_split`, the one implementation of the contract."""
    return [(lo, hi) for lo, hi in zigzag_split(length, cp)[rank] if hi > lo]


def mlp_batch_rows(s: Step, n: int | None) -> tuple[int | None, str]:
    """Of `n` rows that `s`'s MLP took (or put out), those of this rank's own batch, and how to say
    so: `n` itself, or under attention DP, where the MLP runs over the buffer of every DP rank's rows,
    the slice of the buffer this rank's batch filled (`DpBuffer.tokens` at its DP rank)."""
    b = s.dp_buffer
    if b is not None and n == b.rows and s.rank.attn_dp < len(b.tokens):
        mine = b.tokens[s.rank.attn_dp]
        return mine, f"the attention-DP buffer ({b.rows} rows), its DP rank's slice {mine} rows"
    return n, f"{n} rows"


def attention_batch_rows(s: Step, n: int) -> tuple[int, str]:
    """Of `n` rows that `s`'s attention took, those of this rank's own batch, and how to say so: `n`
    itself, or under attention DP, where SGLang pads each DP rank's batch to a multiple of the
    attention TP size (and under `max_len` to the longest DP rank's) before the forward
    (model_executor/forward_batch_info.py:1245-1247, 1291-1297), the batch itself when `n` is exactly
    its DP rank's padded slice (`DpBuffer.padded`) and the slice's real rows are the batch's."""
    b = s.dp_buffer
    d = s.rank.attn_dp
    if b is not None and d < len(b.padded) and n == b.padded[d] != b.tokens[d] == s.rows_in:
        return s.rows_in, (f"{n} rows (its DP rank's padded slice of the attention-DP buffer: "
                           f"{s.rows_in} rows of its batch and {n - s.rows_in} padding)")
    return n, f"{n} rows"


def attention_dp_size(ev: RoleEvidence) -> int:
    """The attention-DP size the role's ranks reported (`Geometry.sizes`), else the planned one."""
    for rank in ev.ranks.values():
        for g in rank.geometry[-1:]:
            if "attn_dp" in g.sizes:
                return g.sizes["attn_dp"]
    return ev.degrees.attn_dp if ev.degrees is not None else 1


def groups(ev: RoleEvidence, name: str) -> tuple[list[list[int]], str]:
    """The `name` groups (tp, dcp, attn_cp) of a server as lists of world ranks, and where they came
    from ("probe" or "plan"). Ranks within a group are in group-rank order."""
    seen: dict[tuple[int, ...], None] = {}
    for rank in ev.ranks.values():
        for g in rank.geometry[-1:]:
            members = g.groups.get(name)
            if members:
                seen[tuple(members)] = None
    if seen:
        return [list(k) for k in sorted(seen)], "probe"
    if ev.degrees is None or group_problems(ev.degrees):
        return [], "plan"
    planned: dict[tuple[int, ...], None] = {}
    for g in geometry(ev.degrees):
        planned.setdefault(g.group(name), None)
    return [list(k) for k in planned], "plan"


def split_unseen(checker: str, role: str, why: str) -> Verdict:
    """The verdict of a row contract where the launch splits prefill rows on a path the probe does
    not hook (`PlanContext.split_unobserved`): the records would read "not split"."""
    return unknown(checker, f"the prefill split of {role} runs where the probe does not look: {why}")


def shard_identity_recorded(s: Step) -> bool:
    """Whether a split step's record says which rows its rank held (`seq_positions`). A shard with
    rows but no identity is positions the probe did not read (CPTEST_PROBE_POSITIONS=0, a split
    whose positions it does not hook), never an empty shard: that one has a logical count of 0."""
    return bool(s.seq_positions) or s.attn_rows == 0


def all_ranks(ev: RoleEvidence, checker: str) -> list[int] | Verdict:
    """Every planned world rank of the role, or the `unknown` verdict saying which one left no
    evidence (a checker that compares all ranks cannot judge a partial set)."""
    if not ev.planned:
        return unknown(checker, f"the plan has no {ev.role} server")
    ranks = list(range(ev.world_size))
    absent = [w for w in ranks if w not in ev.ranks]
    if absent:
        return unknown(checker, f"no evidence from rank {absent[0]} of {ev.role}", missing_ranks=absent)
    return ranks


def steps_by_number(ev: RoleEvidence, group: list[int], keep: Callable[[Step], bool] = lambda s: True
                    ) -> dict[int, dict[int, Step]]:
    """The group's Step records that `keep` accepts, by step number, then by world rank: the ranks of
    a group run the same batches in lockstep, so one step number is one batch on each of them."""
    by_step: dict[int, dict[int, Step]] = defaultdict(dict)
    for world in group:
        for s in ev.ranks[world].steps:
            if keep(s):
                by_step[s.step][world] = s
    return by_step
