"""The rank-local evidence records: what the probe writes inside each engine rank (and the reference
engine writes from its own model) to `evidence/<role>/rank<world>.jsonl`. `cptest.evidence`, their
one reader, re-exports them.
"""

from __future__ import annotations

import array
import base64
import binascii
import sys
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cptest.record_base import Ranges, RankId, SlotRuns, _Record, ranges_from

V6_FIELDS = ("ffn_out_rows", "layers", "layer_rows", "ffn_seq_positions", "ffn_out_seq_positions", "kv_slots",
             "kv_read", "attn_rows_padded")
"""The fields a Step gained in schema v6: every layer's rows, the MLP's output rows and the rows'
identity, the KV slots written and read."""
V7_FIELDS = ("dp_buffer",)
"""The fields a Step gained in schema v7: the attention-DP buffer."""
LayerPart = Literal["attn", "ffn", "ffn_out"]
"""The parts of a layer whose rows a step records per layer (`Step.layer_rows`)."""


class Geometry(_Record):
    """Rank geometry and process groups as the engine built them (world ranks in each group)."""

    kind: Literal["geometry"] = "geometry"
    rank: RankId
    sizes: dict[str, int]
    """tp, dcp, attn_cp, attn_tp, attn_dp, pp, world."""
    groups: dict[str, list[int]]
    """Group name (tp, dcp, attn_cp, attn_tp, ...) -> world ranks of *this rank's* group."""
    gpu: int | None = None
    hostname: str = ""


class KvPool(_Record):
    """Physical KV pool of this rank and the allocator's token space over it."""

    kind: Literal["kv_pool"] = "kv_pool"
    rank: RankId
    rows: int
    """Physical token rows of the pool on this rank."""
    allocator_size: int | None = None
    """Token slots the allocator hands out (logical); rows * dcp under DCP."""
    page_size: int | None = None
    allocator_page_size: int | None = None
    head_num: int | None = None
    head_dim: int | None = None
    layer_num: int | None = None
    dtype: str = ""


class Capacity(_Record):
    """The scheduler's admission capacity as this rank sees it."""

    kind: Literal["capacity"] = "capacity"
    rank: RankId
    max_total_num_tokens: int
    max_running_requests: int | None = None
    context_len: int | None = None


