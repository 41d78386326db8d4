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
from collections.abc import Callable
from typing import Any, TypeVar

from cptest.evidence import dump_record
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


class CopyBatch:
    """Up to COPY_EVERY eager steps: their drafts and device tensors, brought to host memory
    together, and the probe's deferred work for them (`Probe.defer`, once, when the batch opens).

    `send()` concatenates the tensors of each dtype (positions, the DCP mask) and copies each
    result with `non_blocking=True` (into pinned memory, on the stream of the steps, after the
    kernels that made them), marked by one event: a few CUDA calls per batch instead of a copy
    and an event per step, each of which cost 10-20 us of the engine's CPU on the GPU machine.
    One `torch.cat` over positions and masks together cost 196 us there (its dtype promotion
    converts every bool tensor on its own; benchmarks/cuda_ops.py, results/_measure run7), so
    each dtype is concatenated apart. Until then the tensors are held as SGLang made them: 0.5.17
    allocates positions and the DCP mask afresh for every forward
    (model_executor/forward_batch_info.py:904,923,967), so holding them keeps them unchanged.
    Host tensors (tests, CPU) are cloned when added. `run()`, once the copies are on the host,
    writes the batch's Step records in one go and hands the drafts back for reuse: one deferred
    item and one write per batch, not per step.
    """

    __slots__ = ("probe", "born", "parts", "steps", "device", "stream", "sizes", "where", "host",
                 "done", "values_", "drafts", "arrived", "records")

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
        self.drafts: list[StepDraft] = []
        self.arrived = False
        """The host copies are complete (`poll` saw the event); read without a device call."""
        self.records: list[tuple[int, Any]] | None = None
        """Records written while the batch was being filled (`attach_record`): (steps before each
        one, the record or its line), written between those steps' lines."""

    def fits(self, tensors: list[Any]) -> bool:
        """Whether a step's tensors go with this batch's (one step's tensors share a device)."""
        return self.device is None or tensors[0].device == self.device

    def add(self, draft: StepDraft, tensors: list[Any]) -> None:
        """Hold one step's draft and tensors (`draft.first` is the index of its first tensor)."""
        draft.first = len(self.parts)
        if tensors:
            if self.device is None:
                self.device = tensors[0].device
                if tensors[0].is_cuda:
                    self.stream = sys.modules["torch"].cuda.current_stream(self.device)
            if self.stream is None:
                tensors = [t.clone() for t in tensors]  # host tensors: the caller may change them
            self.parts.extend(tensors)
        self.drafts.append(draft)
        self.steps += 1

    def send(self, on_engine_thread: bool = False) -> None:
        """Start the host copies on the steps' stream: entered only when the caller is not on it
        already (another thread, `Probe.kick`), as entering it costs 8.8 us on the GPU machine."""
        if self.host is not None:
            return
        torch = sys.modules["torch"]
        index: dict[Any, int] = {}
        groups: list[list[Any]] = []
        totals: list[int] = []
        for t in self.parts:
            flat = t if t.dim() == 1 else t.reshape(-1)
            n = int(flat.shape[0])
            g = index.get(flat.dtype)
            if g is None:
                g = index[flat.dtype] = len(groups)
                groups.append([])
                totals.append(0)
            start = totals[g]
            totals[g] = start + n
            self.where.append((g, start, start + n))
            self.sizes.append(n)
            groups[g].append(flat)
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
        self.host = [torch.cat(g).to("cpu", non_blocking=True) for g in groups]
        self.done = torch.cuda.Event()
        self.done.record()

    def ready(self) -> bool:
        """Whether `run` may go. On the engine's thread this asks no device: while the probe's writer
        thread runs, it polls the copies' events (`poll`), so a step's start reads one flag. Each
        CUDA call there was a point where the engine's thread let go of the GIL and had to win it
        back: the batch's sends and polls cost 27 us a step in the real engine (results/_measure
        run12), against 2 us in benchmarks/probe_step.py."""
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

    def rows(self, parts: list[int], width: int) -> Any:
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
        """Write the batch's records (each step's or block's errors contained on its own), then give
        its drafts back to the probe. Runs of decode steps over the same requests become one
        `steps` line (`records.steps_block_line`); any other step gets its own line."""
        probe, drafts = self.probe, self.drafts
        attached = self.records or ()
        lines = []
        i = r = 0
        while i < len(drafts):
            while r < len(attached) and attached[r][0] <= i:
                lines.append(probe.call("write", _record_line, attached[r][1]))
                r += 1
            end = attached[r][0] if r < len(attached) else len(drafts)  # a block stops at a record
            j = probe.call("step_end", _block_end, probe, self, i, end) or i + 1
            line = (probe.call("step_end", _step_line, probe, self, drafts[i]) if j == i + 1
                    else probe.call("step_end", _block_line, probe, self, i, j))
            if line is not None:
                lines.append(line)
            i = j
        lines.extend(probe.call("write", _record_line, rec) for _, rec in attached[r:])
        self.records = None
        lines = [x for x in lines if x is not None] if attached else lines
        if lines:
            probe.write("\n".join(lines))
        for draft in drafts:
            if draft.notes:
                for n in draft.notes:
                    probe.warn_once(re.sub(r"\d+", "N", n), n)
            probe.recycle(draft)
        self.drafts = []
        self.values_ = self.host = None


