"""Batch recording: the device tensors of up to COPY_EVERY steps travel to the host together,
and once they are there their batch writes the steps' lines.

A step's record needs a few values that are still on the device as its forward ends (the batch's
positions, the DCP owner mask, the CP-sharded positions; off with CPTEST_PROBE_POSITIONS=0).
The step recording (`cptest.probe.steps`) hands each step's draft and tensors to the batch
being filled (`CopyBatch.add`, or `join_run` for a decode step of positions alone). A batch is
the probe's deferred work (`Probe.defer`): its copies are sent without waiting, every COPY_EVERY
steps (or `Probe.copy_within_s`), from the engine's thread, and its lines are made once the copies are on
the host (`CopyBatch.run`, at a later step's start), so SGLang never waits on the device for the
probe. The runtime drives the batches only through `BATCHES` (`runtime.BatchRecorder`).

Nothing here imports torch: tensors are asked through their own methods, and `torch` is taken
from `sys.modules`, where the engine that made them has put it.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from cptest.probe import records
from cptest.probe import runtime as _runtime
from cptest.probe.records import StepDraft
from cptest.probe.runtime import BatchRecorder, Probe

COPY_EVERY = _runtime.COPY_EVERY
"""The default of `Probe.copy_every`: steps whose device tensors travel to the host together (see
`CopyBatch`). A batch's CUDA calls, event and write are per batch, and each burst leaves the caches
cold for the steps after it; its finishing grows with its steps, so past a few hundred steps a
larger batch saves nothing (benchmarks/probe_step.py --copy-every)."""
COPY_ROWS = 1 << 16
"""...or unless its runs of decode steps hold this many rows (positions): a run's `steps` line
carries about 12 bytes a row (positions and pool slots packed, the owner mask as digits), and
this keeps it near 0.8 MB, well inside the longest line cptest reads of an evidence file
(`bounds.EVIDENCE`), at any batch size. At 64 requests it is 1,024 steps and never decides."""

_NAMES = ("positions", "kv_mask", "split", "slots", "reads")
WHICH: dict[tuple[bool, bool, bool, bool, bool], tuple[str, ...]] = {
    flags: tuple(n for n, on in zip(_NAMES, flags, strict=True) if on)
    for flags in ((p, m, z, s, r) for p in (False, True) for m in (False, True) for z in (False, True)
                  for s in (False, True) for r in (False, True))
}
"""The names of a step's tensors in its CopyBatch, made once (a draft keeps one of these): the
step recording compares them by identity."""
WHICH_POS, _WHICH_POS_MASK = WHICH[True, False, False, False, False], WHICH[True, True, False, False, False]
_WHICH_POS_MASK_SLOTS = WHICH[True, True, False, True, False]
WHICH_NONE = WHICH[False, False, False, False, False]
_MIXED = object()
"""`CopyBatch.dtype` of a batch whose parts have several dtypes."""
NO_RIDS: list[str] = []
"""What a run given back holds instead of its requests' ids (it keeps no list of SGLang's alive)."""


class Run:
    """Consecutive decode steps of one copy batch that one `steps` line can carry: the same
    requests (the same list, `Probe.same_rids`), tensors, graph size, CP and KV-write shape. Each
    step is kept as a row of its plain values, so the step's draft goes straight back to the probe
    for the next step instead of waiting for the copies, and the batch's `run()` builds the line
    from columns. `rows`: (step, t, rows_in, batch_size, attn_rows, ffn_rows, logits_rows,
    kv_rows, ffn_out_rows, layers) per step; `first`: the index of the first step's first tensor in
    the batch, the steps' tensors following one another (`len(which)` each). Runs are reused, as drafts are
    (`open`, `Probe.runs`): a fresh one per run would live until its batch is finished, long
    enough for Python's collector to move it to its oldest generation (see StepDraft); the rows,
    tuples of plain values, the collector stops tracking at its first look.

    A decode-graph replay that the step hook's short path puts on the run is kept as its clock
    alone, a float (`steps.Steady.compact`): the row before it with the step one further and that
    clock. Its row holds nothing else of its own (no inner hook fires in a replay, and the short
    path sends a step whose `rows_in` differs to the general path), and a batch's finishing then
    touches one object a step instead of three (`_run_block_line`)."""

    __slots__ = ("rids", "which", "cp_configured", "graph_rows", "kv_none", "kv_full", "first", "rows",
                 "pos_2d", "layers", "b")

    def __init__(self) -> None:
        self.pos_2d = False
        """The run's positions are M-RoPE's [3, n] (its first step said so): each step's first row is kept."""
        self.rids: list[str] = []
        self.b = 0
        """len(rids): the rows each of its steps adds to its batch's `held_rows` (COPY_ROWS)."""
        self.which: tuple[str, ...] = ()
        self.cp_configured: bool | None = None
        self.graph_rows: int | None = None
        self.layers = 0
        """The layers its first step ran (`StepDraft.attn_layers`; 0: not observed, a replay). Its
        steps all observed layers or none; how many, each step's row says (a decode step that
        hooks every layer goes on the run of those that hook the first alone, `Probe.hook_layers`)."""
        self.kv_none = self.kv_full = False
        self.first = 0
        self.rows: list[Any] = []
        """Each step's row (a tuple), or a replay's clock alone (a float, see the class)."""

    @staticmethod
    def open(probe: Probe, draft: StepDraft, first: int) -> Run:
        """A run for `draft`'s step and those that fit it (a spare one, or a new one)."""
        try:  # the watchdog may give runs back while the engine's thread takes them
            run = probe.runs.pop()
        except IndexError:
            run = Run()
        run.rids = draft.rids
        run.b = len(draft.rids)
        run.which = draft.which
        run.cp_configured = draft.cp_configured
        run.graph_rows = draft.graph_rows
        run.layers = draft.attn_layers
        kv_rows = draft.kv_rows
        run.kv_none = kv_rows is None
        run.kv_full = kv_rows == len(draft.rids)
        run.first = first
        run.pos_2d = False
        return run

    def close(self, probe: Probe) -> None:
        """Give the run back for reuse, its lines made."""
        self.rows.clear()
        self.rids = NO_RIDS
        runs = probe.runs
        if len(runs) < _runtime.MAX_SPARE_DRAFTS:
            runs.append(self)

    def expand(self) -> None:
        """Each compact row (a float) made the row it stands for, in place (the short path's bound
        `append` stays this list's)."""
        rows = self.rows
        last: tuple[Any, ...] = rows[0]
        if last.__class__ is not tuple:
            raise ValueError("a run's first row is a whole one")
        out = []
        for r in rows:
            last = (last[0] + 1, r, *last[2:]) if r.__class__ is float else r
            out.append(last)
        rows[:] = out

    def draft(self, probe: Probe, k: int) -> StepDraft:
        """Step `k` as the draft it was made from (a spare one, filled again; `expand` first)."""
        step, t, rows_in, batch_size, attn, ffn, logits, kv_rows, ffn_out, layers = self.rows[k]
        rids = self.rids
        try:  # the watchdog may finish batches while the engine's thread takes drafts too
            d = probe.drafts.pop()
        except IndexError:
            d = StepDraft(step=0, mode="decode", batch_size=0, rows_in=0, rids=rids)
        StepDraft.__init__(d, step=step, mode="decode", batch_size=batch_size, rows_in=rows_in, rids=rids,
                           cp_configured=self.cp_configured, attn_rows_seen=attn, ffn_rows=ffn,
                           logits_rows=logits, kv_rows=kv_rows, graph_rows=self.graph_rows, t=t,
                           first=self.first + k * len(self.which), which=self.which, ffn_out_rows=ffn_out,
                           attn_layers=layers)
        return d


