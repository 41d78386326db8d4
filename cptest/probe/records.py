"""Pure record builders for the probe: plain values in, `cptest.evidence` records out.

Nothing here imports torch or SGLang, reads the clock or touches files; the hook adapters
(`cptest.probe.hooks`, `steps`, `copy_batches`) pull plain values (ints, lists, strings) out of
SGLang objects and pass them here. That keeps every decision about *what* a record says testable
on a CPU.
"""

from __future__ import annotations

import json
import re
import sys
from binascii import b2a_base64
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Literal, Protocol

from cptest.evidence import (
    SCHEMA_VERSION,
    Capacity,
    Geometry,
    Graph,
    KvPool,
    Ranges,
    RankId,
    SlotRuns,
    Step,
    ranges_from,
    ranges_merge,
    slot_runs_of,
)
from cptest.rank_records import KV_WRITE_UNMAPPED, DpBuffer, LayerPart

StepMode = Literal["extend", "decode", "mixed", "idle", "other"]

MODE_NAMES: dict[str, StepMode] = {
    "EXTEND": "extend",
    "DECODE": "decode",
    "MIXED": "mixed",
    "IDLE": "idle",
}
"""SGLang `ForwardMode` member name -> Step.mode (model_executor/forward_batch_info.py:98 of the
pinned release). TARGET_VERIFY, DRAFT_EXTEND_V2, SPLIT_PREFILL, DLLM_EXTEND, PREBUILT map to "other"."""


class GroupLike(Protocol):
    """What the probe reads from an SGLang `GroupCoordinator` (distributed/parallel_state.py:221)."""

    ranks: list[int]
    rank_in_group: int
    world_size: int


def mode_of(forward_mode_name: str) -> StepMode:
    return MODE_NAMES.get(forward_mode_name.upper(), "other")