def _record_line(record: Any) -> str:
    return record if isinstance(record, str) else dump_record(record)


def _block_end(probe: Probe, batch: CopyBatch, i: int, end: int | None = None) -> int:
    """The end of the run of steps from `i` (up to `end`) that one `steps` line can carry (i + 1: none)."""
    drafts = batch.drafts
    d = drafts[i]
    which = d.which
    if d.mode != "decode" or d.cp_active or d.extend_lens is not None or (which is not _WHICH_POS
                                                                         and which is not _WHICH_POS_MASK):
        return i + 1
    b = len(d.rids)
    sizes = batch.sizes
    if b == 0 or probe.rid_text.of(d.rids, distinct=True) is None:
        return i + 1
    j = i + 1
    end = len(drafts) if end is None else end
    while j < end:
        e = drafts[j]
        if (e.rids is not d.rids or e.which is not which or e.mode != "decode" or e.cp_active
                or e.cp_configured is not d.cp_configured or e.extend_lens is not None
                or e.graph_rows != d.graph_rows
                or (e.kv_rows is None) is not (d.kv_rows is None)
                or (e.kv_rows == b) is not (d.kv_rows == b)):
            break  # the block's steps share everything but their values (and one KV source)
        j += 1
    for k in range(batch.drafts[i].first, batch.drafts[j - 1].first + len(which)):
        if sizes[k] != b:  # a part that is not one value per request
            return i + 1
    return j