class CopyBatch:
    """Up to COPY_EVERY steps: their device tensors, brought to host memory together, what each
    step's record needs besides them, and the probe's deferred work for them (`Probe.defer`, once,
    when the batch opens).

    `send()` concatenates the tensors of each dtype (positions, the DCP mask) and copies each
    result with `non_blocking=True` (into pinned memory, on the stream of the steps, after the
    kernels that made them), marked by one event: a few CUDA calls per batch instead of a copy
    and an event per step, each of which cost 10-20 us of the engine's CPU on the GPU machine.
    One `torch.cat` over positions and masks together cost 196 us there (its dtype promotion
    converts every bool tensor on its own; benchmarks/cuda_ops.py, results/_measure), so
    each dtype is concatenated apart. Until then the tensors are held as SGLang made them: the pinned
    release allocates positions and the DCP mask afresh for every forward
    (model_executor/forward_batch_info.py:904,923,967), so holding them keeps them unchanged.
    Host tensors (tests, CPU) are cloned when added.

    `items` holds, in the order they were made: `Run`s of decode steps that can share a `steps`
    line (a step joins the run being filled when it fits, `add`), other steps' drafts, and records
    written while the batch was being filled (`attach_record`; a record ends the run). A pool
    sample (a `records.pool_sample_late` tuple) does not end the run: it waits in `later` until the
    run ends (another step, record or the batch's end), so its line follows the run's `steps`
    line instead of splitting it in two. `run()`, once the copies are on the host, writes
    all their lines in one go and hands the drafts back for reuse: one deferred item and one write
    per batch, not per step.
    """

    __slots__ = ("probe", "born", "parts", "steps", "device", "stream", "sizes", "where", "host",
                 "done", "values_", "items", "run_", "arrived", "later", "held_rows", "dtype", "ends")

    def __init__(self, probe: Probe, born: float) -> None:
        self.probe = probe
        self.born = born
        self.parts: list[Any] = []
        self.steps = 0
        self.held_rows = 0
        """Rows its runs' steps hold (a row per request a step): it closes at COPY_ROWS."""
        self.device: Any = None
        self.stream: Any = None
        self.sizes: list[int] = []
        """Values of each part, 1-D (see `dtype`). A run's steps appended after the general path's
        (`join_run`, the step hook's short path) are one request's position each, the run's `b`
        values: they get their sizes together, when the batch next adds a step, ends the run or is
        sent (`_size_run_parts`)."""
        self.dtype: Any = None
        """The dtype of every part added by `add`, or _MIXED. A run's later parts are its positions
        too, of its first step's dtype: `send` checks that the concatenation says so."""
        self.where: list[tuple[int, int, int]] = []
        """Part -> (its dtype's group, start, end) in that group's host copy, made by `_cat` for
        a batch of several dtypes (`span`)."""
        self.ends: list[int] = []
        """Each part's end in the one host copy of a batch of one dtype (`span`)."""
        self.host: Any = None
        self.done: Any = None
        self.values_: Any = None
        self.items: list[Any] = []
        """Runs, drafts and records (a record or its line), in order (see the class)."""
        self.run_: Run | None = None
        """The run the next step may join: the last item, while it is a run."""
        self.arrived = False
        """The host copies are complete (`poll` saw the event); read without a device call."""
        self.later: list[Any] = []
        """Pool samples made while the run being filled went on: they join `items` when it ends."""

    def fits(self, tensors: list[Any]) -> bool:
        """Whether a step's tensors go with this batch's (one step's tensors share a device)."""
        return self.device is None or tensors[0].device == self.device

    def add(self, draft: StepDraft, tensors: list[Any]) -> bool:
        """Hold one step and its tensors. True when the step joined a run: its draft is free again
        (the run keeps its values); False when the batch keeps the draft (`draft.first` is the
        index of its first tensor)."""
        self._size_run_parts()
        parts = self.parts
        first = len(parts)
        if tensors:
            if self.device is None:
                self.device = tensors[0].device
                if tensors[0].is_cuda:
                    self.stream = sys.modules["torch"].cuda.current_stream(self.device)
            if self.stream is None:
                tensors = [t.clone() for t in tensors]  # host tensors: the caller may change them
            dtype, sizes = self.dtype, self.sizes
            for t in tensors:
                if t.dim() != 1:
                    t = t.reshape(-1)
                d = t.dtype
                if dtype is None:
                    dtype = d
                elif d is not dtype:
                    dtype = _MIXED
                parts.append(t)
                sizes.append(t.numel())
            self.dtype = dtype
        self.steps += 1
        which, rids = draft.which, draft.rids
        if ((which is WHICH_POS or which is _WHICH_POS_MASK or which is _WHICH_POS_MASK_SLOTS)
                and draft.mode == "decode" and rids
                and not draft.cp_active and draft.extend_lens is None and draft.notes is None
                and draft.layer_rows is None and draft.dp_buffer is None):
            kv_rows = draft.kv_rows
            run = self.run_
            if (run is None or run.rids is not rids or run.which is not which
                    or run.cp_configured is not draft.cp_configured or run.graph_rows != draft.graph_rows
                    or (not run.layers) is not (not draft.attn_layers)
                    or run.kv_none is not (kv_rows is None) or run.kv_full is not (kv_rows == len(rids))):
                if self.later:
                    self.end_run()
                run = self.run_ = Run.open(self.probe, draft, first)
                self.items.append(run)
            run.rows.append((draft.step, draft.t, draft.rows_in, draft.batch_size, draft.attn_rows_seen,
                             draft.ffn_rows, draft.logits_rows, kv_rows, draft.ffn_out_rows,
                             draft.attn_layers))
            self.held_rows += run.b
            return True
        draft.first = first
        self.end_run()
        self.items.append(draft)
        return False

    def _size_run_parts(self) -> None:
        """The sizes of the parts appended to the run being filled since the batch last added a
        step (`sizes`): `b` each, one position per request."""
        missing = len(self.parts) - len(self.sizes)
        if missing > 0 and self.run_ is not None:
            self.sizes.extend([self.run_.b] * missing)

    def end_run(self) -> None:
        """No further step joins the run being filled: the pool samples made during it follow it."""
        self._size_run_parts()
        self.run_ = None
        later = self.later
        if later:
            self.items.extend(later)
            later.clear()

    def send(self, on_engine_thread: bool = False) -> None:
        """Start the host copies on the steps' stream: entered only when the caller is not on it
        already (another thread, `send_copies`), as entering it costs 8.8 us on the GPU machine.
        Off the engine's thread (the watchdog) the stream is entered for each batch: set once as
        that thread's current stream instead, and on the H200 the last step of a batch then read
        back values from before its own kernels ran (tests/probe/test_hooks_cuda.py):
        the copy was not ordered after them on the steps' stream."""
        if self.host is not None:
            return
        torch = sys.modules["torch"]
        self._size_run_parts()
        parts = self.parts
        if not parts:
            self.host = ()  # steps without tensors: nothing to wait for
        elif self.stream is None:
            self.host = self._cat(torch)
        elif on_engine_thread and torch.cuda.current_stream(self.device) == self.stream:
            self._copy(torch)  # already on the steps' stream (2.9 us to ask, 8.8 to enter)
        else:
            with torch.cuda.stream(self.stream):
                self._copy(torch)
        self.parts = []

    def _cat(self, torch: Any) -> list[Any]:
        """The parts concatenated, one tensor per dtype. Parts of one dtype (a run of positions,
        the usual batch) go into one `torch.cat` as they are: asking each part its size and dtype
        cost more than the concatenation once the engine's work left the caches cold. The result
        must then hold every value `sizes` says, in that dtype (a run's later parts are not asked
        one by one); otherwise (or where a part is not 1-D, which torch.cat refuses), and for parts
        of several dtypes, each part is asked."""
        parts, dtype = self.parts, self.dtype
        if dtype is not None and dtype is not _MIXED and len(self.sizes) == len(parts):
            try:
                whole = torch.cat(parts)
            except RuntimeError:  # a later part that is not 1-D (M-RoPE's [3, n] mid-run)
                whole = None
            if whole is not None and whole.dtype == dtype and whole.numel() == sum(self.sizes):
                return [whole]
        index: dict[Any, int] = {}
        groups: list[list[Any]] = []
        totals: list[int] = []
        where: list[tuple[int, int, int]] = []
        sizes: list[int] = []
        for t in parts:
            n = t.numel()
            d = t.dtype
            g = index.get(d)
            if g is None:
                g = index[d] = len(groups)
                groups.append([])
                totals.append(0)
            start = totals[g]
            totals[g] = start + n
            where.append((g, start, start + n))
            sizes.append(n)
            groups[g].append(t if t.dim() == 1 else t.reshape(-1))
        self.where, self.sizes = where, sizes
        return [torch.cat(g) for g in groups]

    def _copy(self, torch: Any) -> None:
        """The copies, on the steps' stream (the current one: `send` made sure)."""
        self.host = [whole.to("cpu", non_blocking=True) for whole in self._cat(torch)]
        self.done = torch.cuda.Event()
        self.done.record(self.stream)  # the current stream, named: Event.record would look it up

    def ready(self) -> bool:
        """Whether `run` may go: the copies' event asked once (`poll`), never waited for."""
        return self.arrived or self.poll()

    def poll(self) -> bool:
        """Ask the device whether the copies are complete (never waits); True once they are."""
        if self.arrived:
            return True
        if self.host is None:
            return False
        done = self.done  # another thread may poll too: read the event once
        if done is not None and not done.query():
            return False
        self.done = None  # arrived: later asks need no device query
        self.arrived = True
        return True

    def part(self, i: int) -> Any:
        """Part `i` as a numpy view of the host copy (no per-value Python objects: the record
        packs it, `records.finish_step_line`)."""
        if self.values_ is None:
            done = self.done
            if done is not None and not self.arrived:
                done.synchronize()
            self.values_ = [h.numpy() for h in self.host]
        g, start, end = self.span(i)
        return self.values_[g][start:end]

    def span(self, i: int) -> tuple[int, int, int]:
        """Part `i`'s (dtype group, start, end) in its group's host copy. A batch of one dtype, sent
        as one concatenation (`_cat`), has one group, in which each part follows the one before:
        its ends are summed once, where a tuple per part cost the finishing of every batch."""
        if self.where:
            return self.where[i]
        ends = self.ends
        if not ends:
            ends = self.ends = list(accumulate(self.sizes))
        end = ends[i]
        return 0, end - self.sizes[i], end

    def rows(self, parts: Sequence[int], width: int) -> Any:
        """Parts `parts` (each `width` values) as one 2-D numpy array, a row per part. Parts of one
        dtype are laid out one after another in their host copy, so consecutive steps' positions
        are already a block there: a view, where stacking them cost 30 us a batch."""
        self.part(parts[0])  # the host values, once
        g, start, _ = self.span(parts[0])
        g_last, _, end = self.span(parts[-1])
        if g_last == g and end - start == len(parts) * width:
            return self.values_[g][start:end].reshape(len(parts), width)
        return sys.modules["numpy"].stack([self.part(i) for i in parts])

    def run(self) -> None:
        """Write the batch's records (each line's errors contained on its own), then give its
        drafts back to the probe. A run of decode steps becomes one `steps` line
        (`records.steps_block_line`) where it can; any other step gets its own line. The steps'
        notes (a KV write not seen, ...) follow the lines, in the order of the steps."""
        probe = self.probe
        lines: list[Any] = []
        """Lines made here, and the `steps` lines and pool samples made by whoever writes them
        (`Probe.write_items`, `records.item_line`)."""
        noted: list[Any] = []
        """Drafts (whose notes are written after the lines, in order, then given back) and notes."""
        runs: list[Run] = []
        # While measuring, the finishing's three phases go into the cost notes apart (their last
        # three fields): making the lines, writing them (or handing them to the writer process),
        # giving the drafts, runs and host copies back.
        t0 = time.perf_counter_ns() if probe.timing else 0
        self.end_run()
        for item in self.items:
            cls = item.__class__
            if cls is Run:
                probe.call("step_end", _run_lines, probe, self, item, lines, noted)
                runs.append(item)
                continue
            if cls is StepDraft:
                line = probe.call("step_end", _step_line, probe, self, item)
                noted.append(item)
            elif cls is tuple:  # a record made late (records.late_line): made into its line when written
                line = item
            else:
                line = probe.call("write", probe.text, item)
            if line is not None:
                lines.append(line)
        self.items = []
        self.run_ = None
        t1 = time.perf_counter_ns() if t0 else 0
        if lines:
            probe.write_items(lines)  # before the host copies, which its `steps` lines view, are given back
        t2 = time.perf_counter_ns() if t0 else 0
        for draft in noted:
            if draft.__class__ is str:
                probe.warn_once(re.sub(r"\d+", "N", draft), draft)
                continue
            if draft.notes:
                for n in draft.notes:
                    probe.warn_once(re.sub(r"\d+", "N", n), n)
            probe.recycle(draft)
        for run in runs:
            run.close(probe)
        self.values_ = None
        self.host = ()  # done with, and not None: a send that finds it still in line skips it
        if t0:
            cost = probe.cost
            cost[21] += t1 - t0
            cost[22] += t2 - t1
            cost[23] += time.perf_counter_ns() - t2