def geometry(
    *,
    world_rank: int,
    groups: Mapping[str, GroupLike | None],
    pid: int,
    gpu: int | None,
    hostname: str,
    t: float,
) -> tuple[RankId, Geometry]:
    """Geometry of one rank from its process groups as SGLang built them.

    `groups` maps our group names (world, tp, dcp, attn_cp, attn_tp, pp) to the coordinator or
    None when SGLang did not build it (the pinned release leaves `_DCP` None unless dcp_size > 1,
    parallel_state.py:2337). A missing group is recorded as size 1 with this rank alone.
    attn_dp is derived, not read: `tp_rank = (attn_dp*attn_cp + attn_cp_rank)*attn_tp + attn_tp_rank`
    (parallel_state.py:2357-2359), so attn_dp = tp_rank // (attn_cp*attn_tp).
    """
    sizes: dict[str, int] = {}
    ranks_of: dict[str, list[int]] = {}
    rank_in: dict[str, int] = {}
    for name in ("world", "tp", "dcp", "attn_cp", "attn_tp", "pp"):
        g = groups.get(name)
        if g is None:
            sizes[name] = 1
            ranks_of[name] = [world_rank]
            rank_in[name] = 0
        else:
            ranks_of[name] = [int(r) for r in g.ranks]
            sizes[name] = int(g.world_size)
            rank_in[name] = int(g.rank_in_group)
    tp_rank = rank_in["tp"]
    cp_tp = sizes["attn_cp"] * sizes["attn_tp"]
    sizes["attn_dp"] = max(sizes["tp"] // cp_tp, 1) if cp_tp else 1
    attn_dp_rank = tp_rank // cp_tp if cp_tp else 0
    rank = RankId(
        world=world_rank,
        tp=tp_rank,
        dcp=rank_in["dcp"],
        attn_cp=rank_in["attn_cp"],
        attn_tp=rank_in["attn_tp"],
        attn_dp=attn_dp_rank,
        pid=pid,
    )
    return rank, Geometry(t=t, rank=rank, sizes=sizes, groups=ranks_of, gpu=gpu, hostname=hostname)


def kv_pool(
    *,
    rank: RankId,
    t: float,
    rows: int,
    allocator_size: int | None,
    page_size: int | None,
    allocator_page_size: int | None,
    head_num: int | None,
    head_dim: int | None,
    layer_num: int | None,
    dtype: str,
) -> KvPool:
    return KvPool(
        t=t,
        rank=rank,
        rows=rows,
        allocator_size=allocator_size,
        page_size=page_size,
        allocator_page_size=allocator_page_size,
        head_num=head_num,
        head_dim=head_dim,
        layer_num=layer_num,
        dtype=dtype.removeprefix("torch."),
    )


def capacity(
    *, rank: RankId, t: float, max_total_num_tokens: int, max_running_requests: int | None,
    context_len: int | None,
) -> Capacity:
    return Capacity(
        t=t,
        rank=rank,
        max_total_num_tokens=max_total_num_tokens,
        max_running_requests=max_running_requests,
        context_len=context_len,
    )


# ---------------------------------------------------------------- per-step evidence
@dataclass(slots=True)
class StepDraft:
    """What the hooks of one forward step collect before the step's record is written.

    Opened when `ModelRunner.forward` is entered, filled by the inner hooks (CP split, KV write,
    `--forward-hooks`), turned into a `Step` by `finish_step` when the forward returns eagerly.
    The probe reuses drafts (`StepDraft.__init__` on a finished one): a draft lives until its
    copies arrive, a dozen steps, long enough for Python's collector to move a fresh one to its
    oldest generation every step, and every such move brings the next full collection of the
    whole engine process closer.
    """

    step: int
    mode: StepMode
    batch_size: int
    rows_in: int
    rids: list[str]
    extend_lens: list[int] | None = None
    prefix_lens: list[int] | None = None
    cp_configured: bool | None = None
    """True when a PCP strategy is bound in this process; None when unknown."""
    cp_active: bool = False
    cp_rank: int = 0
    cp_logical_rows: list[int] | None = None
    """Per CP rank logical (unpadded) token counts from the CP metadata."""
    cp_local_positions: dict[str, list[int]] | None = None
    """Request id -> positions of this rank's rows after the PCP split (observed)."""
    attn_rows_seen: int | None = None
    """Rows entering the first layer's attention, as its forward hook saw them."""
    ffn_rows: int | None = None
    ffn_out_rows: int | None = None
    logits_rows: int | None = None
    attn_layers: int = 0
    """Layers whose attention hook fired so far in this step (the next one's index)."""
    attn_layer_id: int | None = None
    """The layer id of the attention module whose hook fired last in this step (None: not known)."""
    ffn_layers: int = 0
    """Layers whose MLP hook fired so far in this step."""
    layer_rows: dict[LayerPart, list[int]] | None = None
    """Per-layer counts of the parts whose count changed between layers (`Step.layer_rows`)."""
    kv_slots: Any = None
    """This rank's pool row of each row of the batch (SGLang's `out_cache_loc`, divided by the DCP
    size), once its host copy arrived; None when not observed."""
    read_lens: list[int] | None = None
    """The length of each request of `read_rids` as this step's attention reads it (SGLang's
    `seq_lens_cpu`), when the step records its reads (a sampled eager decode step); the block-table
    rows travel as a tensor."""
    read_rids: list[str] | None = None
    """The requests whose reads this step records (consecutive ones of the batch, `read_lens` each)."""
    kv_read: dict[str, Ranges] | None = None
    """Request id -> this rank's pool rows its attention read, once the block-table rows arrived."""
    kv_rows: int | None = None
    """Rows handed to the KV pool's write in the first layer of this step."""
    kv_at_loc: bool = False
    """The write kept its rows at the allocator's slot itself, not slot // dcp (MLA's
    `set_kv_buffer` under DCP): the step's slots are not recorded."""
    kv_mask: list[bool] | None = None
    """The DCP owner mask SGLang passed to that write (True = this rank stores the row)."""
    graph_rows: int | None = None
    """Rows the CUDA graph ran, when this step is a replay (None: eager; see `Step.graph_rows`)."""
    dp_buffer: DpBuffer | None = None
    """The attention-DP buffer the step's forward batch sized (`Step.dp_buffer`); set on eager
    steps under attention DP only."""
    notes: list[str] | None = None
    """Why parts of the record are missing; made on the first note (most steps have none)."""
    kv_mask_pending: Any = None
    """The mask tensor as SGLang passed it, until the probe copies it (then into kv_mask)."""
    split_pending: Any = None
    """The sharded positions tensor and what cutting them needs (the logical rows to keep, the
    split's layout: `ZigzagLayout` or `StrideLayout`), until the probe copies it (then into
    cp_local_positions). Plain fields, not callbacks: a closure over the draft would make a
    reference cycle per step, left to the garbage collector."""
    t: float = 0.0
    """The probe's clock when the forward returned (the record's `t` is `Probe.now` of it, made
    with the batch's records: copy_batches._record_t)."""
    first: int = 0
    """Index of the step's first tensor in its CopyBatch."""
    which: tuple[str, ...] = ()
    """What the step's tensors in its CopyBatch are, in order (positions, kv_mask, split, ...)."""

    def note(self, message: str) -> None:
        if self.notes is None:
            self.notes = []
        self.notes.append(message)


def dp_buffer(fb: Any) -> DpBuffer | None:
    """The attention-DP buffer of an eager forward batch, once `prepare_mlp_sync_batch`
    (model_executor/forward_batch_info.py:1229-1311) sized it: None where the batch carries no
    DP sizing (no attention DP: `global_dp_buffer_len` stays None) or its lists do not fit."""
    rows = getattr(fb, "global_dp_buffer_len", None)
    tokens = getattr(fb, "original_global_num_tokens_cpu", None)
    padded = getattr(fb, "global_num_tokens_cpu", None)
    if rows is None or tokens is None or padded is None or len(tokens) != len(padded) or len(tokens) < 2:
        return None
    mode = getattr(getattr(fb, "dp_padding_mode", None), "name", None)
    return DpBuffer(tokens=[int(n) for n in tokens], padded=[int(n) for n in padded], rows=int(rows),
                    mode=mode.lower() if mode in ("SUM_LEN", "MAX_LEN") else None)


def request_lens(
    n_positions: int, rids: Sequence[str], extend_lens: Sequence[int] | None, mode: StepMode
) -> list[int] | None:
    """Rows per request of a packed batch, or None when they cannot be known.

    Extend and mixed batches are packed request after request with `extend_seq_lens_cpu` rows each
    (forward_batch_info.py:535-536); a decode batch has one row per request.
    """
    if extend_lens is not None and len(extend_lens) == len(rids) and sum(extend_lens) == n_positions:
        return [int(n) for n in extend_lens]
    if mode == "decode" and n_positions == len(rids):
        return [1] * len(rids)
    return None


def split_per_request(
    values: Sequence[int], rids: Sequence[str], lens: Sequence[int]
) -> dict[str, list[int]]:
    """Cut a packed per-row list into one list per request (rows of a repeated rid are joined)."""
    out: dict[str, list[int]] = {}
    at = 0
    for rid, n in zip(rids, lens, strict=True):
        out.setdefault(rid, []).extend(values[at : at + n])
        at += n
    return out


@dataclass(frozen=True, slots=True)
class ZigzagLayout:
    """A rank's share of a prefill split by blocks (`split_zigzag_local`): zigzag on CP v2, and every
    model's own CP-v1 split, which uses the same metadata."""

    split_list: list[int]
    zigzag_index: list[int]


@dataclass(frozen=True, slots=True)
class StrideLayout:
    """A rank's share of a prefill split by stride (`split_stride_local`): interleave on CP v2."""

    rank: int
    cp: int


SplitLayout = ZigzagLayout | StrideLayout


def split_local(local_positions: Sequence[int], layout: SplitLayout, rids: Sequence[str],
                extend_lens: Sequence[int] | None) -> dict[str, list[int]] | None:
    """This rank's positions after a prefill split, per request, read by the split's layout; None
    when they do not fit it."""
    if isinstance(layout, ZigzagLayout):
        return split_zigzag_local(local_positions, layout.split_list, layout.zigzag_index, rids)
    if extend_lens is None:
        return None
    return split_stride_local(local_positions, layout.rank, layout.cp, rids, extend_lens)


def split_stride_local(local_positions: Sequence[int], rank: int, cp: int, rids: Sequence[str],
                       extend_lens: Sequence[int]) -> dict[str, list[int]] | None:
    """This rank's positions after an interleave PCP split, per request, or None when they do not fit.

    SGLang's interleave strategy gives CP rank `rank` the batch's packed extend tokens `rank`,
    `rank + cp`, ... (`InterleaveCPStrategy._interleave_shard`, layers/cp/interleave.py:108-123 of the
    pinned release): the j-th local row is packed token `rank + j * cp`, which belongs to the request
    whose extend holds it.
    """
    if len(extend_lens) != len(rids) or cp < 1 or not 0 <= rank < cp:
        return None
    ends = list(accumulate(int(n) for n in extend_lens))  # each request's packed end
    out: dict[str, list[int]] = {rid: [] for rid in rids}
    for j, pos in enumerate(local_positions):
        packed = rank + j * cp
        if not ends or packed >= ends[-1]:
            return None
        out[rids[bisect_right(ends, packed)]].append(pos)
    return out


def split_zigzag_local(
    local_positions: Sequence[int], split_list: Sequence[int], zigzag_index: Sequence[int],
    rids: Sequence[str],
) -> dict[str, list[int]] | None:
    """This rank's positions after a zigzag PCP split, per request, or None when they do not fit.

    SGLang's zigzag metadata (layers/cp/zigzag.py:121-200 of the pinned release) cuts each request's extend
    tokens into 2*cp blocks (`split_list`, request-major) and a rank takes the blocks listed in
    `zigzag_index` in that order (`shard_position_ids`, zigzag.py:308-313), padding at the end.
    Block k belongs to request k // (2*cp).
    """
    bs = len(rids)
    if bs == 0 or len(split_list) % bs:
        return None
    seg = len(split_list) // bs
    out: dict[str, list[int]] = {rid: [] for rid in rids}
    at = 0
    for k in zigzag_index:
        if not 0 <= k < len(split_list):
            return None
        n = int(split_list[k])
        if at + n > len(local_positions):
            return None
        out[rids[k // seg]].extend(local_positions[at : at + n])
        at += n
    return out


def finish_step(draft: StepDraft, *, rank: RankId, t: float, positions: Sequence[int] | None) -> Step:
    """The Step record of an eager forward from its draft and the batch's (full) positions.

    Attention rows and their positions: under an active PCP split, this rank's share from the CP
    metadata (logical rows, padding excluded) and the observed sharded positions; otherwise every
    row of the batch. KV positions written: the rows whose DCP owner mask was true when SGLang
    passed one to the pool write, all rows when the write took the whole batch, and nothing
    (the request is absent from `kv_written`, a note says why) when the write was not seen or its
    size does not match the batch.
    """
    lens = None
    per_req = None
    if positions is not None:
        lens = request_lens(len(positions), draft.rids, draft.extend_lens, draft.mode)
        per_req = split_per_request(positions, draft.rids, lens) if lens is not None else None
    if positions is not None and lens is None and draft.rids:
        draft.note(
            f"step {draft.step}: could not cut {len(positions)} positions into {len(draft.rids)} requests"
        )

    attn_rows: int | None
    seq_positions: dict[str, Ranges] = {}
    if draft.cp_active:
        logical = draft.cp_logical_rows
        attn_rows = logical[draft.cp_rank] if logical and draft.cp_rank < len(logical) else None
        if draft.cp_local_positions is not None:
            seq_positions = {rid: ranges_from(p) for rid, p in draft.cp_local_positions.items()}
        else:
            draft.note(f"step {draft.step}: PCP active but the sharded positions were not seen")
    else:
        attn_rows = draft.attn_rows_seen  # None unless the --forward-hooks attention hook saw it
        if per_req is not None:
            seq_positions = {rid: ranges_from(p) for rid, p in per_req.items()}

    kv_written: dict[str, Ranges] = {}
    kv_slots: dict[str, SlotRuns] = {}
    if per_req is not None and positions is not None and lens is not None:
        _drop_dp_padding(draft, len(positions), rank.attn_dp)
        source = _kv_source(draft, len(positions))
        owned: list[int] = []
        if source == "mask":
            owned = [p if m else -1 for p, m in zip(positions, draft.kv_mask or (), strict=True)]
        elif source == "all":
            owned = list(positions)
        if owned:
            kv_written = {
                rid: ranges_from(ps if min(ps, default=0) >= 0 else [p for p in ps if p >= 0])
                for rid, ps in split_per_request(owned, draft.rids, lens).items()
            }
            kv_slots = _kv_slots(draft, owned, lens)
    elif draft.kv_rows is None:
        _kv_source(draft, 0)  # notes that no KV write was seen

    all_local: list[tuple[int, int]] = [r for rs in seq_positions.values() for r in rs]
    return Step(
        t=t,
        rank=rank,
        step=draft.step,
        mode=draft.mode,
        batch_size=draft.batch_size,
        rows_in=draft.rows_in,
        attn_rows=attn_rows,
        ffn_rows=draft.ffn_rows,
        logits_rows=draft.logits_rows,
        cp_active=None if draft.cp_configured is None else (draft.cp_active and draft.cp_configured),
        positions=ranges_merge(all_local),
        seq_positions=seq_positions,
        kv_written=kv_written,
        extend_lens=list(draft.extend_lens or []),
        prefix_lens=list(draft.prefix_lens or []),
        graph_rows=draft.graph_rows,
        ffn_out_rows=draft.ffn_out_rows,
        layers=draft.attn_layers or None,
        layer_rows=draft.layer_rows,
        ffn_seq_positions=_ffn_rows_of(draft, draft.ffn_rows, attn_rows, per_req, "entering"),
        ffn_out_seq_positions=_ffn_rows_of(draft, draft.ffn_out_rows, attn_rows, per_req, "leaving"),
        kv_slots=kv_slots,
        kv_read=draft.kv_read or {},
        dp_buffer=draft.dp_buffer,
        attn_rows_padded=(draft.attn_rows_seen if draft.cp_active and draft.attn_rows_seen is not None
                          and draft.attn_rows_seen != attn_rows else None),
    )


def _drop_dp_padding(draft: StepDraft, n_rows: int, dp_rank: int) -> None:
    """Cut the KV write's per-row values (mask, slots) back to the batch's `n_rows` rows where
    attention DP padded the batch: the write took this DP rank's padded slice (`DpBuffer.padded`),
    whose dummy rows SGLang appends after the real ones (forward_batch_info.py:1459-1462), while
    the positions read at the forward's end are already cut back (forward_batch_info.py:1547-1553)."""
    b = draft.dp_buffer
    if (b is None or draft.kv_rows is None or dp_rank >= len(b.padded) or draft.kv_rows != b.padded[dp_rank]
            or b.tokens[dp_rank] != n_rows or n_rows >= draft.kv_rows):
        return
    draft.kv_rows = n_rows
    if draft.kv_mask is not None:
        draft.kv_mask = draft.kv_mask[:n_rows]
    if draft.kv_slots is not None:
        draft.kv_slots = draft.kv_slots[:n_rows]


def _kv_slots(draft: StepDraft, owned: Sequence[int], lens: Sequence[int]) -> dict[str, SlotRuns]:
    """Request id -> the runs of pool rows the rows this rank wrote went to (`Step.kv_slots`):
    `owned` holds each batch row's position, or -1 for a row not written here."""
    slots = draft.kv_slots
    if slots is None:
        return {}
    slots = slots.tolist() if hasattr(slots, "tolist") else list(slots)
    if len(slots) != len(owned):
        draft.note(f"step {draft.step}: {len(slots)} KV slots for {len(owned)} rows; kv_slots left empty")
        return {}
    rows: dict[str, tuple[list[int], list[int]]] = {}
    at = 0
    for rid, n in zip(draft.rids, lens, strict=True):
        mine = rows.setdefault(rid, ([], []))
        mine[0].extend(owned[at:at + n])
        mine[1].extend(slots[at:at + n])
        at += n
    return {rid: runs for rid, (ps, ss) in rows.items() if (runs := slot_runs_of(ps, ss))}


def read_rows(table: Any, lens: Sequence[int], rids: Sequence[str], dcp: int, dcp_rank: int,
              note: Any = None) -> dict[str, Ranges] | None:
    """Request id -> the rows of this rank's pool a decode step's attention reads (`Step.kv_read`),
    from the requests' block-table rows (`table`: a numpy view of SGLang's `req_to_token` rows of the
    batch, cut to the longest length, one after another) and their lengths: the rank's share is the
    positions p % dcp == dcp_rank, each at pool row `req_to_token[p] // dcp`, as the pinned release
    builds a DCP rank's KV indices (the kernel `create_triton_kv_indices_for_dcp_triton`). None,
    noted, when the rows do not fit the lengths.

    These numpy calls run on the engine's thread, as its batch is finished: a few requests go one at
    a time (a handful of calls each), more go all at once (a dozen calls in all, `_read_all`), since
    a dozen calls per request of 64 took most of a millisecond."""
    n = len(rids)
    width = len(table) // n if n else 0
    if n == 0 or width * n != len(table) or len(lens) != n or max(lens, default=0) > width:
        if note is not None:
            note(f"{len(table)} block-table values for {n} requests of lengths {list(lens)[:4]}...; "
                 "kv_read left empty")
        return None
    np = sys.modules["numpy"]  # the host copy is numpy's: torch put it there
    rows = table.reshape(n, width)
    every = _read_all(np, rows, lens, rids, dcp, dcp_rank) if n > READ_ONE_AT_A_TIME else None
    return every if every is not None else _read_each(np, rows, lens, rids, dcp, dcp_rank)


READ_ONE_AT_A_TIME = 8
"""Up to this many requests `read_rows` reads one at a time: fewer passes over their rows than
reading all at once, which pays off from a few more (`benchmarks/read_rows.py` prints both)."""


def _read_each(np: Any, table: Any, lens: Sequence[int], rids: Sequence[str], dcp: int,
               dcp_rank: int) -> dict[str, Ranges]:
    """`read_rows` one request at a time (`table`: their rows, one per request)."""
    out: dict[str, Ranges] = {}
    for rid, row, length in zip(rids, table, lens, strict=True):
        share = row[:length][dcp_rank::dcp] // dcp if dcp > 1 else row[:length]
        if len(share):
            out[str(rid)] = _array_ranges(np, share)
    return out


def _read_all(np: Any, table: Any, lens: Sequence[int], rids: Sequence[str], dcp: int,
              dcp_rank: int) -> dict[str, Ranges] | None:
    """`read_rows` of every request at once (`table`: their rows, one per request); None where a
    pool row is negative, which the keys below cannot hold (no pool row is; `_read_each` can)."""
    n = len(rids)
    rows = table[:, dcp_rank::dcp] if dcp > 1 else table
    # column j of the share holds position j * dcp + dcp_rank: read while it is under the length
    positions = np.arange(rows.shape[1]) * dcp + dcp_rank
    read = positions[None, :] < np.asarray(lens)[:, None]
    values = rows[read] // dcp if dcp > 1 else rows[read]
    if not len(values):
        return {}
    if values.min() < 0:
        return None
    request = np.nonzero(read)[0]
    span = int(values.max()) + 2  # keys of one request never touch the next request's
    keys = _sorted_once(np, request.astype(np.int64) * span + values)  # by request, then row
    of, value = keys // span, keys % span
    breaks = np.flatnonzero((np.diff(value) != 1) | (np.diff(of) != 0)) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [len(keys)]))
    lo, hi = value[starts].tolist(), (value[ends - 1] + 1).tolist()
    bounds = np.searchsorted(of[starts], np.arange(n + 1)).tolist()
    return {str(rids[k]): list(zip(lo[bounds[k]:bounds[k + 1]], hi[bounds[k]:bounds[k + 1]], strict=True))
            for k in range(n) if bounds[k] < bounds[k + 1]}


def _sorted_once(np: Any, values: Any) -> Any:
    """The values sorted, each once: `np.unique`'s result, by a sort and a comparison. numpy 2's
    `unique` takes several times as long on a sampled step's few thousand rows
    (`benchmarks/read_rows.py`)."""
    v = np.sort(values)
    return v[np.concatenate(([True], v[1:] != v[:-1]))] if len(v) else v


def _array_ranges(np: Any, values: Any) -> Ranges:
    """`ranges_from` of a numpy array, without a Python object per value."""
    v = _sorted_once(np, values)  # each row once (as ranges_from's set)
    breaks = np.flatnonzero(np.diff(v) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [len(v)]))
    return list(zip(v[starts].tolist(), (v[ends - 1] + 1).tolist(), strict=True))


