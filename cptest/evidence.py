"""Evidence: the record types that what observes (probe, runner) writes, their one reader, and the
typed view of one archive's evidence that what judges (the contracts' checkers) reads.

Every record is one JSON object on one line, with `v` (schema version) and `kind`. Rank-local
records are written by the probe *inside* each engine rank to `evidence/<role>/rank<world>.jsonl`;
runner-side records go to `evidence/<role>/runner.jsonl` (requests, processes, GPU memory, server
info, lifecycle; `cptest.store.Layout` names the files). A reader never guesses: an unknown `kind`
or a newer `v` is an `EvidenceError`; a truncated last line (a rank killed mid-write) is dropped and
counted, so a checker can say `unknown` with the reason.

Position sets are carried as sorted, merged half-open ranges `[[start, end), ...]` so that a 100k
token prompt is one pair, not 100k integers (`cptest.record_base`). The rank-local records are
defined in `cptest.rank_records`, the records' base and the ranges in `cptest.record_base`; both
are re-exported here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from cptest import bounds
from cptest.archive_io import Budget, read_lines
from cptest.errors import EvidenceError, Problem, Span
from cptest.rank_records import (
    Capacity,
    DpBuffer,
    Geometry,
    Graph,
    KvPool,
    PoolSample,
    ProbeNote,
    Step,
    StepBlock,
)
from cptest.record_base import (
    SCHEMA_VERSION,
    Ranges,
    RankId,
    SlotRuns,
    _Record,
    ranges_from,
    ranges_iter,
    ranges_len,
    ranges_merge,
    ranges_minus,
    slot_pairs,
    slot_runs_from,
    slot_runs_of,
)
from cptest.topology import Degrees, PlacementMode

__all__ = [
    "SCHEMA_VERSION", "Capacity", "DpBuffer", "Evidence", "Geometry", "Graph", "KvPool", "PoolSample",
    "ProbeNote", "RankEvidence", "RankId", "Ranges", "Record", "RequestResult", "RoleEvidence", "RunRole",
    "RunnerEvidence", "Step", "StepBlock", "dump_record", "parse_record", "ranges_from", "ranges_iter",
    "ranges_len", "ranges_merge", "ranges_minus", "read_records", "SlotRuns", "slot_pairs", "slot_runs_from",
    "slot_runs_of",
]  # fmt: skip
"""The records and helpers other modules import from here, wherever they are defined."""

RunRole = Literal["main", "baseline", "control", "eager"]
"""The servers of a run: the one under test, the parity reference, the noise-floor control, and the
main server's eager twin (`graph parity vs eager`)."""
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
        maps = (len(record.seq_positions) + len(record.kv_written) + len(record.kv_slots)
                + len(record.kv_read) + len(record.ffn_seq_positions or ())
                + len(record.ffn_out_seq_positions or ()))
        return max(cost, bounds.ENTRY_BYTES * maps)
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
    log_files: dict[int, str] = field(default_factory=dict)
    """Node rank -> the archive-relative path its log was read from: `logs/<role>-node<k>.log`, or
    with the node's name where the launcher names its nodes (Slurm: `logs/main-node1-n2.log`)."""
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

    def log_file(self, node: int) -> str:
        """The archive-relative path of node `node`'s log, as the archive names it."""
        return self.log_files.get(node) or f"logs/{self.role}-node{node}.log"


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