def _run_lines(probe: Probe, batch: CopyBatch, run: Run, lines: list[Any], noted: list[Any]) -> None:
    """The lines of `run`'s steps: one `steps` line from the first step whose tensors to the end
    are one value per request each; a line of its own for each step before it, and for a step
    left alone (a `steps` line holds two or more). Ids that JSON would escape or that repeat make
    every step a line of its own (`records.finish_step_line` says how)."""
    rows = run.rows
    n, b, width = len(rows), len(run.rids), len(run.which)
    quoted = probe.rid_text.of(run.rids, distinct=True)
    sizes = batch.sizes
    end = run.first + n * width
    floats = list(map(type, rows)).count(float)  # compact rows (see Run), counted at C speed
    if floats:
        if (floats == n - 1 and rows[0].__class__ is tuple and quoted is not None
                and sizes[run.first:end].count(b) == n * width):
            # one whole row and its replays' clocks: one `steps` line, made from them as they are
            line = probe.call("step_end", _run_block_line, probe, batch, run, 0, quoted, noted)
            if line is not None:
                lines.append(line)
            return
        run.expand()
    for k in range(n):
        if (quoted is not None and n - k > 1
                and sizes[run.first + k * width:end].count(b) == (n - k) * width):
            line = probe.call("step_end", _run_block_line, probe, batch, run, k, quoted, noted)
            if line is not None:
                lines.append(line)
            return
        draft = run.draft(probe, k)
        line = probe.call("step_end", _step_line, probe, batch, draft)
        noted.append(draft)
        if line is not None:
            lines.append(line)