def _block_line(probe: Probe, batch: CopyBatch, i: int, j: int) -> str:
    """The `steps` line of drafts i..j-1 of `batch` (`_block_end` said they fit one)."""
    assert probe.rank_json is not None
    drafts = batch.drafts[i:j]
    b, width = len(drafts[0].rids), len(drafts[0].which)
    positions = batch.rows([d.first for d in drafts], b)
    mask = batch.rows([d.first + 1 for d in drafts], b) if width == 2 else None
    kv = [records._kv_source(d, b, b if width == 2 else None) for d in drafts][0]  # one for all (_block_end)
    quoted = probe.rid_text.of(drafts[0].rids, distinct=True)
    assert quoted is not None
    return records.steps_block_line(drafts, rank_json=probe.rank_json, quoted=quoted,
                                    positions=positions, kv=kv, mask=mask if kv == "mask" else None)


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
    batch stays open, and is sent when full, by the writer thread. False when no batch is being
    filled. The batch being filled is the last of the pending work: a record written after it
    opened went into it, and it is detached before it is sent."""
    with probe.copy_lock:
        batch = probe.copies
        if batch is None or batch.host is not None:
            return False
        if batch.records is None:
            batch.records = []
        batch.records.append((len(batch.drafts), record))
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
    # Begin and end are guarded inline (not through Probe.call): two calls fewer every step.
    try:
        probe.run_ready()  # earlier steps whose copies the device has finished
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
    t4 = clock()
    cost = probe.cost
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
    return result


def _forward_raised(probe: Probe, e: BaseException) -> None:
    draft = probe.current
    probe.current = None
    step = draft.step if draft else -1
    if draft is not None:
        probe.recycle(draft)
    probe.note(f"step {step}: SGLang forward raised {type(e).__name__}: {e}", "warning")


def _begin_step_body(probe: Probe, runner: Any, fb: Any) -> None:
    probe.step_index += 1
    if probe.cp_configured is None:
        probe.cp_configured = _cp_configured()
    fm = fb.forward_mode
    name = getattr(fm, "name", None) or str(fm)
    mode = _MODES.get(name)
    if mode is None:
        mode = _MODES[name] = records.mode_of(name)
    ids = getattr(fb, "input_ids", None)
    rows_in = int(ids.shape[0]) if ids is not None else 0
    rids = getattr(fb, "rids", None)  # str in SGLang; records.finish_step_line makes sure
    bs = int(getattr(fb, "batch_size", len(rids or ())) or 0)
    rids = probe.same_rids(rids) if rids else [f"#{i}" for i in range(bs)]
    decode = mode == "decode"
    draft = probe.drafts.pop() if probe.drafts else None
    if draft is None:
        draft = StepDraft(step=0, mode=mode, batch_size=0, rows_in=0, rids=rids)
    StepDraft.__init__(
        draft, step=probe.step_index, mode=mode, batch_size=bs, rows_in=rows_in, rids=rids,
        extend_lens=None if decode else _int_list(getattr(fb, "extend_seq_lens_cpu", None)),
        prefix_lens=None if decode else _int_list(getattr(fb, "extend_prefix_lens_cpu", None)),
        cp_configured=probe.cp_configured,
    )
    probe.current = draft


_MODES: dict[str, records.StepMode] = {}
"""SGLang's ForwardMode names -> our step modes, looked up once per name."""
_WHICH: dict[tuple[bool, bool, bool], tuple[str, ...]] = {
    (p, m, z): tuple(n for n, on in (("positions", p), ("kv_mask", m), ("zigzag", z)) if on)
    for p in (False, True) for m in (False, True) for z in (False, True)
}
"""The names of a step's tensors in its CopyBatch, made once (a draft keeps one of these)."""
_WHICH_POS, _WHICH_POS_MASK = _WHICH[True, False, False], _WHICH[True, True, False]


def _end_step_body(probe: Probe, runner: Any, fb: Any, result: Any) -> None:
    draft, probe.current = probe.current, None
    if draft is None:
        return
    if probe.rank is None:
        probe.recycle(draft)
        return
    phase = "decode" if draft.mode in ("decode", "idle") else "prefill"
    if bool(getattr(result, "can_run_graph", False)):
        probe.count_graph("replay", phase)
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
        probe.count_graph("eager", phase)
    pos_t = getattr(fb, "positions", None)
    # Taken here, at the forward's end: every stream SGLang used in the forward has joined the
    # current one by now, so the tensors kept by the inner hooks are complete in its order.
    has_pos = probe.observe_positions and pos_t is not None
    mask, zigzag = draft.kv_mask_pending, draft.zigzag_pending
    draft.kv_mask_pending = None
    tensors = [_text_positions(pos_t)] if has_pos else []
    if mask is not None:
        tensors.append(mask)
    if zigzag is not None:
        tensors.append(zigzag[0])
    draft.which = _WHICH[has_pos, mask is not None, zigzag is not None]
    draft.t = probe.now()
    with probe.copy_lock:
        batch = probe.copies
        if batch is not None and tensors and not batch.fits(tensors):
            _close_locked(probe)
            batch = None
        if batch is None:
            batch = _open_batch(probe)
        batch.add(draft, tensors)
        if batch.steps >= COPY_EVERY:
            _close_locked(probe, on_engine_thread=True)
        elif not probe.writer_polls and probe.clock() - batch.born >= COPY_WITHIN_S:
            _send_locked(probe, on_engine_thread=True)  # no writer thread to send an old batch


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
    return records.finish_step_line(draft, rank=probe.rank, rank_json=probe.rank_json, t=draft.t,
                                    positions=positions, rid_text=probe.rid_text)


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