def _ffn_rows_of(draft: StepDraft, rows: int | None, attn_rows: int | None,
                 per_req: dict[str, list[int]] | None, side: str) -> dict[str, Ranges] | None:
    """Which rows the MLP saw, from their count (`Step.ffn_seq_positions`): None when they are the
    attention rows (as counted, or as the attention hook saw them, padding included) or were not
    seen; the whole batch's, per request, when a PCP step's MLP runs over the rows gathered back.
    A count that fits neither is noted and left None: the rows cannot be named."""
    if rows is None or rows == attn_rows or rows == draft.attn_rows_seen:
        return None
    if draft.cp_active and per_req is not None and rows == sum(len(p) for p in per_req.values()):
        return {rid: ranges_from(p) for rid, p in per_req.items()}
    draft.note(f"step {draft.step}: {rows} rows {side} the MLP are neither the attention's nor the "
               "batch's; their positions are not recorded")
    return None


def _kv_source(draft: StepDraft, n_rows: int, mask_len: int | None = -1) -> Literal["mask", "all"] | None:
    """How the step's first-layer KV write maps onto its `n_rows` rows: row by row through the DCP
    owner mask, all of them, or none (the write was not seen or does not fit; a note says which).
    `mask_len` is the mask's length when the caller knows it without the mask (None: no mask)."""
    if mask_len == -1:
        mask_len = None if draft.kv_mask is None else len(draft.kv_mask)
    source, note = kv_source_of(draft.mode, draft.step, draft.graph_rows, draft.kv_rows, n_rows, mask_len)
    if note is not None:
        draft.note(note)
    return source


