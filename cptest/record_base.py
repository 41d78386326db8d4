"""What every evidence record shares: the schema version, the record base, the rank a probe record
names, and the position ranges records carry (sorted, merged half-open `[start, end)` pairs, so that
a 100k token prompt is one pair, not 100k integers; the `ranges_*` helpers are the only code that
builds or reads them). `cptest.evidence` re-exports all of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = 8
"""v8: a `steps` line's `layers` may hold one entry per step (`StepBlock.layers`: a decode step
that hooks every layer beside those that hook the first alone); every v1-v7 record reads unchanged.
v7: an extend step's attention-DP buffer as SGLang sized it (`Step.dp_buffer`), optional; every
v1-v6 record reads unchanged.
v6: a step's every layer (`layers`, `layer_rows`), its MLP's output rows, which rows the MLP
saw (`ffn_seq_positions`), the pool rows its KV writes went to and its attention read
(`kv_slots`, `kv_read`; `Step`), all optional; every v1-v5 record reads unchanged.
v5: `pool_sample` records (`PoolSample`); steps of CUDA-graph replays, marked by
`graph_rows` (`Step`, `StepBlock`); every v1-v4 record reads unchanged.
v2: a compact step's `pos` may be packed (base64 of little-endian int32) and its `kv` a string
of 0/1 digits (`Step`). v3: consecutive decode steps over the same requests may be one `steps`
line (`StepBlock`), which the reader expands into its Step records. v4: teacher-forced `score`
records, a request's `output_top`, and the `control` server's records. Every v1-v3 record reads
unchanged."""
Ranges = list[tuple[int, int]]
"""Sorted, disjoint, merged half-open integer ranges."""


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    v: int = SCHEMA_VERSION
    t: float = 0.0
    """Seconds since the writer started (monotonic); for ordering and timing only."""


class RankId(BaseModel):
    """Which rank wrote a record; every probe record carries it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    world: int
    tp: int = 0
    dcp: int = 0
    attn_cp: int = 0
    attn_tp: int = 0
    attn_dp: int = 0
    pid: int = 0


# ---------------------------------------------------------------- position ranges
ARRAY_FROM = 64
"""From this many values, `ranges_from` first asks whether they are one run of consecutive values
(as a prefill's positions are) and `slot_runs_of` cuts them with numpy: a prefill's positions and
pool rows are thousands, and a loop over each value made a prefill step's record take milliseconds
of the engine's thread (the probe finishes it there). Below it, the checks cost more than the loop."""


def ranges_from(values: Iterable[int]) -> Ranges:
    """Sorted merged half-open ranges covering exactly `values`."""
    taken = values if isinstance(values, list) else list(values)
    n = len(taken)
    if n >= ARRAY_FROM and _consecutive(taken):
        return [(taken[0], taken[0] + n)]
    out: Ranges = []
    for v in sorted(set(taken)):
        if out and out[-1][1] == v:
            out[-1] = (out[-1][0], v + 1)
        else:
            out.append((v, v + 1))
    return out


def _consecutive(values: Sequence[int]) -> bool:
    """Whether `values` (not empty) are the ints first, first + 1, ...: one compare of two lists
    at C speed, where a loop takes each value in turn. Anything but a list of ints says no."""
    first = values[0]
    n = len(values)
    return first.__class__ is int and values[-1] - first == n - 1 and values == list(range(first, first + n))


def ranges_merge(ranges: Iterable[tuple[int, int]]) -> Ranges:
    out: Ranges = []
    for a, b in sorted((int(a), int(b)) for a, b in ranges):
        if a >= b:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def ranges_len(ranges: Iterable[tuple[int, int]]) -> int:
    return sum(b - a for a, b in ranges)


def ranges_iter(ranges: Iterable[tuple[int, int]]) -> Iterator[int]:
    for a, b in ranges:
        yield from range(a, b)