def _run_block_line(probe: Probe, batch: CopyBatch, run: Run, k: int, quoted: str,
                    noted: list[Any]) -> tuple[Any, ...]:
    """The `steps` line of `run`'s steps from `k` (`_run_lines` said they fit one), as its fields
    (`records.steps_block_late`): its arrays are views of the batch's host copies, made into the
    line or copied out before the batch is given back (`CopyBatch.run`)."""
    assert probe.rank_json is not None
    rows = run.rows[k:] if k else run.rows
    b, width = len(run.rids), len(run.which)
    first = run.first + k * width
    head = rows[0]
    n = len(rows)
    # The KV source is the same for every step of a run (its key); so is a note's pattern, which
    # is said once (Probe.warn_once): the first step's.
    kv, note = records.kv_source_of("decode", head[0], run.graph_rows, head[7], b, b if width >= 2 else None)
    if note is not None:
        noted.append(note)
    end = first + len(rows) * width
    # Positions and slots as the line packs them (int32, records._packed_pos): half the bytes to
    # hand to the writer process, and a copy of the batch's host memory, which is reused.
    positions = batch.rows(range(first, end, width), b).astype("<i4")
    mask = batch.rows(range(first + 1, end, width), b) if kv == "mask" else None
    slots = None
    if width == 3 and kv == "mask":
        slots = _pool_rows(probe, batch.rows(range(first + 2, end, width), b)).astype("<i4")
    if rows[-1].__class__ is float:  # the head's row, then its replays' clocks alone (_run_lines)
        step: Sequence[Any] = range(head[0], head[0] + n)
        clock: Sequence[Any] = [head[1], *rows[1:]]
        _, _, rows_in, _, attn, ffn, logits, _, ffn_out, layers = ((v,) * n for v in head)
    else:
        step, clock, rows_in, _, attn, ffn, logits, _, ffn_out, layers = zip(*rows, strict=True)
    # Made into its line by whoever writes it (records.item_line: the probe's writer process, or
    # `Probe.write_items` here): its `t` is each step's _record_t.
    return records.steps_block_late(
        clock, step=step, rows_in=rows_in, attn_rows=attn, ffn_rows=ffn, logits_rows=logits,
        cp_configured=run.cp_configured, graph_rows=run.graph_rows, rank_json=probe.rank_json, quoted=quoted,
        positions=positions, kv=kv, mask=mask, ffn_out_rows=ffn_out, layers=layers, slots=slots)