def kv_source_of(mode: StepMode, step: int, graph_rows: int | None, kv_rows: int | None, n_rows: int,
                 mask_len: int | None) -> tuple[Literal["mask", "all"] | None, str | None]:
    """`_kv_source` from plain values: the source, and the note to make when it is none."""
    if graph_rows is not None:
        return None, None  # a replay: the write ran inside the graph, unobserved (not missing: no note)
    if kv_rows is None:
        if mode in ("extend", "decode", "mixed"):
            return None, f"step {step}: no KV write seen; {KV_WRITE_UNMAPPED}"
        return None, None
    if mask_len is not None and mask_len == n_rows:
        return "mask", None
    if mask_len is None and kv_rows == n_rows:
        return "all", None
    return None, (f"step {step}: KV write of {kv_rows} rows "
                  f"(mask {'of ' + str(mask_len) if mask_len is not None else 'none'}) "
                  f"does not match the batch's {n_rows} rows; {KV_WRITE_UNMAPPED}")


class RidText:
    """The JSON text of a step's request ids, kept while consecutive steps carry the same ones.

    A decode batch keeps its requests for many steps; comparing the list is much cheaper than
    checking and joining the ids again (SGLang passes the same string objects each step).
    """

    def __init__(self) -> None:
        self._rids: list[str] | None = None
        self._text: str | None = None
        self._distinct = False

    def of(self, rids: list[str], *, distinct: bool = False) -> str | None:
        """`"a","b"` for plain ids, None when an id would need escaping in JSON (or, with
        `distinct`, when an id repeats)."""
        if rids != self._rids:
            self._rids = list(rids)
            self._distinct = len(set(rids)) == len(rids)
            try:
                self._text = _QUOTED_COMMA.join(rids) if _PLAIN.fullmatch("".join(rids)) else None
            except TypeError:  # not all str: the general way converts them
                self._text = None
        return None if distinct and not self._distinct else self._text


