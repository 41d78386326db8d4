"""Hook bodies: read plain values out of SGLang 0.5.17 objects and hand them to `records`.

Every function here is called by SGLang's HookRegistry wrappers (see `plugin.TARGETS`) or by
torch forward hooks (`forward_hooks`). Each one is wrapped by `Probe.guarded`, or contains its
own errors (`guards_itself`: the hooks called every layer or every step), so an exception
becomes a ProbeNote and never reaches SGLang. AFTER hooks return None, which HookRegistry reads as
"keep the original result" (plugins/hook_registry.py:375-383). Nothing here mutates a tensor or an
SGLang object. The only device->host copies (the batch's positions, the DCP owner mask, the
zigzag-sharded positions; off with CPTEST_PROBE_POSITIONS=0) are sent every COPY_EVERY steps
(or COPY_WITHIN_S) without waiting (`CopyBatch`); a step's record is finished at the start of a
later step once they are on the host (`Probe.defer`, `Probe.run_ready`), so SGLang never waits
on the device for the probe.

The SGLang line cited at each function is the 0.5.17 wheel's `sglang/srt/<path>:<line>`.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from cptest.probe import records
from cptest.probe import runtime as _runtime
from cptest.probe.records import StepDraft
from cptest.probe.runtime import Probe, get_probe


def _int_list(values: Any) -> list[int] | None:
    """A small CPU list or tensor as ints; None stays None. Only for host-side metadata."""
    if values is None:
        return None
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [int(v) for v in values]


def _text_positions(t: Any) -> Any:
    """M-RoPE positions are [3, n]: the first row is the text position."""
    return t[0] if getattr(t, "ndim", 1) == 2 else t


COPY_EVERY = 16
"""Steps whose device tensors travel to the host together (see `CopyBatch`)..."""
COPY_WITHIN_S = 0.1
"""...unless the first of them is older than this (slow steps: records stay timely)."""


class Run:
    """Consecutive decode steps of one copy batch that one `steps` line can carry: the same
    requests (the same list, `Probe.same_rids`), tensors, graph size, CP and KV-write shape. Each
    step is kept as a row of its plain values, so the step's draft goes straight back to the probe
    for the next step instead of waiting for the copies, and the batch's `run()` builds the line
    from columns. `rows`: (step, t, rows_in, batch_size, attn_rows, ffn_rows, logits_rows,
    kv_rows) per step; `first`: the index of the first step's first tensor in the batch, the
    steps' tensors following one another (`len(which)` each). Runs are reused, as drafts are
    (`open`, `Probe.runs`): a fresh one per run would live until its batch is finished, long
    enough for Python's collector to move it to its oldest generation (see StepDraft); the rows,
    tuples of plain values, the collector stops tracking at its first look."""

    __slots__ = ("rids", "which", "cp_configured", "graph_rows", "kv_none", "kv_full", "first", "rows",
                 "pos_2d")

    def __init__(self) -> None:
        self.pos_2d = False
        """The run's positions are M-RoPE's [3, n] (its first step said so): each step's first row is kept."""
        self.rids: list[str] = []
        self.which: tuple[str, ...] = ()
        self.cp_configured: bool | None = None
        self.graph_rows: int | None = None
        self.kv_none = self.kv_full = False
        self.first = 0
        self.rows: list[tuple[Any, ...]] = []

    @staticmethod
    def open(probe: Probe, draft: StepDraft, first: int) -> Run:
        """A run for `draft`'s step and those that fit it (a spare one, or a new one)."""
        try:  # the writer thread gives runs back while the engine's thread takes them
            run = probe.runs.pop()
        except IndexError:
            run = Run()
        run.rids = draft.rids
        run.which = draft.which
        run.cp_configured = draft.cp_configured
        run.graph_rows = draft.graph_rows
        kv_rows = draft.kv_rows
        run.kv_none = kv_rows is None
        run.kv_full = kv_rows == len(draft.rids)
        run.first = first
        run.pos_2d = False
        return run

    def close(self, probe: Probe) -> None:
        """Give the run back for reuse, its lines made."""
        self.rows.clear()
        self.rids = _NO_RIDS
        runs = probe.runs
        if len(runs) < _runtime.MAX_SPARE_DRAFTS:
            runs.append(self)

    def draft(self, probe: Probe, k: int) -> StepDraft:
        """Step `k` as the draft it was made from (a spare one, filled again)."""
        step, t, rows_in, batch_size, attn, ffn, logits, kv_rows = self.rows[k]
        rids = self.rids
        try:  # the writer thread finishes batches while the engine's thread takes drafts too
            d = probe.drafts.pop()
        except IndexError:
            d = StepDraft(step=0, mode="decode", batch_size=0, rows_in=0, rids=rids)
        StepDraft.__init__(d, step=step, mode="decode", batch_size=batch_size, rows_in=rows_in, rids=rids,
                           cp_configured=self.cp_configured, attn_rows_seen=attn, ffn_rows=ffn,
                           logits_rows=logits, kv_rows=kv_rows, graph_rows=self.graph_rows, t=t,
                           first=self.first + k * len(self.which), which=self.which)
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
    converts every bool tensor on its own; benchmarks/cuda_ops.py, results/_measure run7), so
    each dtype is concatenated apart. Until then the tensors are held as SGLang made them: 0.5.17
    allocates positions and the DCP mask afresh for every forward
    (model_executor/forward_batch_info.py:904,923,967), so holding them keeps them unchanged.
    Host tensors (tests, CPU) are cloned when added.

    `items` holds, in the order they were made: `Run`s of decode steps that can share a `steps`
    line (a step joins the run being filled when it fits, `add`), other steps' drafts, and records
    written while the batch was being filled (`attach_record`; a record ends the run). A pool
    sample (a `records.pool_sample_late` tuple) does not end the run: it waits in `later` until the
    run ends (another step, record or the batch's end), so its line follows the run's `steps`
    line instead of splitting it in two (D72). `run()`, once the copies are on the host, writes
    all their lines in one go and hands the drafts back for reuse: one deferred item and one write
    per batch, not per step.
    """

    __slots__ = ("probe", "born", "parts", "steps", "device", "stream", "sizes", "where", "host",
                 "done", "values_", "items", "run_", "arrived", "later")

    def __init__(self, probe: Probe, born: float) -> None:
        self.probe = probe
        self.born = born
        self.parts: list[Any] = []
        self.steps = 0
        self.device: Any = None
        self.stream: Any = None
        self.sizes: list[int] = []
        """Values of each part (known once sent)."""
        self.where: list[tuple[int, int, int]] = []
        """Part -> (its dtype's group, start, end) in that group's host copy."""
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
        first = len(self.parts)
        if tensors:
            if self.device is None:
                self.device = tensors[0].device
                if tensors[0].is_cuda:
                    self.stream = sys.modules["torch"].cuda.current_stream(self.device)
            if self.stream is None:
                tensors = [t.clone() for t in tensors]  # host tensors: the caller may change them
            self.parts.extend(tensors)
        self.steps += 1
        which, rids = draft.which, draft.rids
        if ((which is _WHICH_POS or which is _WHICH_POS_MASK) and draft.mode == "decode" and rids
                and not draft.cp_active and draft.extend_lens is None and draft.notes is None):
            kv_rows = draft.kv_rows
            run = self.run_
            if (run is None or run.rids is not rids or run.which is not which
                    or run.cp_configured is not draft.cp_configured or run.graph_rows != draft.graph_rows
                    or run.kv_none is not (kv_rows is None) or run.kv_full is not (kv_rows == len(rids))):
                if self.later:
                    self.end_run()
                run = self.run_ = Run.open(self.probe, draft, first)
                self.items.append(run)
            run.rows.append((draft.step, draft.t, draft.rows_in, draft.batch_size, draft.attn_rows_seen,
                             draft.ffn_rows, draft.logits_rows, kv_rows))
            return True
        draft.first = first
        self.end_run()
        self.items.append(draft)
        return False

    def end_run(self) -> None:
        """No further step joins the run being filled: the pool samples made during it follow it."""
        self.run_ = None
        later = self.later
        if later:
            self.items.extend(later)
            later.clear()

    def send(self, on_engine_thread: bool = False) -> None:
        """Start the host copies on the steps' stream: entered only when the caller is not on it
        already (another thread, `Probe.kick`), as entering it costs 8.8 us on the GPU machine.
        Off the engine's thread the stream is entered for each batch: D69 set it once as the
        writer thread's current stream instead, and on the H200 the last step of a batch then read
        back values from before its own kernels ran (tests/probe/test_hooks_cuda.py, 3 of 3 runs):
        the copy was not ordered after them on the steps' stream."""
        if self.host is not None:
            return
        torch = sys.modules["torch"]
        index: dict[Any, int] = {}
        groups: list[list[Any]] = []
        totals: list[int] = []
        where, sizes = self.where, self.sizes
        for t in self.parts:
            n = t.numel()
            dtype = t.dtype
            g = index.get(dtype)
            if g is None:
                g = index[dtype] = len(groups)
                groups.append([])
                totals.append(0)
            start = totals[g]
            totals[g] = start + n
            where.append((g, start, start + n))
            sizes.append(n)
            groups[g].append(t if t.dim() == 1 else t.reshape(-1))
        if not groups:
            self.host = ()  # steps without tensors: nothing to wait for
        elif self.stream is None:
            self.host = [torch.cat(g) for g in groups]
        elif on_engine_thread and torch.cuda.current_stream(self.device) == self.stream:
            self._copy(torch, groups)  # already on the steps' stream (2.9 us to ask, 8.8 to enter)
        else:
            with torch.cuda.stream(self.stream):
                self._copy(torch, groups)
        self.parts = []

    def _copy(self, torch: Any, groups: list[list[Any]]) -> None:
        """The copies, on the steps' stream (the current one: `send` made sure)."""
        self.host = [torch.cat(g).to("cpu", non_blocking=True) for g in groups]
        self.done = torch.cuda.Event()
        self.done.record(self.stream)  # the current stream, named: Event.record would look it up

    def ready(self) -> bool:
        """Whether `run` may go, asked where no device may be: while the probe's writer thread
        runs, it polls the copies' events (`poll`) and reads this one flag (it also runs the batch,
        `Probe.writer_finishes`). Each CUDA call on the engine's thread was a point where it let go
        of the GIL and had to win it back: the batch's sends and polls cost 27 us a step in the real
        engine (results/_measure run12), against 2 us in benchmarks/probe_step.py."""
        return self.arrived or (not self.probe.writer_polls and self.poll())

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
        g, start, end = self.where[i]
        return self.values_[g][start:end]

    def rows(self, parts: Sequence[int], width: int) -> Any:
        """Parts `parts` (each `width` values) as one 2-D numpy array, a row per part. Parts of one
        dtype are laid out one after another in their host copy, so consecutive steps' positions
        are already a block there: a view, where stacking them cost 30 us a batch."""
        self.part(parts[0])  # the host values, once
        g, start, _ = self.where[parts[0]]
        g_last, _, end = self.where[parts[-1]]
        if g_last == g and end - start == len(parts) * width:
            return self.values_[g][start:end].reshape(len(parts), width)
        return sys.modules["numpy"].stack([self.part(i) for i in parts])

    def run(self) -> None:
        """Write the batch's records (each line's errors contained on its own), then give its
        drafts back to the probe. A run of decode steps becomes one `steps` line
        (`records.steps_block_line`) where it can; any other step gets its own line. The steps'
        notes (a KV write not seen, ...) follow the lines, in the order of the steps."""
        probe = self.probe
        lines: list[str] = []
        noted: list[Any] = []
        """Drafts (whose notes are written after the lines, in order, then given back) and notes."""
        runs: list[Run] = []
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
            else:
                line = probe.call("write", probe.text, item)
            if line is not None:
                lines.append(line)
        self.items = []
        self.run_ = None
        if lines:
            probe.write("\n".join(lines))
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


def _run_lines(probe: Probe, batch: CopyBatch, run: Run, lines: list[str], noted: list[Any]) -> None:
    """The lines of `run`'s steps: one `steps` line from the first step whose tensors to the end
    are one value per request each; a line of its own for each step before it, and for a step
    left alone (a `steps` line holds two or more). Ids that JSON would escape or that repeat make
    every step a line of its own (`records.finish_step_line` says how)."""
    n, b, width = len(run.rows), len(run.rids), len(run.which)
    quoted = probe.rid_text.of(run.rids, distinct=True)
    sizes = batch.sizes
    end = run.first + n * width
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


def _run_block_line(probe: Probe, batch: CopyBatch, run: Run, k: int, quoted: str, noted: list[Any]) -> str:
    """The `steps` line of `run`'s steps from `k` (`_run_lines` said they fit one)."""
    assert probe.rank_json is not None
    rows = run.rows[k:] if k else run.rows
    b, width = len(run.rids), len(run.which)
    first = run.first + k * width
    head = rows[0]
    # The KV source is the same for every step of a run (its key); so is a note's pattern, which
    # is said once (Probe.warn_once): the first step's.
    kv, note = records.kv_source_of("decode", head[0], run.graph_rows, head[7], b, b if width == 2 else None)
    if note is not None:
        noted.append(note)
    end = first + len(rows) * width
    positions = batch.rows(range(first, end, width), b)
    mask = batch.rows(range(first + 1, end, width), b) if kv == "mask" else None
    step, clock, rows_in, _, attn, ffn, logits, _ = zip(*rows, strict=True)
    t0 = probe.t0
    t = [round(c - t0, 6) for c in clock]  # _record_t
    return records.steps_block_line(
        t=t, step=step, rows_in=rows_in, attn_rows=attn, ffn_rows=ffn, logits_rows=logits,
        cp_configured=run.cp_configured, graph_rows=run.graph_rows, rank_json=probe.rank_json, quoted=quoted,
        positions=positions, kv=kv, mask=mask)


def send_copies(probe: Probe) -> None:
    """Send the batch being filled and every closed batch not sent yet: the probe must finish its
    pending work now (`Probe.kick`)."""
    with probe.copy_lock:
        batch, probe.copies = probe.copies, None
    _send_closed(probe, batch, poll=False)


def writer_round(probe: Probe) -> None:
    """The writer thread's share of the copies, every runtime.WRITER_PERIOD_S: send the batches the
    engine closed (and the open one once it is COPY_WITHIN_S old), then poll the sent ones, so that
    the engine's thread makes no CUDA call for the probe in a steady decode."""
    old = None
    with probe.copy_lock:
        batch = probe.copies
        if batch is not None and batch.steps and probe.clock() - batch.born >= COPY_WITHIN_S:
            old, probe.copies = batch, None
    _send_closed(probe, old, poll=True)


def _send_closed(probe: Probe, detached: CopyBatch | None, *, poll: bool) -> None:
    """Send `detached` and every batch the engine closed without sending; poll the sent ones if
    asked. Under `send_lock`, not `copy_lock`: the engine's thread takes copy_lock every step and
    must not wait for a send."""
    with probe.send_lock:
        if detached is not None:
            detached.send()
        for _, item in list(probe._pending):  # a C-level copy, whole under the GIL
            if isinstance(item, CopyBatch):
                if item.host is None and item is not probe.copies:
                    item.send()
                if poll:
                    item.poll()


def _close_locked(probe: Probe, on_engine_thread: bool = False) -> None:
    """No further step joins the batch being filled; the writer thread sends it on its next round
    (the engine's thread sends it itself when there is no writer)."""
    if probe.writer_polls:
        probe.copies = None
    else:
        _send_locked(probe, on_engine_thread)


def _send_locked(probe: Probe, on_engine_thread: bool = False) -> None:
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
    batch stays open, and is sent when full, by the writer thread; the next step starts a new run.
    A pool sample (a tuple, `records.pool_sample_late`) is the exception: the run goes on, and the
    sample is written after the run's steps (`CopyBatch.later`, D72). False when no batch is being
    filled. The batch being filled is the last of the pending work: a record written after it
    opened went into it, and it is detached before it is sent."""
    with probe.copy_lock:
        batch = probe.copies
        if batch is None or batch.host is not None:
            return False
        if record.__class__ is tuple:
            batch.later.append(record)
            return True
        batch.end_run()
        batch.items.append(record)
        return True


def _open_batch(probe: Probe) -> CopyBatch:
    """A new batch, deferred at once: records written after it wait for its steps."""
    batch = CopyBatch(probe, probe.clock())
    probe.copies, probe.kick, probe.writer_round = batch, send_copies, writer_round
    probe.attach = attach_record
    probe.defer(batch)
    return batch


# ---------------------------------------------------------------- geometry, pool, capacity
def after_initialize_model_parallel(_result: Any, *_args: Any, **_kwargs: Any) -> None:
    """AFTER distributed/parallel_state.py:2191 `initialize_model_parallel`: record the geometry."""
    probe = get_probe()
    if probe is None:
        return
    _geometry(probe)


def _geometry(probe: Probe) -> None:
    ps = sys.modules["sglang.srt.distributed.parallel_state"]
    world = ps._WORLD  # module globals set by init_distributed_environment / initialize_model_parallel
    groups = {
        "world": world,
        "tp": ps._TP,
        "dcp": ps._DCP,  # None unless dcp_size > 1 (parallel_state.py:2336-2350)
        "attn_cp": ps._ATTN_CP,
        "attn_tp": ps._ATTN_TP,
        "pp": getattr(ps, "_PP", None),
    }
    gpu = getattr(world, "local_rank", None)
    rank, geo = records.geometry(
        world_rank=int(world.rank), groups=groups, pid=os.getpid(),
        gpu=int(gpu) if gpu is not None else None, hostname=socket.gethostname(), t=probe.now(),
    )
    probe.set_rank(rank)
    probe.write(geo)


def after_kv_configure(result: Any, configurator: Any, *_args: Any, **_kwargs: Any) -> None:
    """AFTER mem_cache/kv_cache_configurator.py:239 `KVCacheConfigurator.configure` (pool + allocator)."""
    probe = get_probe()
    if probe is None or probe.rank is None:
        return
    if getattr(configurator, "is_draft_worker", False):
        return  # a speculative draft's pool is not the target's capacity
    pool = result.token_to_kv_pool
    alloc = result.token_to_kv_pool_allocator
    probe.write(records.kv_pool(
        rank=probe.rank, t=probe.now(), rows=int(pool.size),
        allocator_size=_opt_int(getattr(alloc, "size", None)),
        page_size=_opt_int(getattr(pool, "page_size", None)),
        allocator_page_size=_opt_int(getattr(alloc, "page_size", None)),
        head_num=_opt_int(getattr(pool, "head_num", None)),
        head_dim=_opt_int(getattr(pool, "head_dim", None)),
        layer_num=_opt_int(getattr(pool, "layer_num", None)),
        dtype=str(getattr(pool, "dtype", "")),
    ))


def after_scheduler_init_info(_result: Any, scheduler: Any, *_args: Any, **_kwargs: Any) -> None:
    """AFTER managers/scheduler.py:1607 `Scheduler.get_init_info` (sent once to the launcher at start).

    In 0.5.17 `Scheduler.max_total_num_tokens` is the model runner's value, i.e. per-rank *rows*
    under DCP (tp_worker.py:515); the scheduler multiplies by dcp_size where it admits
    (scheduler.py:2005, 2137). The record carries the attribute as it is.
    """
    probe = get_probe()
    if probe is None or probe.rank is None:
        return
    mc = getattr(scheduler, "model_config", None)
    probe.write(records.capacity(
        rank=probe.rank, t=probe.now(),
        max_total_num_tokens=int(scheduler.max_total_num_tokens),
        max_running_requests=_opt_int(getattr(scheduler, "max_running_requests", None)),
        context_len=_opt_int(getattr(mc, "context_len", None)),
    ))


def after_capture_cuda_graphs(result: Any, *_args: Any, **kwargs: Any) -> None:
    """AFTER model_executor/model_runner_components/cuda_graph_setup.py:105 `capture_cuda_graphs`."""
    probe = get_probe()
    if probe is None or probe.rank is None:
        return
    runner = kwargs.get("model_runner")
    if runner is not None and getattr(runner, "is_draft_worker", False):
        return
    for phase in ("prefill", "decode"):
        cap = getattr(result, phase, None)
        r = getattr(cap, "runner", None)
        sizes = getattr(r, "capture_bs", None)
        probe.write(records.graph_capture(
            rank=probe.rank, t=probe.now(), phase=phase, runner_kind=type(r).__name__,
            batch_sizes=_int_list(sizes) if sizes is not None else None,
        ))


# ---------------------------------------------------------------- per step
def around_model_runner_forward(original: Any, runner: Any, forward_batch: Any, *args: Any,
                                **kwargs: Any) -> Any:
    """AROUND model_executor/model_runner.py:1382 `ModelRunner.forward`.

    Opens a StepDraft before the forward (inner hooks fill it), then counts replay vs eager from
    `ModelRunnerOutput.can_run_graph` (model_runner.py:1526-1547) and writes a Step for an eager
    forward. SGLang's own exceptions pass through unchanged; the probe's never do. A paused probe
    (runtime.ENV_SWITCH) opens no draft, so the inner hooks find none and return at once.
    """
    probe = _runtime._PROBE or get_probe()
    if probe is None or probe.paused or getattr(runner, "is_draft_worker", False):
        return original(runner, forward_batch, *args, **kwargs)
    if probe.timing:
        return _timed_forward(probe, original, runner, forward_batch, args, kwargs)
    steady = probe.steady
    if steady is not None:  # the last step was a replay that went on its run: this one may too (D74)
        result = _steady_forward(probe, steady, original, runner, forward_batch, args, kwargs, False, 0)
        if result is not _NOT_STEADY:
            return result
    # Begin and end are guarded inline (not through Probe.call): two calls fewer every step.
    try:
        pending = probe._pending  # Probe.run_ready, inline: earlier steps whose copies have arrived
        if pending and not (probe.writer_polls and probe.writer_finishes) and pending[0][1].ready():
            probe._run_pending(None)
        _begin_step_body(probe, runner, forward_batch)
    except Exception as e:
        probe.current = None
        probe.call("step_begin", probe.error, "step_begin", e)
    try:
        result = original(runner, forward_batch, *args, **kwargs)
    except BaseException as e:
        probe.guarded("forward_raised")(_forward_raised)(probe, e)
        raise
    try:
        _end_step_body(probe, runner, forward_batch, result)
    except Exception as e:
        probe.call("step_end", probe.error, "step_end", e)
    return result


SLOW_NS = 200_000
"""A step whose probe work took longer than this is counted apart in the `cost` notes: a steady
cost and a burst (a wait for the GIL, a page fault, a slow copy call) call for different fixes."""


def _timed_forward(probe: Probe, original: Any, runner: Any, forward_batch: Any, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
    """`around_model_runner_forward` while measuring (`Probe.timing`, runtime.ENV_SWITCH): the same
    work, with the probe's own time on the engine's thread added up by part (`Probe.cost`):
    finishing earlier steps' records (ready), opening the step (begin), closing it (end, which
    includes sending copies; `send` is also counted apart, in `_send_locked`). The inner hooks (KV
    write, forward hooks) are not in it; benchmarks/probe_step.py bounds them. A separate function,
    so that evidence runs do not pay for the clock reads."""
    clock = time.perf_counter_ns
    t0 = t1 = clock()
    steady = probe.steady
    if steady is not None:
        result = _steady_forward(probe, steady, original, runner, forward_batch, args, kwargs, True, t0)
        if result is not _NOT_STEADY:
            return result
        # its checks, which sent the step on to the general path, fall in `ready` (t0 .. t1)
    try:
        probe.run_ready()
        t1 = clock()
        _begin_step_body(probe, runner, forward_batch)
    except Exception as e:
        probe.current = None
        probe.call("step_begin", probe.error, "step_begin", e)
    t2 = clock()
    try:
        result = original(runner, forward_batch, *args, **kwargs)
    except BaseException as e:
        probe.guarded("forward_raised")(_forward_raised)(probe, e)
        raise
    t3 = clock()
    try:
        _end_step_body(probe, runner, forward_batch, result)
    except Exception as e:
        probe.call("step_end", probe.error, "step_end", e)
    _count_cost(probe.cost, t0, t1, t2, t3, clock())
    return result


def _count_cost(cost: list[Any], t0: int, t1: int, t2: int, t3: int, t4: int) -> None:
    """Add one step's probe time to `Probe.cost`: ready t0..t1, begin t1..t2, the forward t2..t3
    (not the probe's), end t3..t4."""
    spent = t2 - t0 + t4 - t3
    cost[0] += spent
    cost[1] += 1
    if not cost[2]:
        cost[2] = t0
    cost[3] = t4
    cost[4] += t1 - t0
    cost[5] += t2 - t1
    cost[6] += t4 - t3
    if spent > SLOW_NS:
        cost[8] += 1
        cost[9] += spent


def _forward_raised(probe: Probe, e: BaseException) -> None:
    draft = probe.current
    probe.current = None
    step = draft.step if draft else -1
    if draft is not None:
        probe.recycle(draft)
    probe.note(f"step {step}: SGLang forward raised {type(e).__name__}: {e}", "warning")


def _begin_step_body(probe: Probe, runner: Any, fb: Any) -> None:
    probe.step_index = step = probe.step_index + 1
    cp = probe.cp_configured
    if cp is None:
        cp = probe.cp_configured = _cp_configured()
    fm = fb.forward_mode
    last = _LAST_MODE
    mode = last[1] if fm is last[0] else _step_mode(fm)
    ids = getattr(fb, "input_ids", None)
    rows_in = int(ids.shape[0]) if ids is not None else 0
    rids = getattr(fb, "rids", None)  # str in SGLang; records.finish_step_line makes sure
    bs = int(getattr(fb, "batch_size", len(rids or ())) or 0)
    if rids:  # the probe's own list while the requests stay (Probe.same_rids, inline)
        same = probe._rids
        rids = same if same is not None and rids == same else probe.same_rids(rids)
    else:
        rids = [f"#{i}" for i in range(bs)]
    draft = probe.spare
    if draft is not None and mode == "decode":
        # The last step's draft, whose step joined a run (`_end_step_body`): only what a decode
        # step's hooks set differs from a new draft's (StepDraft.__init__ would set all 24 fields).
        probe.spare = None
        draft.step, draft.mode, draft.batch_size, draft.rows_in, draft.rids = step, mode, bs, rows_in, rids
        draft.cp_configured = cp
        draft.attn_rows_seen = draft.ffn_rows = draft.logits_rows = draft.kv_rows = draft.graph_rows = None
        probe.current = draft
        return
    try:  # not `if probe.drafts`: the writer thread may take the last one in between (writer_finishes)
        draft = probe.drafts.pop()
    except IndexError:
        draft = StepDraft(step=0, mode=mode, batch_size=0, rows_in=0, rids=rids)
    if mode == "decode":
        StepDraft.__init__(draft, step=step, mode=mode, batch_size=bs, rows_in=rows_in, rids=rids,
                           cp_configured=cp)
    else:
        StepDraft.__init__(
            draft, step=step, mode=mode, batch_size=bs, rows_in=rows_in, rids=rids,
            extend_lens=_int_list(getattr(fb, "extend_seq_lens_cpu", None)),
            prefix_lens=_int_list(getattr(fb, "extend_prefix_lens_cpu", None)), cp_configured=cp)
    probe.current = draft


def _step_mode(fm: Any) -> records.StepMode:
    """The step mode of SGLang's ForwardMode `fm`, remembered as the last one seen (`_LAST_MODE`)."""
    # SGLang's ForwardMode is an IntEnum: reading `name` costs a Python call each time
    name = getattr(fm, "name", None) or str(fm)
    mode = _MODES.get(name)
    if mode is None:
        mode = _MODES[name] = records.mode_of(name)
    _LAST_MODE[0], _LAST_MODE[1] = fm, mode
    return mode


_LAST_MODE: list[Any] = [None, None]
"""The last ForwardMode seen and its step mode: a decode keeps one (the object is held, so its
identity cannot pass to another)."""
_MODES: dict[str, records.StepMode] = {}
"""SGLang's ForwardMode names -> our step modes, looked up once per name."""
_WHICH: dict[tuple[bool, bool, bool], tuple[str, ...]] = {
    (p, m, z): tuple(n for n, on in (("positions", p), ("kv_mask", m), ("zigzag", z)) if on)
    for p in (False, True) for m in (False, True) for z in (False, True)
}
"""The names of a step's tensors in its CopyBatch, made once (a draft keeps one of these)."""
_WHICH_POS, _WHICH_POS_MASK = _WHICH[True, False, False], _WHICH[True, True, False]
_WHICH_NONE = _WHICH[False, False, False]
_NO_RIDS: list[str] = []
"""What a run given back holds instead of its requests' ids (it keeps no list of SGLang's alive)."""


_GRAPH_KEYS: dict[tuple[bool, str], tuple[str, str]] = {
    (replay, mode): ("replay" if replay else "eager", "decode" if mode in ("decode", "idle") else "prefill")
    for replay in (False, True) for mode in ("extend", "decode", "mixed", "idle", "other")
}
"""(replayed, step mode) -> the graph counter's key (`Probe.count_graph`, made once)."""


def _end_step_body(probe: Probe, runner: Any, fb: Any, result: Any) -> None:
    draft, probe.current = probe.current, None
    if draft is None:
        return
    if probe.rank is None:
        probe.recycle(draft)
        return
    # Probe.count_graph, inline: the engine's thread is the counter's only writer (GraphCounter).
    if getattr(result, "can_run_graph", False):
        probe.graph.totals[_GRAPH_KEYS[True, draft.mode]] += 1
        # A replay is recorded too (D58): the forward batch's requests and positions are what the
        # graph runner copied into the graph's inputs (decode_cuda_graph_runner.py:1122-1129), and
        # its padded size is the graph that ran. What happens inside (the inner hooks, the KV
        # write and its owner mask) is not seen: the record says so by `graph_rows`.
        rows = _graph_rows(runner)
        if rows is None:
            probe.warn_once("graph_rows", f"step {draft.step}: CUDA-graph replay without a readable "
                            "padded size (decode_cuda_graph_runner.bs); its step is not recorded")
            probe.recycle(draft)
            return
        draft.graph_rows = rows  # no inner hook fired: no mask or zigzag tensor is pending
    else:
        probe.graph.totals[_GRAPH_KEYS[False, draft.mode]] += 1
    pos_t = getattr(fb, "positions", None)
    # Taken here, at the forward's end: every stream SGLang used in the forward has joined the
    # current one by now, so the tensors kept by the inner hooks are complete in its order.
    has_pos = probe.observe_positions and pos_t is not None
    mask, zigzag = draft.kv_mask_pending, draft.zigzag_pending
    # The clock as read: `Probe.now`'s rounding waits for the batch's records (`_record_t`), where it
    # runs for all its steps in a row; on its own, once a step after the engine's work, it cost
    # several times as much (benchmarks/probe_step.py --engine-us).
    draft.t = probe.clock()
    if mask is None and zigzag is None:  # a decode step's usual case: positions alone
        if has_pos:
            draft.which = _WHICH_POS
            if _join_run(probe, draft, pos_t):
                if draft.graph_rows is not None:
                    _arm_steady(probe, runner, fb, draft)
                return
            tensors = [pos_t[0] if getattr(pos_t, "ndim", 1) == 2 else pos_t]  # _text_positions
        else:
            tensors = []
            draft.which = _WHICH_NONE
    else:
        draft.kv_mask_pending = None
        tensors = [_text_positions(pos_t)] if has_pos else []
        if mask is not None:
            tensors.append(mask)
        if zigzag is not None:
            tensors.append(zigzag[0])
        draft.which = _WHICH[has_pos, mask is not None, zigzag is not None]
    with probe.copy_lock:
        batch = probe.copies
        if batch is None:
            batch = _open_batch(probe)
        elif tensors and not batch.fits(tensors):
            _close_locked(probe)
            batch = _open_batch(probe)
        if batch.add(draft, tensors):
            probe.spare = draft  # its run keeps its values: the draft serves the next step
            run = batch.run_  # the run the step opened or joined
            if run is not None and draft.which is _WHICH_POS and tensors[0] is not pos_t:
                run.pos_2d = True  # _text_positions took the first row: later steps of the run do too
        _close_if_due(probe, batch)
    if probe.spare is draft and draft.graph_rows is not None and draft.which is _WHICH_POS:
        _arm_steady(probe, runner, fb, draft)


def _close_if_due(probe: Probe, batch: CopyBatch) -> None:
    """After a step joined `batch` (copy_lock held): close it when full, or, without a writer
    thread, send it once its first step is COPY_WITHIN_S old."""
    if batch.steps >= COPY_EVERY:
        _close_locked(probe, on_engine_thread=True)
    elif not probe.writer_polls and probe.clock() - batch.born >= COPY_WITHIN_S:
        _send_locked(probe, on_engine_thread=True)  # no writer thread to send an old batch


def _join_run(probe: Probe, draft: StepDraft, pos_t: Any) -> bool:
    """A decode step of positions alone that goes on the run being filled (`CopyBatch.add`'s test,
    inline): its row and positions join the run without the general path's reads of the tensor
    (`ndim`, and `device` for `CopyBatch.fits`: each a call into torch, several us on the engine's
    thread once a step after the engine's work, D73). The run's first step was checked for both: a
    rank's forward batches live on its one device, and the run keeps M-RoPE's shape (`Run.pos_2d`).
    False when the step does not fit the run: it takes the general path."""
    rids = draft.rids
    with probe.copy_lock:
        batch = probe.copies
        if batch is None:
            return False
        run = batch.run_
        if (run is None or run.rids is not rids or run.which is not _WHICH_POS or draft.mode != "decode"
                or draft.cp_active or draft.extend_lens is not None or draft.notes is not None
                or run.cp_configured is not draft.cp_configured or run.graph_rows != draft.graph_rows):
            return False
        kv_rows = draft.kv_rows
        if run.kv_none is not (kv_rows is None) or run.kv_full is not (kv_rows == len(rids)):
            return False
        batch.parts.append(pos_t[0] if run.pos_2d else pos_t)
        batch.steps += 1
        run.rows.append((draft.step, draft.t, draft.rows_in, draft.batch_size, draft.attn_rows_seen,
                         draft.ffn_rows, draft.logits_rows, kv_rows))
        probe.spare = draft  # its run keeps its values: the draft serves the next step
        _close_if_due(probe, batch)
    return True


class Steady:
    """What the short path (`_steady_forward`, D74) needs to put a decode-graph replay on the run
    the last step went on, read once when that step armed it (`_arm_steady`): the forward mode,
    requests and batch size a step must have to go on the run, the graph runner with the padded
    size and width it replayed, the copy batch and run, the draft the inner hooks fill if the step
    turns out eager, and the graph counter's totals. One per probe (`Probe.steady_spare`), armed
    again and again."""

    __slots__ = ("mode", "rids", "bs", "graph_runner", "graph_bs", "width", "batch", "run", "draft", "totals")

    def __init__(self) -> None:
        self.mode: Any = None
        self.rids: list[str] = _NO_RIDS
        self.bs = 0
        self.graph_runner: Any = None
        self.graph_bs = 0
        self.width: Any = 1
        self.batch: CopyBatch | None = None
        self.run: Run | None = None
        self.draft: StepDraft | None = None
        self.totals: dict[Any, int] = {}


_NOT_STEADY = object()
"""What `_steady_forward` returns when the step is not for it (it called no forward)."""
_REPLAY_DECODE = _GRAPH_KEYS[True, "decode"]


def _arm_steady(probe: Probe, runner: Any, fb: Any, draft: StepDraft) -> None:
    """After a decode-graph replay went on a run by the general path (`draft`, now `probe.spare`):
    let the next step try the short path. Not armed while the CP configuration is not known (the
    general begin looks it up again each step until it is)."""
    if probe.cp_configured is None:
        return
    gr = getattr(runner, "decode_cuda_graph_runner", None)
    bs = getattr(gr, "bs", None)
    with probe.copy_lock:
        batch = probe.copies
        run = batch.run_ if batch is not None else None
        if run is None or run.graph_rows != draft.graph_rows or not isinstance(bs, int):
            return
        st = probe.steady_spare
        if st is None:
            st = probe.steady_spare = Steady()
        st.mode, st.rids, st.bs = fb.forward_mode, run.rids, draft.batch_size
        st.graph_runner, st.graph_bs, st.width = gr, bs, getattr(gr, "captured_req_width", 1)
        st.batch, st.run, st.draft, st.totals = batch, run, draft, probe.graph.totals
    probe.steady = st


def _steady_forward(probe: Probe, st: Steady, original: Any, runner: Any, fb: Any, args: tuple[Any, ...],
                    kwargs: dict[str, Any], timed: bool, t0: int) -> Any:
    """The short path of a decode step that goes on the run of replays the last step went on (D74):
    the record the general path makes (`_begin_step_body`, `_end_step_body`, `_join_run`), without
    the reads and writes that cannot change along such a run. Each is a few us on the engine's
    thread once a step after the engine's work (D73: the cost is the work done cold): the draft's
    fields are not set (the row is made from locals), the forward mode is compared by identity, the
    graph runner, its padded size and width are compared with the run's, the graph counter's key is
    made once. Returns `_NOT_STEADY` (no forward called) when the step is not the run's before the
    forward. After it, a step that does not go on the run (eager, another graph size or runner, the
    batch closed or sent, anything read differently) gets the draft filled as the general begin
    fills it and the general end, which says what it finds. `timed`, `t0`: the timing probe's
    (`_timed_forward`); the time is added to `Probe.cost` as it is at the step's end, as there, so
    that a cost note written meanwhile by the writer thread does not take it."""
    try:
        pending = probe._pending  # Probe.run_ready, inline: finishing due goes by the general path
        fm = fb.forward_mode
        rids = fb.rids
        if ((pending and not (probe.writer_polls and probe.writer_finishes) and pending[0][1].ready())
                or (fm is not st.mode and _step_mode(fm) != "decode") or fb.batch_size != st.bs
                or (rids is not st.rids and rids != st.rids)):  # the same requests: equal item by item
            probe.steady = None
            return _NOT_STEADY
        rows_in = int(fb.input_ids.shape[0])
    except Exception:  # something the general path reads otherwise, and says why
        probe.steady = None
        return _NOT_STEADY
    probe.step_index = step = probe.step_index + 1
    draft = probe.current = st.draft  # for the inner hooks, if the forward runs eager after all
    t2 = time.perf_counter_ns() if timed else 0
    try:
        result = original(runner, fb, *args, **kwargs)
    except BaseException as e:
        probe.steady = probe.spare = None
        if draft is not None:
            draft.step = step
        probe.guarded("forward_raised")(_forward_raised)(probe, e)
        raise
    t3 = time.perf_counter_ns() if timed else 0
    probe.current = None
    try:
        gr = runner.decode_cuda_graph_runner if getattr(result, "can_run_graph", False) else None
        pos = (fb.positions if gr is not None and gr is st.graph_runner and gr.bs == st.graph_bs
               and getattr(gr, "captured_req_width", 1) == st.width else None)
    except Exception:
        pos = None
    done = False  # the step went on the run (or failed there, said): the general end must not record it
    if pos is not None:
        t = probe.clock()
        try:
            with probe.copy_lock:
                batch, run = probe.copies, st.run
                if batch is st.batch and batch.run_ is run:
                    done = True
                    batch.parts.append(pos[0] if run.pos_2d else pos)
                    batch.steps += 1
                    run.rows.append((step, t, rows_in, st.bs, None, None, None, None))
                    st.totals[_REPLAY_DECODE] += 1  # Probe.count_graph, inline (one writer: this thread)
                    if batch.steps >= COPY_EVERY or not probe.writer_polls:
                        _close_if_due(probe, batch)  # full: the next step opens a batch by the general end
        except Exception as e:
            done = True
            probe.steady = None
            probe.call("step_end", probe.error, "step_end", e)
    if not done:
        # Not on the run: the step as the general begin would have opened it, and the general end
        # (which arms the short path again when the step goes on a run of replays).
        try:
            probe.steady = probe.spare = None
            draft.step, draft.mode, draft.batch_size, draft.rows_in = step, "decode", st.bs, rows_in
            draft.rids, draft.cp_configured, draft.graph_rows = st.rids, probe.cp_configured, None
            probe.current = draft
            _end_step_body(probe, runner, fb, result)
        except Exception as e:
            probe.call("step_end", probe.error, "step_end", e)
    if timed:
        _count_cost(probe.cost, t0, t0, t2, t3, time.perf_counter_ns())
    return result


def _graph_rows(runner: Any) -> int | None:
    """Rows the decode graph just replayed ran: the batch padded to a captured size, times the
    tokens per request it was captured with (`bs`, `captured_req_width`: set by `load_batch`,
    model_executor/runner/decode_cuda_graph_runner.py:1116, 1172); None when unreadable."""
    gr = getattr(runner, "decode_cuda_graph_runner", None)
    bs = getattr(gr, "bs", None)
    if not isinstance(bs, int) or bs <= 0:
        return None
    width = getattr(gr, "captured_req_width", 1)
    return bs * (width if isinstance(width, int) and width > 0 else 1)


def _step_line(probe: Probe, batch: CopyBatch, draft: StepDraft) -> str:
    """The Step record's line of one step of `batch`, its host copies arrived."""
    assert probe.rank is not None and probe.rank_json is not None
    positions = None
    for k, name in enumerate(draft.which):
        value = batch.part(draft.first + k)
        if name == "positions":
            positions = value
        elif name == "kv_mask":
            draft.kv_mask = value  # 0/1 (or bools): truth is what counts; a numpy view
        else:
            _resolve_zigzag(draft, value.tolist())
    return records.finish_step_line(draft, rank=probe.rank, rank_json=probe.rank_json,
                                    t=_record_t(probe, draft.t), positions=positions, rid_text=probe.rid_text)


def _record_t(probe: Probe, clock: float) -> float:
    """A step's `t` from the clock as its forward returned: what `Probe.now` said then."""
    return round(clock - probe.t0, 6)


def _cp_configured() -> bool | None:
    base = sys.modules.get("sglang.srt.layers.cp.base")
    if base is None:
        return None
    return base.get_cp_strategy() is not None  # layers/cp/base.py:274


def after_prepare_cp_forward(_result: Any, forward_batch: Any, *_a: Any, **_k: Any) -> None:
    """AFTER layers/cp/utils.py:157 `prepare_cp_forward`: the batch is PCP-split on this rank.

    Reads `attn_cp_metadata` of the *loaded* batch (EagerRunner.load_batch copies it,
    eager_runner.py:167-195, so the batch ModelRunner.forward got never carries it).
    """
    probe = get_probe()
    draft = probe.current if probe else None
    if draft is None:
        return
    meta = forward_batch.attn_cp_metadata
    draft.cp_active = True
    draft.cp_rank = int(probe.rank.attn_cp) if probe and probe.rank else 0
    logical = getattr(meta, "per_rank_logical_token", None) or getattr(meta, "per_rank_actual_token", None)
    draft.cp_logical_rows = _int_list(logical)


def after_zigzag_shard_positions(result: Any, strategy: Any, _positions: Any, forward_batch: Any,
                                 *_a: Any, **_k: Any) -> None:
    """AFTER layers/cp/zigzag.py:308 `ZigzagCPStrategy.shard_position_ids`: this rank's positions."""
    probe = get_probe()
    draft = probe.current if probe else None
    if probe is None or draft is None or not probe.observe_positions:
        return
    meta = forward_batch.attn_cp_metadata
    logical = getattr(meta, "per_rank_logical_token", None)
    # rows past this rank's logical count are padding (layers/cp/padding.py:45-62)
    keep = int(logical[int(strategy.cp_rank)]) if logical else None
    draft.zigzag_pending = (_text_positions(result), keep, list(meta.split_list), list(meta.zigzag_index))


def _resolve_zigzag(draft: StepDraft, sharded: list[int]) -> None:
    _, keep, split_list, zigzag_index = draft.zigzag_pending
    draft.zigzag_pending = None
    split = records.split_zigzag_local(sharded[:keep], split_list, zigzag_index, draft.rids)
    if split is None:
        draft.note(f"step {draft.step}: zigzag positions do not fit split_list/zigzag_index")
    draft.cp_local_positions = split


F = TypeVar("F", bound=Callable[..., Any])


def guards_itself(fn: F) -> F:
    """Mark a hook that contains its own errors: registered without `Probe.guarded`'s wrapper.

    For the hooks SGLang calls in every layer or every step: the wrapper is two more Python calls
    each time, and `after_set_kv_buffer` runs once per layer per step, probe on or paused.
    """
    fn._cptest_guards_itself = True  # type: ignore[attr-defined]
    return fn


@guards_itself
def after_set_kv_buffer(_result: Any, pool: Any, layer: Any, loc_info: Any, cache_k: Any, cache_v: Any,
                        *args: Any, **kwargs: Any) -> None:
    """AFTER mem_cache/memory_pool.py:2305 `MHATokenToKVPool.set_kv_buffer`, first layer of a step.

    Records how many rows the write took and, under DCP, the owner mask SGLang passed
    (triton: `positions % dcp_size == dcp_rank`, layers/attention/triton_backend.py:1230-1239).
    """
    probe = _runtime._PROBE
    draft = probe.current if probe is not None else None
    if draft is None or draft.kv_rows is not None:
        return  # every layer after the first, and every layer while paused: nothing more
    try:
        draft.kv_rows = int(cache_k.shape[0])
        mask = kwargs.get("dcp_kv_mask", args[3] if len(args) > 3 else None)
        if mask is not None and probe.observe_positions:
            draft.kv_mask_pending = mask  # copied with the step's positions when the forward ends
    except Exception as e:
        probe.call("after_set_kv_buffer", probe.error, "after_set_kv_buffer", e)


# ---------------------------------------------------------------- torch forward hooks
@guards_itself
def on_attn_input(_module: Any, args: tuple[Any, ...], _output: Any) -> None:
    """Forward hook on `model.layers.0.self_attn.attn` (RadixAttention, layers/radix_attention.py:150)."""
    probe = _runtime._PROBE
    draft = probe.current if probe is not None else None
    if draft is not None and draft.attn_rows_seen is None and args:
        try:
            draft.attn_rows_seen = int(args[0].shape[0])
        except Exception as e:
            probe.call("attn_rows", probe.error, "attn_rows", e)


@guards_itself
def on_mlp_input(_module: Any, args: tuple[Any, ...], _output: Any) -> None:
    """Forward hook on `model.layers.0.mlp`: rows entering the first MLP."""
    probe = _runtime._PROBE
    draft = probe.current if probe is not None else None
    if draft is not None and draft.ffn_rows is None and args:
        try:
            draft.ffn_rows = int(args[0].shape[0])
        except Exception as e:
            probe.call("mlp_rows", probe.error, "mlp_rows", e)


@guards_itself
def on_logits_input(_module: Any, args: tuple[Any, ...], _output: Any) -> None:
    """Forward hook on `logits_processor`: rows of hidden states entering it (input_ids, hidden, ...)."""
    probe = _runtime._PROBE
    draft = probe.current if probe is not None else None
    if draft is not None and draft.logits_rows is None and len(args) > 1:
        try:
            draft.logits_rows = int(args[1].shape[0])
        except Exception as e:
            probe.call("logits_rows", probe.error, "logits_rows", e)


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)
