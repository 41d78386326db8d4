"""Evidence: the record types that what observes (probe, runner) writes, their one reader, and the
typed view of one archive's evidence that what judges (the contracts' checkers) reads.

Every record is one JSON object on one line, with `v` (schema version) and `kind`. Rank-local
records are written by the probe *inside* each engine rank to `evidence/<role>/rank<world>.jsonl`;
runner-side records go to `evidence/<role>/runner.jsonl` (requests, processes, GPU memory, server
info, lifecycle; `cptest.store.Layout` names the files). A reader never guesses: an unknown `kind`
or a newer `v` is an `EvidenceError`; a truncated last line (a rank killed mid-write) is dropped and
counted, so a checker can say `unknown` with the reason.

Position sets are carried as sorted, merged half-open ranges `[[start, end), ...]` so that a 100k
token prompt is one pair, not 100k integers; `ranges_*` helpers below are the only code that
builds or reads them.
"""

from __future__ import annotations

import array
import base64
import binascii
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from cptest import bounds
from cptest.archive_io import Budget, read_lines
from cptest.errors import EvidenceError, Problem, Span
from cptest.topology import Degrees, PlacementMode

SCHEMA_VERSION = 5
"""v5: `pool_sample` records (`PoolSample`); steps of CUDA-graph replays, marked by
`graph_rows` (`Step`, `StepBlock`); every v1-v4 record reads unchanged.
v2: a compact step's `pos` may be packed (base64 of little-endian int32) and its `kv` a string
of 0/1 digits (`Step`). v3: consecutive decode steps over the same requests may be one `steps`
line (`StepBlock`), which the reader expands into its Step records. v4: teacher-forced `score`
records, a request's `output_top`, and the `control` server's records. Every v1-v3 record reads
unchanged."""
RunRole = Literal["main", "baseline", "control", "eager"]
"""The servers of a run: the one under test, the parity reference, the noise-floor control, and the
main server's eager twin (`graph parity vs eager`)."""
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


# ---------------------------------------------------------------- probe records (inside ranks)
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

    @model_validator(mode="after")
    def _shape(self) -> StepBlock:
        n, b = len(self.step), len(self.rids)
        if any(len(x) != n for x in (self.t, self.rows_in, self.attn_rows, self.ffn_rows, self.logits_rows)):
            raise ValueError("steps: t, step, rows_in, attn_rows, ffn_rows and logits_rows differ in length")
        if len(set(self.rids)) != b:
            raise ValueError("steps: rids must be distinct")
        if len(_unpack_positions(self.pos)) != n * b:
            raise ValueError("steps: pos must hold one position per request per step")
        if self.kv is not None and self.kv != "all" and (len(self.kv) != n * b or self.kv.strip("01")):
            raise ValueError('steps: kv must be "all", null, or one 0/1 digit per request per step')
        return self

    def expand(self) -> list[Step]:
        n, b = len(self.step), len(self.rids)
        pos = _unpack_positions(self.pos)
        out = []
        for k in range(n):
            kv = self.kv if self.kv in (None, "all") else self.kv[k * b:(k + 1) * b]  # type: ignore[index]
            out.append(Step.model_validate({
                "v": self.v, "t": self.t[k], "rank": self.rank, "step": self.step[k], "mode": self.mode,
                "batch_size": b, "rows_in": self.rows_in[k], "attn_rows": self.attn_rows[k],
                "ffn_rows": self.ffn_rows[k], "logits_rows": self.logits_rows[k], "cp_active": self.cp_active,
                "rows": {"rids": self.rids, "pos": pos[k * b:(k + 1) * b], "kv": kv},
                "graph_rows": self.graph_rows,
            }))
        return out