def finish_step_line(draft: StepDraft, *, rank: RankId, rank_json: str, t: float,
                     positions: Sequence[int] | None, rid_text: RidText | None = None) -> str:
    """The JSON line of `finish_step(...)`, in the Step's compact form where that applies.

    The compact form (`rows`, see `cptest.evidence.Step`) covers a step of one row per distinct
    request (decode) with plain request ids; it is built with a few C-level joins, because it runs
    on the engine's thread once per step. Positions and the DCP mask given as numpy arrays (the
    probe's host copies) are packed (`_packed_pos`, `_digits`): turning 2 x 64 numbers into
    decimal text was most of the probe's cost per decode step. Anything else goes the general way.
    `rank_json` is `rank.model_dump_json()`, made once per process; `rid_text` the caller's RidText,
    if it keeps one.
    """
    rids = draft.rids
    one_each = False
    if (positions is not None and not draft.cp_active and len(rids) == len(positions) and rids
            and draft.layer_rows is None and draft.kv_slots is None and draft.kv_read is None
            and draft.dp_buffer is None):
        if draft.mode == "decode" and draft.extend_lens is None:
            one_each = True  # a decode batch: one row per request (request_lens)
        else:
            lens = request_lens(len(positions), rids, draft.extend_lens, draft.mode)
            one_each = lens is not None and lens.count(1) == len(lens)
    quoted = (rid_text or RidText()).of(rids, distinct=True) if one_each else None
    if quoted is None:
        draft.rids = [r if isinstance(r, str) else str(r) for r in rids]
        if hasattr(draft.kv_mask, "tolist"):
            draft.kv_mask = draft.kv_mask.tolist()
        positions = positions.tolist() if hasattr(positions, "tolist") else positions
        return finish_step(draft, rank=rank, t=t, positions=positions).model_dump_json()
    source = _kv_source(draft, len(positions))
    if source == "mask":
        mask = draft.kv_mask
        kv = _digits(mask) if hasattr(mask, "astype") else f'[{",".join(map(str, map(int, mask or ())))}]'
    else:
        kv = '"all"' if source == "all" else "null"
    cp = "null" if draft.cp_configured is None else "false"  # cp_active is False on this path
    pos = _packed_pos(positions) if hasattr(positions, "astype") else f'[{",".join(map(str, positions))}]'
    return (
        f'{{"v":{SCHEMA_VERSION},"t":{float(t)!r},"kind":"step","rank":{rank_json},"step":{int(draft.step)},'
        f'"mode":"{draft.mode}","batch_size":{int(draft.batch_size)},"rows_in":{int(draft.rows_in)},'
        f'"attn_rows":{_json_int(draft.attn_rows_seen)},"ffn_rows":{_json_int(draft.ffn_rows)},'
        f'"logits_rows":{_json_int(draft.logits_rows)},"cp_active":{cp},'
        f'"rows":{{"rids":["{quoted}"],"pos":{pos},"kv":{kv}}},'
        f'"extend_lens":[{",".join(map(str, draft.extend_lens or []))}],'
        f'"prefix_lens":[{",".join(map(str, draft.prefix_lens or []))}]'
        + ("" if draft.graph_rows is None else f',"graph_rows":{int(draft.graph_rows)}')
        + ("" if draft.ffn_out_rows is None else f',"ffn_out_rows":{int(draft.ffn_out_rows)}')
        + ("}" if not draft.attn_layers else f',"layers":{int(draft.attn_layers)}}}')
    )