def send_copies(probe: Probe) -> None:
    """Send the batch being filled and every closed batch not sent yet: the probe must finish its
    pending work now (`BatchRecorder.send_all`)."""
    with probe.copy_lock:
        detached, probe.copies = probe.copies, None
        st = probe.steady_spare
        if st is not None and st.batch is detached:
            st.batch = None  # the short path's next step takes the general one
    # The step hook's short path appends to the batch without the lock: a step that read the batch
    # before it was taken finishes going on it first (a few us; bounded, in case that thread is gone).
    give_up = time.monotonic() + 1.0
    while st is not None and st.busy and time.monotonic() < give_up:
        time.sleep(0)
    # Under `send_lock`, not `copy_lock`: the engine's thread takes copy_lock every step, and the
    # watchdog, which may be sending, must not hold it meanwhile.
    with probe.send_lock:
        if detached is not None:
            detached.send()
        for _, item in list(probe._pending):  # a C-level copy, whole under the GIL
            if isinstance(item, CopyBatch) and item.host is None and item is not probe.copies:
                item.send()


def close_locked(probe: Probe, on_engine_thread: bool = False) -> None:
    """No further step joins the batch being filled (copy_lock held): send it."""
    batch, probe.copies = probe.copies, None
    if batch is not None:
        if on_engine_thread and probe.timing:
            t0 = time.perf_counter_ns()
            batch.send(on_engine_thread)
            probe.cost[7] += time.perf_counter_ns() - t0
        else:
            batch.send(on_engine_thread)