class DpBuffer(BaseModel):
    """The buffer that attention DP gathers every DP rank's rows into before the MLP, as one rank's
    forward batch sized it (SGLang's `prepare_mlp_sync_batch`): `tokens` is each DP rank's token
    count as the ranks exchanged it (`original_global_num_tokens_cpu`, DP rank order), `padded` the
    count each DP rank's slice of the buffer holds (`global_num_tokens_cpu`: aligned to the attention
    TP size and, under `max_len`, every slice the longest), `rows` the buffer's length
    (`global_dp_buffer_len`) and `mode` SGLang's `dp_padding_mode`. `padded[i] - tokens[i]` rows of
    slice i are padding; this rank's slice starts after the slices before its DP rank."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    tokens: list[int]
    padded: list[int]
    rows: int
    mode: Literal["sum_len", "max_len"] | None = None


class Step(_Record):
    """One forward step on this rank: an eager forward, or a CUDA-graph replay (`graph_rows` set).

    A replay's record comes from the forward batch and the graph runner as the replay starts:
    its rows, positions and requests are observed; what runs inside the graph
    (attention, MLP and logits inputs, the KV write and its DCP owner mask) is not, so those
    fields are null and `kv_written` is empty: unobserved, not unwritten.

    On disk a step of one row per distinct request (decode) may be written in its compact form,
    `"rows": {"rids": [...], "pos": [...], "kv": [0/1, ...] | "all" | null}` in place of
    positions / seq_positions / kv_written: the probe writes it on the engine's thread once per
    step, where building the per-request maps cost more than the rest of the probe. Reading
    expands it (`_expand_rows`): request i's row is at position pos[i]; its K/V was written by this
    rank if kv[i] is true ("all": every row; null: no write seen, kv_written empty).
    Since v2 `pos` may be a string, the base64 of the positions as little-endian int32, and `kv` a
    string of "0"/"1" digits: the probe then never turns a number into text on the engine's thread.
    """

    kind: Literal["step"] = "step"
    rank: RankId
    step: int
    mode: Literal["extend", "decode", "mixed", "idle", "other"]
    batch_size: int
    rows_in: int
    """Tokens of the forward batch as it reached the model on this rank."""
    attn_rows: int | None = None
    """Rows entering attention on this rank (after any CP split)."""
    ffn_rows: int | None = None
    """Rows entering the first MLP on this rank."""
    ffn_out_rows: int | None = None
    """Rows leaving the first MLP (its output) on this rank; None: not observed."""
    logits_rows: int | None = None
    cp_active: bool | None = None
    positions: Ranges = Field(default_factory=list)
    """Positions of the rows this rank computes attention for, per request merged (see `rids`)."""
    seq_positions: dict[str, Ranges] = Field(default_factory=dict)
    """Request id -> positions of its rows in this step on this rank (attention rows)."""
    kv_written: dict[str, Ranges] = Field(default_factory=dict)
    """Request id -> token positions whose K/V this rank wrote into its own pool in this step."""
    extend_lens: list[int] = Field(default_factory=list)
    prefix_lens: list[int] = Field(default_factory=list)
    graph_rows: int | None = None
    """Rows the CUDA graph ran when this step was a replay (the batch padded to a captured size;
    `graph_rows - rows_in` rows are padding); None for an eager forward."""
    layers: int | None = None
    """Layers whose attention ran in this step on this rank (each one observed); None: not observed
    (a replay, an archive from before the field, or a probe without its per-layer hooks). 1 on a
    decode step between the probe's samples, which hooks the first layer alone (`layer_rows` then
    speaks of that layer only)."""
    layer_rows: dict[LayerPart, list[int]] | None = None
    """The row counts of every layer, in the order the layers ran, for each part whose count was
    not the same in all of them: `attn` (rows entering attention as its hook saw them: under PCP the
    padded shard), `ffn` (entering the MLP), `ffn_out` (leaving it). A part absent had its first
    layer's count (`ffn_rows`, `ffn_out_rows`) in each of `layers`; None: no part changed."""
    ffn_seq_positions: dict[str, Ranges] | None = None
    """Request id -> positions of the rows entering the MLP, when they are not the attention rows
    (`seq_positions`): under attention CP an MLP over the whole batch (the shards gathered back).
    None: the MLP's rows are the attention rows, or were not observed (`ffn_rows` None)."""
    ffn_out_seq_positions: dict[str, Ranges] | None = None
    """The same for the rows leaving the MLP (a block that gathers rows may cut them back)."""
    kv_slots: dict[str, SlotRuns] = Field(default_factory=dict)
    """Request id -> `[start, end, slot]` runs over its `kv_written` (`SlotRuns`): the K/V of the
    positions this rank wrote in `[start, end)`, in order, went to rows `slot, slot + 1, ...` of its
    own pool (under DCP the rank-local row, SGLang's slot `out_cache_loc // dcp`); `slot_pairs`
    lists them. Empty when the slots were not observed."""
    kv_read: dict[str, Ranges] = Field(default_factory=dict)
    """Request id -> the rows of this rank's pool its attention read in this step (the request's
    block-table row over its length; under DCP the rows of this rank's share, positions
    p % dcp == its DCP rank, each at row `loc // dcp`); empty when not observed. The SGLang probe
    records it on a sample of eager decode steps (`CPTEST_PROBE_READ_EVERY`), the reference engine
    on every step."""
    attn_rows_padded: int | None = None
    """Rows entering the first layer's attention as its hook saw them, where that is not `attn_rows`:
    under PCP the shard padded to the strategy's length (`attn_rows` is the logical shard); None
    where they are the same or were not observed."""

    dp_buffer: DpBuffer | None = None
    """The attention-DP buffer this step's MLP ran over, as SGLang sized it on this rank; None
    without attention DP, on a decode step, or where it was not observed."""

    def model_dump_json(self, **kwargs: Any) -> str:  # type: ignore[override]
        """The record's line, the fields of v6 and v7 (`V6_FIELDS`, `V7_FIELDS`) left out while
        unset: a step that carries none of them is written with the bytes it had before."""
        if "exclude" not in kwargs:
            kwargs["exclude"] = {f for f in V6_FIELDS + V7_FIELDS if getattr(self, f) in (None, {})}
        return super().model_dump_json(**kwargs)

    @property
    def replayed(self) -> bool:
        """Whether this step ran as a CUDA-graph replay (its inside is not observed)."""
        return self.graph_rows is not None

    @model_validator(mode="before")
    @classmethod
    def _expand_rows(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "rows" not in data:
            return data
        data = dict(data)
        rows = data.pop("rows")
        if not isinstance(rows, dict) or set(rows) != {"rids", "pos", "kv"}:
            raise ValueError("rows: expected an object with exactly rids, pos and kv")
        rids, pos, kv = rows["rids"], _unpack_positions(rows["pos"]), rows["kv"]
        if isinstance(kv, str) and kv != "all":
            if kv.strip("01"):
                raise ValueError('rows: kv as a string must be "all" or 0/1 digits')
            kv = [c == "1" for c in kv]
        if not (isinstance(rids, list) and isinstance(pos, list) and len(rids) == len(pos)
                and len(set(rids)) == len(rids)):
            raise ValueError("rows: rids and pos must be lists of one length, rids distinct")
        if any(k in data for k in ("positions", "seq_positions", "kv_written")):
            raise ValueError("rows: given with positions, seq_positions or kv_written")
        seq = {r: [(p, p + 1)] for r, p in zip(rids, pos, strict=True)}
        data["positions"] = ranges_from(pos)
        data["seq_positions"] = seq
        if kv == "all":
            data["kv_written"] = seq
        elif isinstance(kv, list) and len(kv) == len(pos):
            data["kv_written"] = {r: [(p, p + 1)] if k else [] for r, p, k in zip(rids, pos, kv, strict=True)}
        elif kv is None:
            data["kv_written"] = {}
        else:
            raise ValueError('rows: kv must be a list as long as pos, "all" or null')
        return data


def _unpack_positions(pos: Any) -> Any:
    """A packed `pos` (base64 of little-endian int32) as a list; anything else as it is."""
    if not isinstance(pos, str):
        return pos
    try:
        raw = base64.b64decode(pos, validate=True)
    except binascii.Error as e:
        raise ValueError(f"rows: pos is neither a list nor base64: {e}") from None
    if len(raw) % 4:
        raise ValueError("rows: packed pos is not a whole number of int32")
    values = array.array("i", raw)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


class StepBlock(_Record):
    """Consecutive decode steps of one rank over the same requests, one row per request each: one
    line for up to a copy batch of steps (the probe writes it on the engine's thread, where a line
    per step cost more than the rest of the probe). `read_records` expands it into one `Step` per
    step, so nothing downstream sees this kind.

    `pos` is the base64 of every step's positions as little-endian int32, step after step
    (`len(step) * len(rids)` values); `kv` the 0/1 digits of the DCP owner mask in the same
    order, "all" (every row written) or null (no write seen). `t`, `step`, `rows_in`,
    `attn_rows`, `ffn_rows` and `logits_rows` have one entry per step; `batch_size` is the number
    of requests.
    """

    kind: Literal["steps"] = "steps"
    t: list[float]  # type: ignore[assignment]
    rank: RankId
    mode: Literal["decode"] = "decode"
    cp_active: bool | None = None
    rids: list[str]
    step: list[int]
    rows_in: list[int]
    attn_rows: list[int | None]
    ffn_rows: list[int | None]
    logits_rows: list[int | None]
    pos: str
    kv: str | None
    graph_rows: int | None = None
    """The rows every step of the block ran as a CUDA-graph replay (see `Step.graph_rows`)."""
    ffn_out_rows: list[int | None] | None = None
    """One entry per step (see `Step.ffn_out_rows`); None in blocks from before the field."""
    layers: int | list[int | None] | None = None
    """The layers of every step of the block (see `Step.layers`), or one entry per step where they
    differ (the probe's sampled decode steps hook every layer, the others the first alone)."""
    slots: str | None = None
    """The pool row of every row of every step (packed as `pos`), where the rank wrote it: each step's
    rows with a 1 in `kv` are its `kv_slots`; None when the slots were not recorded."""

    @model_validator(mode="after")
    def _shape(self) -> StepBlock:
        n, b = len(self.step), len(self.rids)
        if any(len(x) != n for x in (self.t, self.rows_in, self.attn_rows, self.ffn_rows, self.logits_rows,
                                     self.step if self.ffn_out_rows is None else self.ffn_out_rows)):
            raise ValueError("steps: t, step, rows_in, attn_rows, ffn_rows, ffn_out_rows and logits_rows "
                             "differ in length")
        if isinstance(self.layers, list) and len(self.layers) != n:
            raise ValueError("steps: layers must be one count, or one entry per step")
        if len(set(self.rids)) != b:
            raise ValueError("steps: rids must be distinct")
        if len(_unpack_positions(self.pos)) != n * b:
            raise ValueError("steps: pos must hold one position per request per step")
        if self.kv is not None and self.kv != "all" and (len(self.kv) != n * b or self.kv.strip("01")):
            raise ValueError('steps: kv must be "all", null, or one 0/1 digit per request per step')
        if self.slots is not None and (self.kv is None or len(_unpack_positions(self.slots)) != n * b):
            raise ValueError("steps: slots need kv and must hold one slot per request per step")
        return self

    def expand(self) -> list[Step]:
        n, b = len(self.step), len(self.rids)
        pos = _unpack_positions(self.pos)
        slots = _unpack_positions(self.slots) if self.slots is not None else None
        out = []
        for k in range(n):
            kv = self.kv if self.kv in (None, "all") else self.kv[k * b:(k + 1) * b]  # type: ignore[index]
            kv_slots = {} if slots is None else {
                rid: [(pos[k * b + j], pos[k * b + j] + 1, slots[k * b + j])]
                for j, rid in enumerate(self.rids) if kv == "all" or kv[j] == "1"}  # type: ignore[index]
            out.append(Step.model_validate({
                "v": self.v, "t": self.t[k], "rank": self.rank, "step": self.step[k], "mode": self.mode,
                "batch_size": b, "rows_in": self.rows_in[k], "attn_rows": self.attn_rows[k],
                "ffn_rows": self.ffn_rows[k], "logits_rows": self.logits_rows[k], "cp_active": self.cp_active,
                "rows": {"rids": self.rids, "pos": pos[k * b:(k + 1) * b], "kv": kv},
                "graph_rows": self.graph_rows,
                "layers": self.layers[k] if isinstance(self.layers, list) else self.layers,
                "ffn_out_rows": self.ffn_out_rows[k] if self.ffn_out_rows is not None else None,
                "kv_slots": kv_slots,
            }))
        return out


class PoolSample(_Record):
    """The KV pool and the scheduler's token accounting of this rank at one scheduler iteration
    (docs/language.md "Capacity transitions"). Written when the figures changed, at most every
    `probe.pool_hooks.STEP_EVERY` forward batches while a request waits (`QUIET_EVERY` while busy
    with none waiting), and once more when the scheduler goes idle, so the drained state is always
    the last sample. Every figure is in the allocator's token
    space: *logical* tokens under DCP (`total` = rows x dcp), while `KvPool.rows` is the rank's
    physical pool."""

    kind: Literal["pool_sample"] = "pool_sample"
    rank: RankId
    step: int
    """Forward batches the scheduler has run so far (SGLang's `Scheduler.forward_ct`; the reference's
    step count): every rank of one server counts the same, which is what ranks are compared at."""
    total: int
    """The allocator's token space (`allocator.size`)."""
    free: int
    """Tokens the allocator can hand out now (`allocator.available_size()`)."""
    evictable: int | None = None
    """Tokens the prefix cache holds for no running request (radix `evictable_size()`): reusable,
    not leaked; None where the engine has no prefix cache."""
    protected: int | None = None
    """Tokens the prefix cache holds locked by running requests (radix `protected_size()`)."""
    running: int
    waiting: int
    scheduler_total: int | None = None
    """The logical capacity the scheduler admits and reports usage against (the pinned SGLang
    release: its pool-stats observer's `max_total_num_tokens`, which is the rank's rows x dcp_size)."""
    idle: bool = False
    """Sampled with nothing running or waiting: the scheduler drained."""

    @property
    def used(self) -> int:
        """Tokens held by requests: what is neither free nor evictable."""
        return self.total - self.free - (self.evictable or 0)


class Graph(_Record):
    """CUDA-graph capture and replay as observed by the probe."""

    kind: Literal["graph"] = "graph"
    rank: RankId
    event: Literal["capture", "replay", "eager", "disabled"]
    phase: Literal["decode", "prefill"]
    batch_sizes: list[int] = Field(default_factory=list)
    count: int = 1


KV_WRITE_UNMAPPED = "kv_written left empty"
"""The end of the note the probe writes, once per kind, when a step's KV write was not seen or did not
fit the step's rows: on that rank, a request absent from a step's `kv_written` was not observed
(a mapped write names every request, with an empty list where this rank stored none)."""


class ProbeNote(_Record):
    """Something the probe could not observe or an error inside it (never raised into the engine)."""

    kind: Literal["probe_note"] = "probe_note"
    rank: RankId | None = None
    level: Literal["info", "warning", "error"] = "info"
    message: str