def steps_block_line(*, t: Sequence[float], step: Sequence[int], rows_in: Sequence[int],
                     attn_rows: Sequence[int | None], ffn_rows: Sequence[int | None],
                     logits_rows: Sequence[int | None], cp_configured: bool | None, graph_rows: int | None,
                     rank_json: str, quoted: str, positions: Any, kv: Literal["mask", "all"] | None,
                     mask: Any = None, ffn_out_rows: Sequence[int | None] | None = None,
                     layers: Sequence[int] | None = None, slots: Any = None) -> str:
    """The JSON line of a `StepBlock`: decode steps over the same requests (`quoted`, from
    `RidText.of`), their values as columns of one entry per step (ints, and None for a row count
    not seen: what the probe keeps of a run of decode steps, `copy_batches.Run`), `positions` and `mask`
    numpy arrays of one row per step, and `slots` (under DCP, eager) each row's pool row, packed as
    positions are. `layers`: each step's observed layers (0: none), written once when they agree.
    One line and two C-level encodings for a run of steps, instead of a line per step."""
    cp = "null" if cp_configured is None else "false"  # blocks hold no PCP-split step
    if layers is not None:
        first = layers[0]
        if layers.count(first) == len(layers):
            layers_text = "" if not first else f',"layers":{int(first)}'
        else:
            layers_text = f',"layers":[{_json_ints([n or None for n in layers])}]'
    else:
        layers_text = ""
    kv_text = _digits(mask) if kv == "mask" else ('"all"' if kv == "all" else "null")
    return (
        f'{{"v":{SCHEMA_VERSION},"t":[{",".join(map(repr, map(float, t)))}],"kind":"steps",'
        f'"rank":{rank_json},"mode":"decode","cp_active":{cp},"rids":["{quoted}"],'
        f'"step":[{_json_ints(step)}],"rows_in":[{_json_ints(rows_in)}],'
        f'"attn_rows":[{_json_ints(attn_rows)}],"ffn_rows":[{_json_ints(ffn_rows)}],'
        f'"logits_rows":[{_json_ints(logits_rows)}],'
        f'"pos":{_packed_pos(positions)},"kv":{kv_text}'
        + ("" if slots is None else f',"slots":{_packed_pos(slots)}')
        + ("" if graph_rows is None else f',"graph_rows":{int(graph_rows)}')
        + ("" if not layers_text or ffn_out_rows is None or ffn_out_rows.count(None) == len(ffn_out_rows)
           else f',"ffn_out_rows":[{_json_ints(ffn_out_rows)}]')
        + layers_text + "}"
    )


