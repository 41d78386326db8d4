"""The probe's state inside one engine process: where records go, which rank this is, error containment.

Contracts:
- Active only when `CPTEST_PROBE_DIR` is set (`enabled()`); otherwise nothing here is created.
- One JSON line per record, appended to an O_APPEND descriptor as it is made (one `os.write` for
  a copy batch's lines), so a rank SIGKILLed at any moment leaves at most one half line (which
  `cptest.evidence.read_records` drops).
- SGLang's thread never waits on the device for the probe: a blocking copy there ends its
  CPU/GPU overlap (22.9 % of eager decode throughput, results/_probe-overhead/). Work that needs
  device values (a step's positions, on their way to the host) is `defer`red and finished once
  `ready()` says the copies are done (a query, never a wait), by the engine's thread at the start
  of a later step.
- The probe's work runs on the engine's thread, not on a thread of its own. SGLang's eager loop
  lets go of the GIL at every torch call; a probe thread with work to do takes it there, and the
  engine then waits for the GIL at its next call, twice a hand-over: that convoy cost the engine
  several times the probe thread's own work (benchmarks/probe_step.py --engine-us models it). On
  the engine's thread the probe's whole cost is in its `cost` notes.
- Records are written in the order they were made: while deferred work is pending, later records
  queue behind it; one made while a copy batch is being filled joins that batch, between the
  steps before and after it (copy_batches.attach_record), which stays open. One exception: a
  pool sample made while a run of decode steps fills (copy_batches.Run) is written after that run's
  `steps` line, so it does not split it in two; its `t` and `step` say when it was made, and
  no reader depends on the order of samples and steps (every one groups records by kind).
- Chores (`chores`: the run-time switch, graph counts, the measuring notes, deferred work left
  waiting for IDLE_S) run on the engine's thread every CHORES_S, from the step hook and from the
  pool hook, which SGLang's scheduler calls on every loop iteration, idle ones included. A watchdog
  thread, started with the rank, wakes every WATCH_S and does the idle part only when the engine's
  thread has not come by for IDLE_S (a rank blocked in a collective, a process that stopped
  calling): rarely enough that its hand-overs of the GIL cost nothing measurable. `flush()` finishes
  everything and runs at exit. So records reach the disk within about IDLE_S + CHORES_S of an idle
  SGLang scheduler, IDLE_S + WATCH_S of a stalled engine, and within COPY_WITHIN_S of a busy one;
  a rank SIGKILLed while busy loses its last steps (at most COPY_EVERY, or
  COPY_WITHIN_S of them).
- Records go to `$CPTEST_PROBE_DIR/rank<world_rank>.jsonl` once the rank is known (Geometry is the
  first rank-local event). Records made earlier are held in memory and written there first; if a
  process never learns its rank (the HTTP/launcher process) and holds a warning or error, it is
  written at exit to `pid<pid>.jsonl` so that a failed hook registration is not silent.
- `guarded(name)` turns any exception of a probe function into a `ProbeNote(level="error")` and
  returns None: the probe never raises into SGLang. After `MAX_ERRORS_PER_HOOK` errors of one hook,
  its further errors are counted, not written.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import gc
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from pydantic import BaseModel

from cptest.evidence import ProbeNote, RankId, dump_record
from cptest.probe.line_writer import LineWriter
from cptest.probe.records import GraphCounter, RidText, StepDraft, item_line, note_late
from cptest.store import rank_file_name

if TYPE_CHECKING:
    from cptest.probe.copy_batches import CopyBatch, Run
    from cptest.probe.steps import Steady

ENV_DIR = "CPTEST_PROBE_DIR"
ENV_POSITIONS = "CPTEST_PROBE_POSITIONS"
"""`0` stops gathering position and mask tensors for the host: steps are recorded without them."""
ENV_LAYERS = "CPTEST_PROBE_LAYERS"
"""`first` hooks the first layer's attention and MLP alone (what `--forward-hooks` names): steps
then carry no `layers` and no per-layer rows, and an eager forward pays two hook calls instead of
two per layer."""
ENV_LAYER_STEPS = "CPTEST_PROBE_LAYER_STEPS"
"""Which eager steps hook the layers after the first (`Probe.hook_layers`): `sampled` (the default)
every step that is not a decode and the first decode step of each copy batch; `all` every step. A
decode step between samples counts the first layer's rows alone (its `layers` is 1): the later
layers' hooks cost the engine a Python call each, and a decode's rows do not change from one step
to the next the way a prefill's split does."""
ENV_READ_EVERY = "CPTEST_PROBE_READ_EVERY"
"""Every how many steps an eager decode step also records what its attention reads (`Step.kv_read`,
the request's block-table row over its length, this rank's share) and where it wrote (`kv_slots`);
`0` never. Sampled: the block-table rows grow with the context, and the copy of every step's would
cost the engine a gather and a transfer each step."""
READ_EVERY_DEFAULT = 32
READ_SHARE = 0.0025
"""The most of the probe's running time that finishing the steps that recorded their reads may take
(`Probe.reads_due`): a sampled step whose rows are long and scattered (a long context decoded
beside many others leaves one pool row range per token) takes milliseconds to turn into ranges and a
line, so the probe skips samples while the reads are over this share. Short contexts stay within it
at every READ_EVERY_DEFAULT-th step."""
READ_CREDIT_MAX_NS = 5_000_000
"""The most reads' time a quiet spell saves up (idle, paused, graph replays): past it, the share's
credit stops growing, so that the reads after a long spell come no faster than READ_EVERY_DEFAULT
allows, nor in a burst that costs the engine this much more."""
READ_BYTES_MAX = 4 << 20
"""The most bytes of reads' lines one rank file takes (`Probe.reads_due`): past it, sampled steps
record no reads. cptest reads at most 16 MiB of an evidence file (cptest/bounds.py); a long
context decoded beside many others leaves a read line of hundreds of KB, and the time credit alone
let a rank file grow past that bound in minutes."""
READ_CELLS_MAX = 1 << 14
"""The most block-table values (requests x their longest length) a sampled step reads: it takes
as many consecutive requests as fit. Their ranges are made when the batch is finished, on the
engine's thread: at 2^18 values that cost milliseconds per sampled step."""
ENV_GRAPH_FLUSH_S = "CPTEST_PROBE_GRAPH_FLUSH_S"
ENV_SWITCH = "CPTEST_PROBE_SWITCH"
"""A file whose content `off` pauses the probe at run time (anything else, or no file: on). The
engine's thread looks at it every CHORES_S (`chores`); a paused probe records no step (a note marks each
pause and resume). It exists to measure the probe's cost on one server in alternating windows
(tools/device/probe_windows.py); evidence runs never set it. While it is set the probe also
lists the process's garbage collections of generation 1 and 2 (`watch_gc`), so that the windows
can be read against the collector's pauses, and times its own work on the engine's thread
(`timing`, `cost` notes)."""
MAX_ERRORS_PER_HOOK = 5
MAX_SPARE_DRAFTS = 256
CHORES_S = 0.1
"""How often the engine's thread does the probe's chores (`Probe.chores`). Each round costs the
engine 30-60 us cold (the pending work's age, the graph counts; while measuring, a stat of the
switch): every 100 ms that is under 0.06 % of the engine's time, and no deadline it serves is
shorter (IDLE_S, the measuring windows' settle time)."""
WATCH_S = 0.5
"""How often the watchdog thread wakes (`Probe._watch_loop`)."""
IDLE_S = 0.15
"""Deferred work older than this is finished without waiting for further steps (by the chores, or
by the watchdog when the engine's thread has not come by for this long). The batch being filled
counts from its last step (`BatchRecorder.filling`): while steps keep joining it, it waits for
its own bound (COPY_WITHIN_S)."""
COPY_WITHIN_S = 1.0
"""The longest a copy batch stays open from its first step (`copy_batches.close_if_due`,
`Probe.copy_within_s`). A batch's send and finishing cost the engine's thread nearly as much for
many steps as for few (its CUDA calls, its event, its one write and the cold caches after each
are per batch), so the bound is what spreads that cost: at 2 ms a decode step, 1 s holds about
500 steps, at 4.4 ms (an eager one) about 230. It is also how late a busy rank's step records
reach the file, and what a rank killed while busy loses."""
COPY_EVERY = 512
"""The most steps a copy batch holds (`copy_batches.close_if_due`, `Probe.copy_every`), unless
COPY_WITHIN_S closes it first; it bounds the size of one host copy and of one finishing. Past it a
batch saves little more: the finishing grows with its steps (benchmarks/probe_step.py --copy-every)."""
ENV_COPY_EVERY = "CPTEST_PROBE_COPY_EVERY"
"""Steps that replace COPY_EVERY: `tools/device/measure.sh` gives one probed server other bounds
than the other (P1_ENV), so that one call measures both."""
ENV_COPY_WITHIN_S = "CPTEST_PROBE_COPY_WITHIN_S"
"""Seconds that replace COPY_WITHIN_S: the runner sets IDLE_S where a fault fires after a number
of decode steps, which it counts in the file, so that the fault lands close to its step."""
ENV_WRITER = "CPTEST_PROBE_WRITER"
"""`inline` has the probe write its rank file itself, on the thread that finishes its records;
by default a writer process makes and writes the lines (`line_writer`)."""