def attach_record(probe: Probe, record: Any) -> bool:
    """Put `record` into the batch being filled, after its steps so far (`Probe.write`): the
    batch stays open, and is sent when full; the next step starts a new run.
    A record made late (a tuple: a pool sample, `records.pool_sample_late`, the graph counts,
    `records.graph_count_late`, or the measuring's notes, `records.note_late`) is the exception:
    the run goes on, and the record is written after the run's steps (`CopyBatch.later`). With no
    batch being filled, it joins the last closed batch still waiting to be written
    (`_after_closed`). False when it joined neither. The batch being filled is the last of the
    pending work: a record written after it opened went into it, and it is detached before it is
    sent."""
    with probe.copy_lock:
        batch = probe.copies
        if batch is None or batch.host is not None:
            return record.__class__ is tuple and _after_closed(probe, record)
        if record.__class__ is tuple:
            batch.later.append(record)
            return True
        batch.end_run()
        batch.items.append(record)
        return True


def _after_closed(probe: Probe, record: tuple[Any, ...]) -> bool:
    """Put a pool sample made between two batches after the lines of the last closed batch, when
    that batch is the last of the pending work: it is written in the batch's one write, where
    alone it cost a deferred item and a write of its own. Once a batch is sent, the next step
    opens the next batch, so the pool hook's sample every few steps fell between two batches as
    often as not. Under the pending work's lock, taken without waiting: no other thread is
    writing that batch meanwhile; when the lock is busy the sample is written as any record."""
    if not probe._pending_lock.acquire(blocking=False):
        return False
    try:
        pending = probe._pending
        last = pending[-1][1] if pending else None
        if last.__class__ is not CopyBatch or last is probe.copies:
            return False
        last.later.append(record)  # CopyBatch.run takes `later` after its items, as end_run does
        return True
    finally:
        probe._pending_lock.release()