def _json_ints(values: Sequence[int | None]) -> str:
    """Ints and Nones (the hooks' `int(...)` counts) as the inside of a JSON list ("3,null,4"), with
    C-level joins: one value for all (a run's row counts, mostly) is written once and repeated."""
    first = values[0]
    if values.count(first) == len(values):
        return ",".join(["null" if first is None else str(first)] * len(values))
    return ",".join(map(str, values)).replace("None", "null")  # `str` of an int holds no "None"


def _line_head(t: float, kind: str, rank_json: str) -> str:
    """The fields every record's JSON line opens with, in pydantic's order (`record_base._Record`),
    for the lines the probe makes without pydantic (`pool_sample_line`, `graph_count_line`,
    `note_line`)."""
    return f'{{"v":{SCHEMA_VERSION},"t":{float(t)!r},"kind":"{kind}","rank":{rank_json},'


def pool_sample_line(*, rank_json: str, t: float, step: int, total: int, free: int, evictable: int | None,
                     protected: int | None, running: int, waiting: int, scheduler_total: int | None,
                     idle: bool) -> str:
    """The JSON line of a `PoolSample` (what its `model_dump_json()` makes, field for field), without
    pydantic: the pool hook runs on the engine's thread (probe.pool_hooks)."""
    return (
        _line_head(t, "pool_sample", rank_json)
        + f'"step":{int(step)},"total":{int(total)},"free":{int(free)},"evictable":{_json_int(evictable)},'
        f'"protected":{_json_int(protected)},"running":{int(running)},"waiting":{int(waiting)},'
        f'"scheduler_total":{_json_int(scheduler_total)},"idle":{"true" if idle else "false"}}}'
    )


def pool_sample_late(rank_json: str, clock: float, step: int, total: int, free: int, evictable: int | None,
                     protected: int | None, running: int, waiting: int, scheduler_total: int | None,
                     idle: bool) -> tuple[Any, ...]:
    """A pool sample as the hook took it: its figures and the probe's clock then, its line made when
    it is written (`late_line`), with the steps' lines of its copy batch, not in the scheduler's
    iteration. A plain tuple of plain values: Python's collector stops tracking it at its first
    look, where an object would live on, to its oldest generation, until its batch is written."""
    return ("pool_sample", rank_json, clock, step, total, free, evictable, protected, running, waiting,
            scheduler_total, idle)


def graph_count_line(*, rank_json: str, t: float, event: str, phase: str, count: int) -> str:
    """The JSON line of a `Graph` count (what its `model_dump_json()` makes, field for field), without
    pydantic: the chores write one a second on the engine's thread."""
    return (_line_head(t, "graph", rank_json)
            + f'"event":"{event}","phase":"{phase}","batch_sizes":[],"count":{int(count)}}}')


def graph_count_late(rank_json: str, clock: float, event: str, phase: str, count: int) -> tuple[Any, ...]:
    """A `Graph` count made into its line when written (`late_line`), as a pool sample is: it joins
    the copy batch being filled without ending its run of steps (`copy_batches.attach_record`)."""
    return ("graph", rank_json, clock, event, phase, count)


def note_line(*, rank_json: str, t: float, level: str, message: str) -> str:
    """The JSON line of a `ProbeNote` of a rank (what its `model_dump_json()` makes), without pydantic:
    the measuring's notes are written every second on the engine's thread."""
    return (_line_head(t, "probe_note", rank_json)
            + f'"level":"{level}","message":{json.dumps(message, ensure_ascii=False)}}}')


def note_late(rank_json: str, clock: float, message: str, level: str = "info") -> tuple[Any, ...]:
    """A note made into its line when written (`late_line`): it joins the copy batch being filled
    without ending its run of steps, as the graph counts do."""
    return ("probe_note", rank_json, clock, level, message)