class Deferred(Protocol):
    """Work that needs values still on their way from the device."""

    def ready(self) -> bool:
        """True when the values are on the host (must not wait)."""
        ...

    def run(self) -> None:
        """Finish the work; must contain its own errors."""
        ...


Record = BaseModel | str | tuple[Any, ...]
"""What `Probe.write` takes: a record, its JSON line made by the caller, or a `records.late_line` tuple."""


@dataclass(frozen=True, slots=True)
class BatchRecorder:
    """What the runtime asks of the copy batches that gather the steps' device tensors
    (`cptest.probe.copy_batches`, whose `open_batch` installs them as `Probe.batches`). The runtime
    knows the batches only through these calls, and knows nothing of them until the first
    one opens."""

    attach: Callable[[Probe, Record], bool]
    """Put a record into the batch being filled, after its steps so far; False when no batch is
    being filled (then `Probe.write` queues it behind the pending work)."""
    send_all: Callable[[Probe], None]
    """Send the batch being filled and every closed one not sent yet: before deferred work is
    finished without further steps, and before a record that could not join the batch."""
    filling: Callable[[Probe, float], bool]
    """Whether the oldest pending work is the batch being filled, still taking steps at this clock
    (its last step under IDLE_S old, itself under `Probe.copy_within_s`): the chores leave it to
    its steps, which close it at its bound."""