def open_batch(probe: Probe) -> CopyBatch:
    """A new batch, deferred at once: records written after it wait for its steps."""
    batch = CopyBatch(probe, probe.clock())
    probe.copies, probe.batches = batch, BATCHES  # the runtime drives the batches from the first one on
    probe.defer(batch)
    return batch


def close_if_due(probe: Probe, batch: CopyBatch) -> None:
    """After a step joined `batch` (copy_lock held): send it when full (`probe.copy_every` steps or
    COPY_ROWS rows), or once its first step is `probe.copy_within_s` old (slow steps: records stay
    timely)."""
    if (batch.steps >= probe.copy_every or batch.held_rows >= COPY_ROWS
            or probe.clock() >= batch.born + probe.copy_within_s):
        close_locked(probe, on_engine_thread=True)


def still_filling(probe: Probe, now: float) -> bool:
    """Whether the oldest pending work is the batch being filled and steps still join it: its last
    step is under IDLE_S old at `now` and the batch under `probe.copy_within_s` (the chores ask,
    `BatchRecorder.filling`). Then its own steps send it at its bound; the chores send it only once
    the engine stops stepping (idle, paused, or between workloads). The last step's clock is read
    from the batch's items, so the steps pay nothing for it."""
    with probe.copy_lock:
        batch = probe.copies
        if batch is None or batch.host is not None or now >= batch.born + probe.copy_within_s:
            return False
        pending = probe._pending
        if not pending or pending[0][1] is not batch:
            return False
        last = batch.born
        for item in reversed(batch.items):
            cls = item.__class__
            if cls is Run:
                row = item.rows[-1] if item.rows else None
                last = last if row is None else row if row.__class__ is float else row[1]
                break
            if cls is StepDraft:
                last = item.t
                break
        return now - last < _runtime.IDLE_S