def late_line(record: tuple[Any, ...], t0: float) -> str:
    """The line of a record made by `pool_sample_late`, `graph_count_late` or `note_late`, `t0`
    being the probe's clock at its start: its `t` is what `Probe.now` said when the record was made
    (round(clock - t0, 6))."""
    if record[0] == "graph":
        _, rank_json, clock, event, phase, count = record
        return graph_count_line(rank_json=rank_json, t=round(clock - t0, 6), event=event, phase=phase,
                                count=count)
    if record[0] == "probe_note":
        _, rank_json, clock, level, message = record
        return note_line(rank_json=rank_json, t=round(clock - t0, 6), level=level, message=message)
    kind, rank_json, clock, step, total, free, evictable, protected, running, waiting, sched, idle = record
    if kind != "pool_sample":
        raise ValueError(f"not a record made late: {kind!r}")
    return pool_sample_line(rank_json=rank_json, t=round(clock - t0, 6), step=step, total=total, free=free,
                            evictable=evictable, protected=protected, running=running, waiting=waiting,
                            scheduler_total=sched, idle=idle)


def steps_block_late(clock: Sequence[float], **fields: Any) -> tuple[Any, ...]:
    """A `steps` line as its copy batch is finished: the steps' clock readings and every other field
    of `steps_block_line`, its numpy arrays owned by the caller until the line is made
    (`item_line`, by the probe or by its writer process, `cptest.probe.line_writer`)."""
    return ("steps", tuple(clock), fields)


def item_line(item: Any, t0: float) -> str:
    """The line of one item of a finished copy batch, `t0` being the probe's clock at its start:
    a line made already (str), a pool sample (`pool_sample_late`) or a `steps` line
    (`steps_block_late`), whose `t` is what `Probe.now` said at each step (round(clock - t0, 6))."""
    if item.__class__ is str:
        return item
    if item[0] == "steps":
        _, clock, fields = item
        return steps_block_line(t=[round(c - t0, 6) for c in clock], **fields)
    return late_line(item, t0)


_PLAIN = re.compile(r'[^"\\\x00-\x1f\x7f-\uffff]*')
"""Request ids that need no escaping in JSON (SGLang's are hex); others go the general way."""


_QUOTED_COMMA = '","'


def _packed_pos(positions: Any) -> str:
    """A numpy array of positions (any shape, row after row) as the JSON string of its
    little-endian int32 bytes in base64."""
    return '"' + b2a_base64(positions.astype("<i4").tobytes(), newline=False).decode("ascii") + '"'


def _digits(mask: Any) -> str:
    """A numpy 0/1 (or bool) array (any shape, row after row) as the JSON string of its digits,
    e.g. "0101"."""
    return '"' + ((mask != 0).view("u1") + 48).tobytes().decode("ascii") + '"'


def _json_int(v: int | None) -> str:
    return "null" if v is None else str(int(v))


# ---------------------------------------------------------------- graph counters
GraphKey = tuple[Literal["capture", "replay", "eager", "disabled"], Literal["decode", "prefill"]]


_GRAPH_KEYS: tuple[GraphKey, ...] = (("eager", "decode"), ("eager", "prefill"), ("replay", "decode"),
                                     ("replay", "prefill"))


@dataclass
class GraphCounter:
    """Replay/eager decisions counted between flushes, so that replays cost no line each.

    Each flushed `Graph` record carries the count *since the previous flush*: a checker sums them.
    One thread counts (the engine's, every forward) and another may flush (the probe's watchdog), without
    a lock: the counter only ever adds to running totals whose keys all exist from the start (a dict
    that never changes size can be read while another thread adds to a value), and a flush writes
    the difference from the totals it flushed before. A count made during a flush falls into the
    next one, never into none.
    """

    totals: dict[GraphKey, int] = field(default_factory=lambda: dict.fromkeys(_GRAPH_KEYS, 0))
    flushed: dict[GraphKey, int] = field(default_factory=lambda: dict.fromkeys(_GRAPH_KEYS, 0))
    last_flush: float = 0.0

    def add(self, event: Literal["replay", "eager"], phase: Literal["decode", "prefill"]) -> None:
        self.totals[(event, phase)] += 1

    @property
    def pending(self) -> dict[GraphKey, int]:
        """Counts since the last flush, by (event, phase); only those above zero."""
        flushed = self.flushed
        return {k: n - flushed[k] for k, n in list(self.totals.items()) if n != flushed[k]}

    def due(self, now: float, every_s: float) -> bool:
        return now - self.last_flush >= every_s and bool(self.pending)

    def flush_late(self, rank_json: str, clock: float) -> list[tuple[Any, ...]]:
        """The counts since the last flush, which they become, as `Graph` records made into their
        lines when written (`graph_count_late`)."""
        seen = dict(self.totals)  # one snapshot: the deltas written are exactly what is marked flushed
        out = [graph_count_late(rank_json, clock, ev, ph, n - self.flushed[(ev, ph)])
               for (ev, ph), n in sorted(seen.items()) if n != self.flushed[(ev, ph)]]
        self.flushed = seen
        self.last_flush = clock
        return out


def graph_capture(
    *, rank: RankId, t: float, phase: Literal["decode", "prefill"], runner_kind: str,
    batch_sizes: Sequence[int] | None,
) -> Graph:
    """A capture record, or `disabled` when SGLang bound the eager runner (or nothing) to the phase.

    The pinned release always builds an EagerRunner and points a phase at it when its graph is disabled
    (model_executor/model_runner_components/cuda_graph_setup.py:105-155).
    """
    if runner_kind in ("", "NoneType", "EagerRunner"):
        return Graph(t=t, rank=rank, event="disabled", phase=phase, batch_sizes=[], count=1)
    sizes = sorted(int(b) for b in batch_sizes or [])
    return Graph(t=t, rank=rank, event="capture", phase=phase, batch_sizes=sizes, count=1)