class _Write:
    """A record that waits only for the deferred work made before it."""

    __slots__ = ("probe", "record")

    def __init__(self, probe: Probe, record: Record) -> None:
        self.probe, self.record = probe, record

    def ready(self) -> bool:
        return True

    def run(self) -> None:
        self.probe._write_now(self.record)

F = TypeVar("F", bound=Callable[..., Any])


def enabled(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool(env.get(ENV_DIR, "").strip())


COST_FIELDS = 24
"""The length of `Probe.cost` (and of a `cost` note: epoch, steps, probe_ns, span_ns, then cost[4:])."""


class Probe:
    """Per-process probe state. Tests build one with a tmp dir and a fake clock."""

    def __init__(self, out_dir: Path, *, clock: Callable[[], float] = time.monotonic,
                 observe_positions: bool = True, graph_flush_s: float = 1.0,
                 switch: Path | None = None, read_every: int = READ_EVERY_DEFAULT,
                 layers_sampled: bool = True, copy_within_s: float = COPY_WITHIN_S,
                 copy_every: int = COPY_EVERY, writer: Literal["process", "inline"] = "inline") -> None:
        self.out_dir = out_dir
        self.writer_mode = writer
        """`process`: the rank file is written by a writer process started with the rank
        (`line_writer`, ENV_WRITER); `inline`: by the probe itself."""
        self.writer: LineWriter | None = None
        """The writer process while it runs; None: the probe writes the file itself."""
        self.copy_every = copy_every
        """The most steps a copy batch holds (COPY_EVERY, ENV_COPY_EVERY)."""
        self.copy_within_s = copy_within_s
        """How long a copy batch stays open from its first step (COPY_WITHIN_S, ENV_COPY_WITHIN_S)."""
        self.clock = clock
        self.t0 = clock()
        self.observe_positions = observe_positions
        self.graph_flush_s = graph_flush_s
        self.rank: RankId | None = None
        self.rank_json: str | None = None
        self.dcp_size = 1
        """The rank's DCP group size (from its geometry): a KV slot's row in this rank's pool is the
        allocator's slot divided by it."""
        self.dcp_rank = 0
        """The rank's index in its DCP group: it holds the K/V of positions p % dcp_size == dcp_rank."""
        self.read_every = read_every
        """Every how many steps an eager decode step records its reads (ENV_READ_EVERY; 0: never)."""
        self.read_ns = 0
        """The engine thread's time spent finishing the steps that recorded their reads (their
        ranges and lines)."""
        self.layers_sampled = layers_sampled
        """Whether decode steps between samples run without the later layers' hooks (ENV_LAYER_STEPS)."""
        self.layer_forwards: list[tuple[Any, Any]] = []
        """(module, hooked forward) of every hooked module past the first layer (`hooks.wrap_forward`):
        `hook_layers` takes their forwards away and gives them back."""
        self.layers_on = True
        """Whether `layer_forwards` are in place."""
        self.read_share = READ_SHARE
        """The most of the probe's running time that finishing read steps may take (READ_SHARE)."""
        self.read_credit_ns = 0.0
        """What reads may still take: `read_share` of the time that passed, at most
        READ_CREDIT_MAX_NS, less what finishing them took (`reads_due`)."""
        self._read_credit_t = self.t0
        self.reads_skipped = 0
        """Sampled steps that recorded no reads because their credit or their bytes were spent
        (`reads_due`)."""
        self.read_bytes = 0
        """Bytes of the lines of the steps that recorded their reads (READ_BYTES_MAX)."""
        self.pid = os.getpid()
        self._fd: int | None = None
        self._held: list[BaseModel] = []
        self._lock = threading.Lock()
        self.errors: dict[str, int] = {}
        self.step_index = 0
        self.current: StepDraft | None = None
        self.kv_shadowed: Any = None
        """The K/V pool whose later layers' writes this step skip the probe's hook
        (`hooks.after_set_kv_buffer`): its own `set_kv_buffer` in its instance dict until the step
        ends (`unshadow_kv`)."""
        self.kv_direct: tuple[Any, Any] | None = None
        """(pool, its `set_kv_buffer` without the probe's hook, bound; or None where that cannot be
        had safely): found at the pool's first write (`hooks._direct_write`)."""
        self.graph = GraphCounter()
        self.cp_configured: bool | None = None
        self.warned: set[str] = set()
        self._pending: collections.deque[tuple[float, Deferred]] = collections.deque()
        self._pending_lock = threading.Lock()
        self._runner: int | None = None
        """Thread id running deferred work: its writes go straight to the file (they are its turn)."""
        self._watchdog: threading.Thread | None = None
        self._stop = threading.Event()
        self.next_chores = 0.0
        """When the engine's thread next does the chores (its clock); 0: at its next call."""
        self.engine_seen = self.t0
        """When the engine's thread last did the chores: the watchdog acts only after IDLE_S without."""
        self._last_notes = self.t0
        self._lines: list[bytes] = []
        self.rid_text = RidText()
        self.copies: CopyBatch | None = None
        """The copy batch being filled with steps' device tensors for deferred work, under copy_lock
        (the step hook's short path appends to it without the lock: `steps.Steady.busy`)."""
        self.copy_lock = threading.RLock()
        self.batches: BatchRecorder | None = None
        """The copy batches as the runtime drives them; None until the first batch opens."""
        self.send_lock = threading.Lock()
        """Held while batches are sent: the engine's thread and the watchdog never send one twice."""
        self._io_lock = threading.Lock()
        self._graph_lock = threading.Lock()
        self._guarded: dict[tuple[str, Callable[..., Any]], Callable[..., Any]] = {}
        self.drafts: list[StepDraft] = []
        """Finished drafts for reuse (`recycle`): see StepDraft on why drafts are not made afresh."""
        self.runs: list[Run] = []
        """Runs of decode steps (copy_batches.Run) given back for reuse, as `drafts`."""
        self.spare: StepDraft | None = None
        """The last step's draft when that step joined a run of its copy batch (the Run keeps its
        values): the next decode step reuses it, resetting only what a decode step's hooks set."""
        self.steady: Steady | None = None
        """A run of decode-graph replays that the next step may go on by the short path
        (`steps.Steady`, `steps._steady_forward`); None when the next step takes the general one."""
        self.steady_spare: Steady | None = None
        """The probe's one `steps.Steady`, armed again after each general step that can be its first."""
        self._rids: list[str] | None = None
        self.switch = switch
        self._switch_seen: tuple[int, int] | None = None
        self.paused = False
        """True while the switch file says `off`: the per-step hooks do nothing (ENV_SWITCH)."""
        self._gc_started = 0.0
        self._gc_seen: list[list[float]] = []
        self.timing = False
        """Measure the probe's own time on the engine's thread (`watch_gc`'s companion, ENV_SWITCH)."""
        self.cost: list[Any] = [0] * COST_FIELDS
        """Since the last `cost` note: [probe ns, steps, first step's start ns, last step's end ns,
        ready ns, begin ns, end ns, send ns, slow steps, slow steps' ns] (steps._timed_forward), the
        watchdog thread's CPU ns in the rounds where it acted (`_watch_loop`), the pool hook's ns on
        the engine's thread in busy scheduler iterations (pool_hooks.after_get_next_batch_to_run),
        those iterations, the ns and number of those that read the pools (not too soon), and the
        watchdog's CPU ns by phase: sends, finishing records, writing lines; the chores' ns; the
        inner hooks' ns (`timed_inner`); the measuring's own ns within the chores (`chores`); the
        finishing of copy batches by phase, on whichever thread finished them: making the lines,
        writing them, giving back what the batch held (`copy_batches.CopyBatch.run`)."""

    # ------------------------------------------------------------ writing
    def now(self) -> float:
        return round(self.clock() - self.t0, 6)

    def set_rank(self, rank: RankId) -> None:
        """Bind this process to its rank file, write what was held until now, start the watchdog."""
        with self._lock:
            self.rank = rank
            self.rank_json = rank.model_dump_json()
            self.graph.last_flush = self.clock()
        if self.writer_mode == "process":
            self._start_writer()
        held, self._held = self._held, []
        for rec in held:
            if isinstance(rec, ProbeNote) and rec.rank is None:
                rec = rec.model_copy(update={"rank": rank})
            self.write(rec)
        self._start_watchdog()

    def count_graph(self, event: Literal["replay", "eager"], phase: Literal["decode", "prefill"]) -> None:
        """Count one forward's graph decision; the chores write the counts every graph_flush_s.
        No lock: the engine's thread is the counter's only writer (GraphCounter)."""
        self.graph.add(event, phase)

    def _write_graph_counts(self, force: bool, settle: bool = True) -> None:
        """The graph counts since the last written, once `graph_flush_s` has passed (`force`: now).
        `settle`: the engine's thread (its chores, or the probe's close once it stopped) first adds
        the replays that the short path of the step hook holds (`settle_steady`); the watchdog
        does not, as the engine's thread may be counting them (a record of each is written with its
        step, and the graph contract takes the larger of the two counts)."""
        if self.rank is None:
            return
        if not force and self.clock() - self.graph.last_flush < self.graph_flush_s:
            return  # not due: every chores round but one a second ends here, before the lock and `pending`
        if settle:
            self.settle_steady()
        with self._graph_lock:
            now = self.clock()
            if not (self.graph.pending and (force or self.graph.due(now, self.graph_flush_s))):
                return
            assert self.rank_json is not None
            # made into their lines when written, as pool samples are: into the batch being filled
            # without ending its run of steps, which a record would end (`copy_batches.attach_record`)
            counts = self.graph.flush_late(self.rank_json, now)
        for g in counts:
            self.write(g)

    def write(self, record: Record) -> None:
        """Write a record (or its JSON lines, made by the caller, or a tuple of `records.late_line`,
        once the rank is known)."""
        if self._pending and threading.get_ident() != self._runner:
            batches = self.batches
            if batches is not None:
                # A copy batch is being filled: the record joins it after its steps so far, and the
                # batch's later steps come after the record. Closing the batch instead sent it at
                # once, from this thread (the engine's, for a pool sample every 4 steps). Between
                # two batches a record made late (the chores' graph counts and notes, run by the
                # scheduler's hook before the next step opens its batch) joins the closed batch's
                # write, as a pool sample does, instead of a write of its own that a later sample
                # could not join either.
                if batches.attach(self, record):
                    return
                if self.copies is not None:  # close the batch being filled: its later steps follow this
                    batches.send_all(self)
            self._pending.append((self.clock(), _Write(self, record)))
            return
        self._write_now(record)

    def unshadow_kv(self) -> None:
        """At a step's end: the pool's next write goes through the probe's hook again."""
        pool, self.kv_shadowed = self.kv_shadowed, None
        if pool is not None:
            pool.__dict__.pop("set_kv_buffer", None)

    def settle_steady(self, disarm: bool = False) -> None:
        """Add the steps that the step hook's short path put on its run since it was armed or last
        settled (`steps.Steady.n`) to its copy batch's counts and to the graph counter's decode
        replays; `disarm`: the next step takes the general path. On the engine's thread only: it
        is the one that counts them."""
        st = self.steady
        if st is None:
            return
        if disarm:
            self.steady = None
        self.step_index = st.step
        n = st.n
        if n:
            st.n = 0
            st.full -= n
            batch = st.batch
            if batch is not None:  # (a batch another thread took is sent: its counts decide nothing)
                batch.steps += n
                batch.held_rows += n * st.b
            self.graph.totals[st.key] += n

    # ------------------------------------------------------------ per-step objects, kept few
    def recycle(self, draft: StepDraft) -> None:
        """Take a finished draft back for the next step (its references to SGLang's objects dropped)."""
        if len(self.drafts) < MAX_SPARE_DRAFTS:
            draft.rids = draft.kv_mask = draft.kv_mask_pending = draft.split_pending = None  # type: ignore[assignment]
            draft.cp_local_positions = draft.notes = None
            self.drafts.append(draft)

    def same_rids(self, rids: list[str]) -> list[str]:
        """`rids`, or the equal list a previous step kept: a decode batch keeps its requests for
        many steps, and a step then holds the probe's list instead of SGLang's fresh one."""
        last = self._rids
        if last is not None and rids == last:
            return last
        self._rids = rids = list(rids)
        return rids

    def text(self, record: Record) -> str:
        """A record's JSON line: pydantic's, or that of a line or a record made late
        (`records.item_line`)."""
        if isinstance(record, BaseModel):
            return dump_record(record)
        return item_line(record, self.t0)

    def _write_now(self, record: Record) -> None:
        line = (self.text(record) + "\n").encode()
        with self._lock:
            if self.rank is None:
                if isinstance(record, BaseModel):
                    self._held.append(record)
                return
            self._lines.append(line)
        self._write_lines()

    def _write_lines(self) -> None:
        """Write the buffered lines in one `os.write`; a line another thread buffered meanwhile goes
        with them."""
        with self._io_lock:
            with self._lock:
                lines, self._lines = self._lines, []
            if not lines or self.rank is None:
                return
            self._emit([b"".join(lines)])

    def write_items(self, items: list[Any]) -> None:
        """The lines of a finished copy batch (`CopyBatch.run`, on the thread running the pending
        work): lines made already, `steps` lines and pool samples to be made by whoever writes
        them (`records.item_line`), after every line buffered before. With a writer process they
        go to it as they are, without making a line on this thread."""
        with self._io_lock:
            with self._lock:
                lines, self._lines = self._lines, []
            if self.rank is None:
                return
            self._emit([b"".join(lines), *items] if lines else items)

    def _emit(self, items: list[Any]) -> None:
        """Write `items` (encoded lines, or items of `records.item_line`) after everything written
        before: through the writer process while it runs, or here. `_io_lock` is held."""
        writer = self.writer
        if writer is not None:
            if writer.send(items):
                return
            self.writer = None
            writer.kill()
            lost = ProbeNote(t=self.now(), rank=self.rank, level="warning",
                             message="the rank file's writer process ended; lines sent to it and not "
                                     "written are lost, and the probe writes the file itself from here")
            items = [(dump_record(lost) + "\n").encode(), *items]
        data = b"".join(self._line_bytes(i) for i in items)
        if self._fd is None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self._rank_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(self._fd, data)

    def _line_bytes(self, item: Any) -> bytes:
        """One item's line, encoded; an item whose line cannot be made becomes a note saying so
        (written here, where `note` would take the lock held)."""
        if item.__class__ is bytes:
            return item
        try:
            return (item_line(item, self.t0) + "\n").encode()
        except Exception as e:
            self.errors["write"] = self.errors.get("write", 0) + 1
            note = ProbeNote(t=self.now(), rank=self.rank, level="error",
                             message=f"write: {type(e).__name__}: {e}"[:2000])
            return (dump_record(note) + "\n").encode()

    def _rank_path(self) -> Path:
        assert self.rank is not None
        return self.out_dir / rank_file_name(self.rank.world)

    def _start_writer(self) -> None:
        """Start the rank file's writer process (`line_writer`); when it cannot start, the probe
        writes the file itself and says why."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        assert self.rank_json is not None
        writer, why = LineWriter.start(self._rank_path(), self.t0, self.rank_json)
        self.writer = writer
        if writer is None:
            self.note(f"the rank file's writer process did not start ({why}); the probe writes the file "
                      "itself", "warning")

    def note(self, message: str, level: Literal["info", "warning", "error"] = "info") -> None:
        self.write(ProbeNote(t=self.now(), rank=self.rank, level=level, message=message[:2000]))

    def warn_once(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            self.note(message, "warning")

    def flush_held_at_exit(self) -> None:
        """Write held warnings of a process that never learned its rank to pid<pid>.jsonl."""
        if self.rank is not None or not self._held:
            return
        if not any(isinstance(r, ProbeNote) and r.level != "info" for r in self._held):
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / f"pid{self.pid}.jsonl", "a", encoding="utf-8") as f:
            for rec in self._held:
                f.write(dump_record(rec) + "\n")
        self._held = []

    # ------------------------------------------------------------ deferred work
    def defer(self, item: Deferred) -> None:
        """Finish `item` once its device values are on the host, after everything made before it."""
        self._pending.append((self.clock(), item))

    def run_ready(self) -> None:
        """On the engine's thread, at a step's start: finish what the device is done with, in order."""
        pending = self._pending
        if pending and pending[0][1].ready():
            self._run_pending(None)

    def _finish_pending(self, deadline: float | None) -> bool:
        """Send what is left and finish all pending work, polling (never spinning on the device)
        until `deadline`; without one (the engine's thread), what is ready now, waiting for nothing."""
        if self._pending and self.batches is not None:
            self.batches.send_all(self)
        return self._run_pending(deadline)

    def _run_pending(self, deadline: float | None) -> bool:
        """Run pending work in order; True when none is left. Without a deadline (the engine's
        thread) it never waits: not for the lock, which the watchdog may hold, nor for an item."""
        if deadline is None:
            locked = self._pending_lock.acquire(blocking=False)
        else:
            locked = self._pending_lock.acquire(timeout=max(deadline - time.monotonic(), 0.0))
        if not locked:
            return False
        try:
            self._runner = threading.get_ident()
            while self._pending:
                item = self._pending[0][1]
                # Off the engine's thread the device may be asked (`poll`); on it, `ready` only.
                ready = item.ready if deadline is None else getattr(item, "poll", item.ready)
                while not ready():
                    if deadline is None or time.monotonic() > deadline:
                        return False
                    time.sleep(0.001)
                _run(item)  # still first in line: a record another thread writes meanwhile queues behind it
                self._pending.popleft()
            return True
        finally:
            self._runner = None
            self._pending_lock.release()

    def _start_watchdog(self) -> None:
        with self._lock:
            if self._watchdog is not None:
                return
            self._watchdog = threading.Thread(target=self._watch_loop, name="cptest-probe-watchdog",
                                              daemon=True)
            self._watchdog.start()

    def chores(self, now: float) -> None:
        """The probe's periodic work, on the engine's thread once `now` reaches `next_chores` (the step
        hook and the pool hook ask): the run-time switch, the graph counts when due, the measuring
        notes once a second, and deferred work that waited IDLE_S: an idle engine runs no step, so
        the batch being filled is sent IDLE_S after its last step (not while steps still join it:
        they send it at its own bound), and finished by a later call once its copies are on the
        host. Never waits for the device. Timed into the `cost` notes while measuring."""
        self.next_chores = now + CHORES_S
        self.engine_seen = now
        t0 = time.perf_counter_ns() if self.timing else 0
        try:
            # The measuring's own work (the switch, the collector's and the cost notes) first, timed
            # apart: an evidence run does none of it (`cost` field 20).
            if self.switch is not None:
                self.poll_switch()
            if now - self._last_notes >= 1.0:
                self._last_notes = now
                self._write_gc()
                if self.timing:
                    self._write_cost()
            if t0:
                self.cost[20] += time.perf_counter_ns() - t0
            pending = self._pending
            if pending and now - pending[0][0] > IDLE_S:
                batches = self.batches
                if batches is None or not batches.filling(self, now):
                    self._finish_pending(None)
            self._write_graph_counts(force=False)
        except Exception as e:
            self.call("chores", self.error, "chores", e)
        if t0:
            self.cost[18] += time.perf_counter_ns() - t0

    def hook_layers(self, on: bool) -> None:
        """Put the later layers' hooked forwards in place (`on`) or take them away, so that their
        modules run their class's `forward` with no call into the probe (ENV_LAYER_STEPS). The
        engine's thread calls it between forwards, the only time the modules are not running."""
        self.layers_on = on
        for module, forward in self.layer_forwards:
            if on:
                module.__dict__["forward"] = forward
            else:
                module.__dict__.pop("forward", None)

    def _settle_read_credit(self, running: bool) -> None:
        """At a pause or a resume: the read credit grows by the time up to now only where the probe
        was running (`running`), never by a paused spell. The share is of the probe's running time:
        a measuring probe's paused windows would otherwise save up credit that its next running
        window spends, and its cost notes would charge reads twice what an evidence run (never
        paused) pays."""
        now = self.clock()
        if running:
            self._grow_read_credit(now)
        self._read_credit_t = now

    def _grow_read_credit(self, now: float) -> float:
        """The read credit grown by `read_share` of the time since it last grew, up to
        READ_CREDIT_MAX_NS, as of `now`."""
        credit = self.read_credit_ns + self.read_share * (now - self._read_credit_t) * 1e9
        self.read_credit_ns = credit = min(credit, READ_CREDIT_MAX_NS)
        self._read_credit_t = now
        return credit

    def reads_due(self, now: float) -> bool:
        """Whether a sampled decode step (its clock `now`) may record its reads: while the reads'
        credit is not spent. The credit grows by `read_share` of the time that passes, up to
        READ_CREDIT_MAX_NS, and finishing a step that recorded its reads spends what it took
        (`copy_batches._step_line`). Once the lines of those steps reach READ_BYTES_MAX, none
        is due. Each kind of skip is noted once, with the figures; `close` notes how many were
        skipped."""
        credit = self._grow_read_credit(now)
        if self.read_bytes >= READ_BYTES_MAX:
            self.reads_skipped += 1
            if "read_bytes" not in self.warned:
                self.warned.add("read_bytes")
                self.note(f"reads no longer recorded from step {self.step_index}: the steps that recorded "
                          f"them wrote {self.read_bytes:,} bytes, the most a rank file gives them "
                          f"({READ_BYTES_MAX:,}), so that it stays readable")
            return False
        if credit >= 0:
            return True
        self.reads_skipped += 1
        if self.reads_skipped == 1:
            self.note(f"reads sampled less often from step {self.step_index}: finishing the steps that "
                      f"recorded them took {self.read_ns / 1e6:.1f} ms in {now - self.t0:.1f} s, over "
                      f"{self.read_share:.2%} of the time; a sampled step records its reads again once "
                      "within it")
        return False

    def poll_switch(self) -> None:
        """Pause or resume as the switch file says; a stat per call, a read only when it changed."""
        if self.switch is None:
            return
        try:
            st = os.stat(self.switch)
            seen = (st.st_mtime_ns, st.st_size)
            if seen == self._switch_seen:
                return
            self._switch_seen = seen
            paused = self.switch.read_text(encoding="utf-8").strip() == "off"
        except OSError:
            self._switch_seen, paused = None, False
        if paused != self.paused:
            with contextlib.suppress(Exception):
                self._write_cost()  # a cost note never spans a pause
            self._settle_read_credit(running=not self.paused)
            self.paused = paused
            self.settle_steady(disarm=True)  # the step hook's short path does not ask whether it is paused
            self.note(f"probe {'paused' if paused else 'resumed'} by {self.switch}", "info")

    # ------------------------------------------------------------ the collector, when measuring
    def watch_gc(self) -> None:
        """List every collection of generation 1 or 2 (epoch end, generation, seconds, objects
        collected); the chores write them about once a second as a note `gc <JSON list>`. Only for the
        run-time switch's measurements (ENV_SWITCH): a callback on every collection, in both states."""
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif info.get("generation", 0) >= 1:
            self._gc_seen.append([round(time.time(), 4), info["generation"],
                                  round(time.perf_counter() - self._gc_started, 6), info.get("collected", 0)])

    def _write_gc(self) -> None:
        if self._gc_seen and self.rank is not None:
            seen, self._gc_seen = self._gc_seen, []
            # "gc [[epoch_end, generation, seconds, collected], ...]"; a record made late, as the
            # cost note: it follows the run of steps being filled instead of ending it
            assert self.rank_json is not None
            self.write(note_late(self.rank_json, self.clock(), "gc " + json.dumps(seen)))

    def _write_cost(self) -> None:
        """Write what `cost` gathered as a note `cost [epoch, steps, probe_ns, span_ns, ready_ns,
        begin_ns, end_ns, send_ns, slow_steps, slow_ns, watchdog_ns, pool_ns, pool_calls,
        pool_read_ns, pool_reads, watchdog_send_ns, watchdog_finish_ns, watchdog_lines_ns, chores_ns,
        inner_ns, measuring_ns, finish_lines_ns, finish_write_ns, finish_give_back_ns]`:
        - the probe's own time in the per-step hooks' begin and end (deferred records, copies
          included) over `steps` steps that took `span_ns` from the first one's start to the last
          one's end, then that time by part (steps._timed_forward), and the steps whose probe work
          took over steps.SLOW_NS;
        - the CPU time of the watchdog thread in the rounds where it acted (a stalled engine's work,
          off its thread: 0 in a steady decode);
        - the pool hook's time on the engine's thread in busy scheduler iterations, outside the
          forward (not in `probe_ns`), and its split;
        - the watchdog's time by phase;
        - the chores' time on the engine's thread (`chores`, outside both hooks' figures);
        - the inner hooks' own time inside the forwards (`timed_inner`: the KV write, the CP split
          and the layers' row hooks, outside `probe_ns`);
        - the part of the chores' time that is the measuring's own (the run-time switch's stat, the
          collector's and these notes), which an evidence run does not spend;
        - the copy batches' finishing by phase (in `ready_ns` where the engine's thread finished
          them): making the lines, writing them, giving back what the batch held.
        The fields keep their places from when a writer thread did the watchdog's work every round:
        tools/device/probe_windows.py reads notes of every layout."""
        cost, self.cost = self.cost, [0] * COST_FIELDS
        if cost[1] and self.rank is not None:
            seen = [round(time.time(), 4), cost[1], cost[0], cost[3] - cost[2], *cost[4:]]
            assert self.rank_json is not None
            self.write(note_late(self.rank_json, self.clock(), "cost " + json.dumps(seen)))

    def _watch_loop(self) -> None:
        """Every WATCH_S: when the engine's thread has not done its chores for IDLE_S, send and finish
        what it left (waiting for the copies up to 10 IDLE_S) and write the graph counts."""
        while not self._stop.wait(WATCH_S):
            if self.clock() - self.engine_seen <= IDLE_S:
                continue  # the engine's thread comes by: its chores do this
            cpu0 = time.thread_time_ns() if self.timing else 0
            cpu1 = cpu0
            try:
                if self._pending:
                    if self.batches is not None:
                        self.batches.send_all(self)
                    cpu1 = time.thread_time_ns() if cpu0 else 0
                    self._run_pending(time.monotonic() + 10 * IDLE_S)
                self._write_graph_counts(force=False, settle=False)
            except Exception:
                pass
            cpu2 = time.thread_time_ns() if cpu0 else 0
            try:  # noqa: SIM105
                self._write_lines()
            except Exception:
                pass
            if cpu0:
                # By phase: the sends, finishing the records, the write.
                cost = self.cost
                cpu3 = time.thread_time_ns()
                cost[10] += cpu3 - cpu0
                cost[15] += cpu1 - cpu0
                cost[16] += cpu2 - cpu1
                cost[17] += cpu3 - cpu2

    def flush(self, timeout: float = 10.0) -> bool:
        """Write everything observed so far (graph counts too) into the rank file; False if that took
        over `timeout`."""
        end = time.monotonic() + timeout
        finished = self._finish_pending(end)
        if finished:
            self._write_graph_counts(force=True)
            with contextlib.suppress(Exception):
                self._write_gc()
                self._write_cost()
        self._write_lines()
        writer = self.writer
        if writer is not None:  # in the file, not only sent
            finished = writer.sync(max(end - time.monotonic(), 1.0)) and finished
        return finished

    def close(self) -> None:
        if self.reads_skipped:
            self.note(f"{self.reads_skipped} sampled step(s) recorded no reads: finishing the reads took "
                      f"{self.read_ns / 1e6:.1f} ms of {self.now():.1f} s, held within "
                      f"{self.read_share:.2%}, and their lines {self.read_bytes:,} bytes of at most "
                      f"{READ_BYTES_MAX:,}")
        self.flush()
        if self._watchdog is not None:
            self._stop.set()
            self._watchdog.join(timeout=10.0)
            self._watchdog = None
        self._write_lines()
        with self._io_lock:
            writer, self.writer = self.writer, None
            if writer is not None:
                writer.close(timeout=10.0)
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    # ------------------------------------------------------------ containment
    def error(self, hook: str, exc: BaseException) -> None:
        n = self.errors.get(hook, 0) + 1
        self.errors[hook] = n
        if n <= MAX_ERRORS_PER_HOOK:
            suffix = " (further errors of this hook are not written)" if n == MAX_ERRORS_PER_HOOK else ""
            self.note(f"{hook}: {type(exc).__name__}: {exc}{suffix}", "error")

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)`, or None when it raised: the exception becomes a ProbeNote of hook
        `name`. The per-step hooks call this directly; `guarded` wraps it for registration."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # the whole point: nothing escapes into the engine
            with contextlib.suppress(Exception):
                self.error(name, e)
            return None

    def timed_inner(self, fn: F) -> F:
        """`fn`, a hook that fires inside a forward, timed into the `cost` notes' inner field while
        the probe measures itself (`timing`, ENV_SWITCH); `fn` itself otherwise, so that evidence
        runs pay nothing for it. What it cannot count: the call into it (a wrapped module's forward,
        SGLang's hook registry), which benchmarks/probe_step.py bounds."""
        if not self.timing:
            return fn
        clock, probe = time.perf_counter_ns, self

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                probe.cost[19] += clock() - t0

        return timed  # type: ignore[return-value]

    def guarded(self, name: str) -> Callable[[F], F]:
        """Decorator: the wrapped function never raises; an exception becomes a ProbeNote."""

        def deco(fn: F) -> F:
            known = self._guarded.get((name, fn))
            if known is not None:  # per-step callers ask again each step; wrapping costs more than the hook
                return known  # type: ignore[return-value]

            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return self.call(name, fn, *args, **kwargs)

            self._guarded[(name, fn)] = wrapper
            return wrapper  # type: ignore[return-value]

        return deco


def _run(item: Deferred) -> None:
    try:  # noqa: SIM105  # items are guarded; this keeps the probe going (no suppress: per batch, cold)
        item.run()
    except Exception:
        pass


_PROBE: Probe | None = None


def get_probe() -> Probe | None:
    """The process's probe, created on first use when enabled; None when the probe is off."""
    global _PROBE
    if _PROBE is None and enabled():
        _PROBE = Probe(
            Path(os.environ[ENV_DIR]),
            observe_positions=os.environ.get(ENV_POSITIONS, "1") != "0",
            graph_flush_s=float(os.environ.get(ENV_GRAPH_FLUSH_S, "1.0")),
            switch=Path(os.environ[ENV_SWITCH]) if os.environ.get(ENV_SWITCH) else None,
            read_every=max(int(os.environ.get(ENV_READ_EVERY, READ_EVERY_DEFAULT)), 0),
            layers_sampled=os.environ.get(ENV_LAYER_STEPS, "sampled") != "all",
            copy_within_s=_seconds(os.environ.get(ENV_COPY_WITHIN_S), COPY_WITHIN_S),
            copy_every=_steps(os.environ.get(ENV_COPY_EVERY), COPY_EVERY),
            writer="inline" if os.environ.get(ENV_WRITER) == "inline" else "process",
        )
        _PROBE.poll_switch()
        if _PROBE.switch is not None:
            _PROBE.watch_gc()
            _PROBE.timing = True
        atexit.register(_PROBE.flush_held_at_exit)
        atexit.register(_PROBE.flush)
    return _PROBE


def _seconds(text: str | None, default: float) -> float:
    """A positive number of seconds from the environment, or `default` when absent or not one:
    the probe never fails its rank over its own settings."""
    try:
        value = float(text) if text else default
    except ValueError:
        return default
    return value if 0 < value < float("inf") else default


def _steps(text: str | None, default: int) -> int:
    """A positive whole number of steps from the environment, or `default` when absent or not one."""
    try:
        value = int(text) if text else default
    except ValueError:
        return default
    return value if value > 0 else default


def set_probe(probe: Probe | None) -> None:
    """Install a probe (tests) or remove it."""
    global _PROBE
    _PROBE = probe