class PoolSample(_Record):
    """The KV pool and the scheduler's token accounting of this rank at one scheduler iteration
    (docs/language.md "Capacity transitions"). Written when the figures changed, at most every
    `probe.pool_hooks.STEP_EVERY` forward batches while busy, and once more when the scheduler goes
    idle, so the drained state is always the last sample. Every figure is in the allocator's token
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


class ProbeNote(_Record):
    """Something the probe could not observe or an error inside it (never raised into the engine)."""

    kind: Literal["probe_note"] = "probe_note"
    rank: RankId | None = None
    level: Literal["info", "warning", "error"] = "info"
    message: str


# ---------------------------------------------------------------- runner records (outside ranks)
class RequestResult(_Record):
    """One workload request as sent and as answered."""

    kind: Literal["request"] = "request"
    run: RunRole = "main"
    index: int
    prompt_len: int
    max_new_tokens: int
    prompt_sha256: str
    status: Literal["ok", "error", "timeout", "not_sent"]
    error: str = ""
    output_ids: list[int] = Field(default_factory=list)
    output_logprobs: list[float] = Field(default_factory=list)
    sent_at: float = 0.0
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    ttft_token_s: float | None = Field(default=None, exclude_if=lambda v: v is None)
    """When `ttft_s` was stamped at the first text (a server that sends text): the time to the first
    chunk with an output token id, which can come a chunk earlier."""
    output_top: list[list[tuple[int, float]]] | None = Field(default=None, exclude_if=lambda v: v is None)
    """The planned top-k (`workload.top_logprobs`) at each output position, as (token id, logprob)
    sorted by logprob: what the free-running comparison needs at a first divergence."""


class Score(_Record):
    """One teacher-forced scoring: a fixed token sequence (a prompt and the baseline's output for it)
    sent with prompt logprobs, so that every server is judged on the same positions and histories."""

    kind: Literal["score"] = "score"
    run: RunRole = "main"
    index: int
    """The workload request whose prompt (and the baseline's output for it) was scored."""
    sequence_sha256: str
    """`prompt_sha256` of the whole scored sequence: every server must have scored the same one."""
    start: int
    """First scored position (the prompt's length: the output tokens are scored)."""
    status: Literal["ok", "error", "timeout"]
    error: str = ""
    token_logprobs: list[float] = Field(default_factory=list)
    """Log-probability of the sequence's own token at each scored position (NaN where none came)."""
    top: list[list[tuple[int, float]]] = Field(default_factory=list)
    """The top-k (token id, logprob) at each scored position, sorted by logprob."""


class ProcessSample(_Record):
    """The process tree of a launch at one moment."""

    kind: Literal["processes"] = "processes"
    phase: str
    """before, running, after, final."""
    procs: list[dict[str, Any]]
    """pid, ppid, name (process title), status, rss, scope: `tree` (a process of this run's trees),
    `host` (titled like the engine, outside the trees, carrying this run's label or no cptest label:
    an orphan or a leftover), `foreign` (titled like the engine and labelled by another cptest run
    sharing the machine: not this run's to judge)."""


class GpuProcessUse(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    gpu: str
    pid: int
    mib: int
    ours: bool
    """The process belongs to this run: a pid of its trees, or one carrying its label."""


class GpuSample(_Record):
    kind: Literal["gpu"] = "gpu"
    phase: str
    used_mib: dict[str, int]
    """GPU index -> memory in use on the device (every process)."""
    processes: list[GpuProcessUse] | None = None
    """Who holds that memory, per process (NVML); None where the machine cannot say."""

    def ours_mib(self) -> dict[str, int] | None:
        """GPU index -> MiB held by this run's processes (every GPU of the sample, zeros included);
        None without per-process figures."""
        if self.processes is None:
            return None
        out = {g: 0 for g in self.used_mib}
        for p in self.processes:
            if p.ours:
                out[p.gpu] = out.get(p.gpu, 0) + p.mib
        return out


class LogLine(_Record):
    """A log line that a known pattern matched (the whole logs are in logs/)."""

    kind: Literal["log"] = "log"
    source: str
    pattern: str
    line: str
    fields: dict[str, Any] = Field(default_factory=dict)


class ServerInfo(_Record):
    kind: Literal["server_info"] = "server_info"
    run: RunRole = "main"
    info: dict[str, Any]


class Lifecycle(_Record):
    """Launch, readiness, faults, exit: what happened to the server and when."""

    kind: Literal["lifecycle"] = "lifecycle"
    run: RunRole = "main"
    event: str
    """launched, ready, launch_failed, fault, signal, exited, timeout, teardown, interrupted."""
    detail: dict[str, Any] = Field(default_factory=dict)


Record = Annotated[
    Geometry
    | KvPool
    | Capacity
    | Step
    | StepBlock
    | PoolSample
    | Graph
    | ProbeNote
    | RequestResult
    | Score
    | ProcessSample
    | GpuSample
    | LogLine
    | ServerInfo
    | Lifecycle,
    Field(discriminator="kind"),
]
_ADAPTER: TypeAdapter[Record] = TypeAdapter(Record)


def parse_record(line: str, where: Span | None = None) -> Record:
    """One JSON line -> record. Raises EvidenceError naming the file and line."""
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as e:
        raise EvidenceError(Problem(where, f"not JSON: {e.msg}")) from None
    if isinstance(raw, dict) and isinstance(raw.get("v"), int) and raw["v"] > SCHEMA_VERSION:
        raise EvidenceError(
            Problem(where, f"evidence schema v{raw['v']} is newer than this cptest (v{SCHEMA_VERSION})",
                    hint="upgrade cptest to check this archive")
        )
    try:
        return _ADAPTER.validate_python(raw)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise EvidenceError(Problem(where, f"bad evidence record at {loc}: {first['msg']}")) from None


def dump_record(record: BaseModel) -> str:
    return record.model_dump_json()


def read_records(path: Path, budget: Budget | None = None) -> tuple[list[Record], int]:
    """Records of one JSON-lines file and the number of truncated trailing lines dropped.

    The one reader of evidence files. A half line at the end (a rank killed mid-write) is dropped
    and counted, for checkers to decide what it means; a malformed line anywhere else, or a record
    of a newer schema version, raises EvidenceError naming the file and line.

    Bounded (`cptest.bounds`): the file is read one line at a time (`archive_io.read_lines`), and a
    file or a line larger than evidence may be is an OverBound naming it; with a `budget`, each
    line is charged to it before it is parsed (`line_cost`), and what its record holds beyond that
    once it is (`held_cost`), so one archive's evidence never costs more than its budget allows.

    Speed: each line is validated with pydantic-core's JSON parser (`validate_json`), faster than
    `json.loads` alone and still the whole schema; only a line that fails goes through
    `parse_record` again, for its message.
    """
    out: list[Record] = []
    validate = _ADAPTER.validate_json
    failed: tuple[int, str] | None = None  # a line that did not validate: dropped if it is the last
    for i, raw in read_lines(path):
        if not raw.strip():
            continue
        if failed is not None:
            _raise_bad(path, *failed)
        cost = line_cost(raw)
        if budget is not None:
            budget.charge(path, cost, i)
        line = raw.decode("utf-8", errors="replace")
        try:
            rec = validate(line)
        except ValidationError:
            failed = (i, line)
            continue
        if rec.v > SCHEMA_VERSION:
            parse_record(line, Span(str(path), i, 1))  # raises "newer than this cptest"
        if budget is not None:
            budget.charge(path, held_cost(rec, cost) - cost, i)  # before a `steps` line expands
        if isinstance(rec, StepBlock):
            out.extend(rec.expand())
        else:
            out.append(rec)
    return out, int(failed is not None)


def line_cost(raw: bytes) -> int:
    """What a line is charged to a check's budget before it is parsed: its bytes, and no less than
    `bounds.RECORD_BYTES`, nor than `bounds.LIST_BYTES` for each `[` and `bounds.DICT_BYTES` for
    each `{` in it: a list parsed from two bytes holds 100, an object from seven 184."""
    containers = bounds.LIST_BYTES * raw.count(b"[") + bounds.DICT_BYTES * raw.count(b"{")
    return max(len(raw), bounds.RECORD_BYTES, containers)


def held_cost(record: Record, cost: int) -> int:
    """What a record parsed from a line of `cost` (`line_cost`) is charged in all: the line once for
    each record it becomes (a `steps` line expands into one Step per step), and no less than
    `bounds.ENTRY_BYTES` for each (request, positions) entry of a step's maps (a compact decode row,
    a short id and a packed position, becomes two)."""
    if isinstance(record, StepBlock):
        kv = 2 if record.kv is not None else 1
        return max(cost * len(record.step), bounds.ENTRY_BYTES * kv * len(record.step) * len(record.rids))
    if isinstance(record, Step):
        return max(cost, bounds.ENTRY_BYTES * (len(record.seq_positions) + len(record.kv_written)))
    return cost


def _raise_bad(path: Path, i: int, line: str) -> NoReturn:
    """Raise EvidenceError for line `i` of `path`, with the field and message where it has them."""
    parse_record(line, Span(str(path), i, 1))
    raise EvidenceError(Problem(Span(str(path), i, 1), "bad evidence record"))


# ---------------------------------------------------------------- the evidence of one archive
@dataclass
class RankEvidence:
    """Probe records of one world rank, split by kind, in file order."""

    world: int
    geometry: list[Geometry] = field(default_factory=list)
    kv_pools: list[KvPool] = field(default_factory=list)
    capacities: list[Capacity] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    pool_samples: list[PoolSample] = field(default_factory=list)
    graphs: list[Graph] = field(default_factory=list)
    notes: list[ProbeNote] = field(default_factory=list)
    other: list[Record] = field(default_factory=list)
    dropped: int = 0
    """Truncated trailing lines dropped (the rank died mid-write)."""

    @classmethod
    def of(cls, world: int, records: Iterable[Record], dropped: int = 0) -> RankEvidence:
        return _sorted_into(cls(world=world, dropped=dropped), records, _RANK_SLOTS)


@dataclass
class RunnerEvidence:
    """Runner records of one server, split by kind, in file order."""

    requests: list[RequestResult] = field(default_factory=list)
    scores: list[Score] = field(default_factory=list)
    processes: list[ProcessSample] = field(default_factory=list)
    gpu: list[GpuSample] = field(default_factory=list)
    server_info: list[ServerInfo] = field(default_factory=list)
    lifecycle: list[Lifecycle] = field(default_factory=list)
    log_lines: list[LogLine] = field(default_factory=list)
    other: list[Record] = field(default_factory=list)
    dropped: int = 0

    @classmethod
    def of(cls, records: Iterable[Record], dropped: int = 0) -> RunnerEvidence:
        return _sorted_into(cls(dropped=dropped), records, _RUNNER_SLOTS)

    def events(self, name: str) -> list[Lifecycle]:
        return [e for e in self.lifecycle if e.event == name]


E = TypeVar("E", RankEvidence, RunnerEvidence)


def _sorted_into(ev: E, records: Iterable[Record], slots: dict[type, str]) -> E:
    """Append each record to the list `slots` names for its type (`other` for the rest), in order."""
    for r in records:
        getattr(ev, slots.get(type(r), "other")).append(r)
    return ev


_RANK_SLOTS: dict[type, str] = {
    Geometry: "geometry", KvPool: "kv_pools", Capacity: "capacities", Step: "steps", Graph: "graphs",
    ProbeNote: "notes", PoolSample: "pool_samples",
}  # fmt: skip
_RUNNER_SLOTS: dict[type, str] = {
    RequestResult: "requests", Score: "scores", ProcessSample: "processes", GpuSample: "gpu",
    ServerInfo: "server_info", Lifecycle: "lifecycle", LogLine: "log_lines",
}  # fmt: skip


@dataclass
class RoleEvidence:
    """Everything observed about one server (main or baseline), and the layout it was planned with:
    what the checkers compare the observations against."""

    role: str
    world_size: int = 0
    """Planned world ranks: a checker that compares every rank needs evidence from each."""
    nodes: list[int] = field(default_factory=list)
    """Planned node ranks (one engine process tree, one log each)."""
    degrees: Degrees | None = None
    """Planned parallel degrees (the groups, where no rank reported them)."""
    engine: str = ""
    placement: PlacementMode = "physical"
    """`colocated`: the server's ranks shared GPUs, so a device's figures mix several ranks (and,
    judged against a GPU's own total, say nothing about any one of them)."""
    ranks: dict[int, RankEvidence] = field(default_factory=dict)
    runner: RunnerEvidence | None = None
    """None when `runner.jsonl` is missing."""
    logs: dict[int, str] = field(default_factory=dict)
    """Node rank -> the engine's stdout+stderr (of a co-located follower node, up to the line where
    its ranks had ended: `follower_tails`)."""
    follower_tails: dict[int, int] = field(default_factory=dict)
    """Co-located only: node rank -> how many lines its log has after its ranks ended, set apart from
    `logs`. What a follower node's own launcher does then is the placement's (a single-node server has
    no such process), not the ranks' behaviour (docs/placement.md)."""
    missing: list[str] = field(default_factory=list)
    """Archive-relative paths that should exist and do not."""
    planned: bool = True
    """False for a role the plan does not have (an empty view, so checkers need not special-case)."""

    @property
    def log_text(self) -> str:
        return "\n".join(self.logs[k] for k in sorted(self.logs))


@dataclass
class Evidence:
    """The evidence of one archive, typed: what every checker reads, and nothing else."""

    roles: dict[str, RoleEvidence]
    requests: list[int] = field(default_factory=list)
    """Index of every planned request of the workload."""
    refused: list[str] = field(default_factory=list)
    """Evidence not read because it is larger than cptest reads (`cptest.bounds`), each as the
    archive names it (`evidence/main/runner.jsonl:2: a record longer than ...`): what the checkers
    would judge is incomplete, so nothing is judged."""

    def role(self, role: str) -> RoleEvidence:
        """The evidence of `role`; a role the plan does not have is an empty, unplanned view."""
        return self.roles.get(role) or RoleEvidence(role=role, planned=False, missing=[f"evidence/{role}/"])


# ---------------------------------------------------------------- position ranges
def ranges_from(values: Iterable[int]) -> Ranges:
    """Sorted merged half-open ranges covering exactly `values`."""
    out: Ranges = []
    for v in sorted(set(values)):
        if out and out[-1][1] == v:
            out[-1] = (out[-1][0], v + 1)
        else:
            out.append((v, v + 1))
    return out


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