def join_run(probe: Probe, draft: StepDraft, pos_t: Any) -> bool:
    """A decode step of positions alone that goes on the run being filled (`CopyBatch.add`'s test,
    inline): its row and positions join the run without the general path's reads of the tensor
    (`ndim`, and `device` for `CopyBatch.fits`: each a call into torch, several us on the engine's
    thread once a step after the engine's work). The run's first step was checked for both: a
    rank's forward batches live on its one device, and the run keeps M-RoPE's shape (`Run.pos_2d`).
    False when the step does not fit the run: it takes the general path."""
    rids = draft.rids
    with probe.copy_lock:
        batch = probe.copies
        if batch is None:
            return False
        run = batch.run_
        if (run is None or run.rids is not rids or run.which is not WHICH_POS or draft.mode != "decode"
                or draft.cp_active or draft.extend_lens is not None or draft.notes is not None
                or run.cp_configured is not draft.cp_configured or run.graph_rows != draft.graph_rows
                or (not run.layers) is not (not draft.attn_layers) or draft.layer_rows is not None
                or draft.dp_buffer is not None):  # a buffer is said on the step's own line (CopyBatch.add)
            return False
        kv_rows = draft.kv_rows
        if run.kv_none is not (kv_rows is None) or run.kv_full is not (kv_rows == len(rids)):
            return False
        batch.parts.append(pos_t[0] if run.pos_2d else pos_t)
        batch.steps += 1
        batch.held_rows += run.b
        run.rows.append((draft.step, draft.t, draft.rows_in, draft.batch_size, draft.attn_rows_seen,
                         draft.ffn_rows, draft.logits_rows, kv_rows, draft.ffn_out_rows, draft.attn_layers))
        probe.spare = draft  # its run keeps its values: the draft serves the next step
        close_if_due(probe, batch)
    return True


def _step_line(probe: Probe, batch: CopyBatch, draft: StepDraft) -> str:
    """The Step record's line of one step of `batch`, its host copies arrived; a step that
    recorded its reads has its time spent from the reads' credit and its line's bytes counted."""
    if "reads" in draft.which:
        t0 = time.perf_counter_ns()
        line = _line_of(probe, batch, draft)
        took = time.perf_counter_ns() - t0
        probe.read_ns += took
        probe.read_credit_ns -= took  # what `Probe.reads_due` holds within its share
        probe.read_bytes += len(line)  # characters: bytes, for the ids SGLang makes
        return line
    return _line_of(probe, batch, draft)


def _line_of(probe: Probe, batch: CopyBatch, draft: StepDraft) -> str:
    """`_step_line`'s work: the step's host values onto its draft, then its line."""
    assert probe.rank is not None and probe.rank_json is not None
    positions = None
    for k, name in enumerate(draft.which):
        value = batch.part(draft.first + k)
        if name == "positions":
            positions = value
        elif name == "kv_mask":
            draft.kv_mask = value  # 0/1 (or bools): truth is what counts; a numpy view
        elif name == "slots":
            draft.kv_slots = _pool_rows(probe, value)
        elif name == "reads":
            draft.kv_read = records.read_rows(value, draft.read_lens or (), draft.read_rids or (),
                                              probe.dcp_size, probe.dcp_rank, draft.note) or {}
        else:
            _resolve_split(draft, value.tolist())
    return records.finish_step_line(draft, rank=probe.rank, rank_json=probe.rank_json,
                                    t=_record_t(probe, draft.t), positions=positions, rid_text=probe.rid_text)


def _pool_rows(probe: Probe, slots: Any) -> Any:
    """The rows of this rank's own pool that the allocator's slots `slots` name: slot // dcp under
    DCP (each rank keeps every dcp-th slot), the slots themselves without."""
    return slots // probe.dcp_size if probe.dcp_size > 1 else slots


def _record_t(probe: Probe, clock: float) -> float:
    """A step's `t` from the clock as its forward returned: what `Probe.now` said then."""
    return round(clock - probe.t0, 6)


def _resolve_split(draft: StepDraft, sharded: list[int]) -> None:
    _, keep, layout = draft.split_pending
    draft.split_pending = None
    split = records.split_local(sharded[:keep], layout, draft.rids, draft.extend_lens)
    if split is None:
        draft.note(f"step {draft.step}: the sharded positions do not fit the split's layout {layout}")
    draft.cp_local_positions = split


BATCHES = BatchRecorder(attach=attach_record, send_all=send_copies, filling=still_filling)
"""The copy batches as the runtime drives them (`Probe.batches`, installed by `open_batch`)."""