def ranges_minus(ranges: Ranges, taken: Ranges) -> Ranges:
    """The parts of merged `ranges` outside merged `taken`."""
    out: Ranges = []
    for lo, hi in ranges:
        for a, b in taken:
            if b <= lo or a >= hi:
                continue
            if a > lo:
                out.append((lo, a))
            lo = max(lo, b)
            if lo >= hi:
                break
        if lo < hi:
            out.append((lo, hi))
    return out


SlotRuns = list[tuple[int, int, int]]
"""`[start, end, slot]` runs over a set of positions (a step's `kv_written` of one request): the
positions of the set in `[start, end)`, in order, are held by rows `slot, slot + 1, ...`. Over the
set, not over every position: a DCP rank holds every dcp-th position in consecutive rows, one run."""


def slot_runs_from(pairs: Iterable[tuple[int, int]]) -> SlotRuns:
    """(position, row) pairs as runs (`SlotRuns`) over the pairs' positions, sorted by position: a
    request's contiguous allocation is one run whatever its length and whichever positions it owns."""
    out: SlotRuns = []
    n = 0  # positions in the last run
    for p, s in sorted(set(pairs)):
        if out and out[-1][2] + n == s:
            out[-1] = (out[-1][0], p + 1, out[-1][2])
            n += 1
        else:
            out.append((p, p + 1, s))
            n = 1
    return out


def slot_runs_of(positions: Sequence[int], slots: Sequence[int]) -> SlotRuns:
    """`slot_runs_from` of the pairs (positions[i], slots[i]) whose position is not negative (a row
    this rank did not write), from lists or numpy arrays of one length. From ARRAY_FROM pairs, one
    run of consecutive positions in consecutive rows is found at once, and any other pairs are cut
    with numpy."""
    n = len(positions)
    if n >= ARRAY_FROM:
        # a request's prefill in one allocation: one run
        if len(slots) == n and _consecutive(positions) and positions[0] >= 0 and _consecutive(slots):
            return [(positions[0], positions[0] + n, slots[0])]
        got = _slot_runs_array(positions, slots)
        if got is not None:
            return got
    return slot_runs_from((p, s) for p, s in zip(positions, slots, strict=True) if p >= 0)


def _slot_runs_array(positions: Sequence[int], slots: Sequence[int]) -> SlotRuns | None:
    """`slot_runs_of` by numpy: the distinct pairs sorted as tuples are (position, then row), a run
    cut where a row is not the last one's plus one. None where numpy cannot hold them as int64."""
    import numpy as np

    try:
        p = np.asarray(positions, dtype=np.int64)
        s = np.asarray(slots, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        return None
    if p.shape != s.shape or p.ndim != 1:
        return None
    keep = p >= 0
    p, s = p[keep], s[keep]
    if not len(p):
        return []
    order = np.lexsort((s, p))
    p, s = p[order], s[order]
    repeat = np.concatenate(([False], (np.diff(p) == 0) & (np.diff(s) == 0)))
    if repeat.any():
        p, s = p[~repeat], s[~repeat]
    cut = np.flatnonzero(np.diff(s) != 1) + 1
    starts = np.concatenate(([0], cut))
    ends = np.concatenate((cut, [len(p)]))
    return list(zip(p[starts].tolist(), (p[ends - 1] + 1).tolist(), s[starts].tolist(), strict=True))


def slot_pairs(runs: Iterable[tuple[int, int, int]], positions: Iterable[tuple[int, int]]
               ) -> list[tuple[int, int]]:
    """The (position, row) pairs of `runs` over `positions` (Ranges, the set the runs were made
    over): what `slot_runs_from` was given."""
    owned = list(ranges_iter(positions))
    out: list[tuple[int, int]] = []
    i = 0
    for start, end, slot in runs:
        while i < len(owned) and owned[i] < start:
            i += 1
        k = 0
        while i < len(owned) and owned[i] < end:
            out.append((owned[i], slot + k))
            i += 1
            k += 1
    return out
