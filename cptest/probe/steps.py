"""Step recording: the hook around SGLang's `ModelRunner.forward` makes each forward a step record.

`around_model_runner_forward` opens a StepDraft before the forward (the inner hooks in `hooks` fill
it), then counts the forward as a CUDA-graph replay or an eager one and hands the step to the copy
batch being filled (`copy_batches`), which writes its line once the step's device tensors are on
the host. A decode step of positions alone that goes on the run the last step went on (of
decode-graph replays, or of eager steps) takes a short path (`_steady_forward`) that writes the
same bytes with fewer reads of SGLang's objects;
every other step takes the general one (`_begin_step_body`, `_end_step_body`). `_timed_forward` is
the general path measuring the probe's own time on the engine's thread (`Probe.timing`); the
short path measures its own.

The probe's errors are contained here (the hook is registered without `Probe.guarded`'s wrapper);
SGLang's own exceptions pass through unchanged. The SGLang line cited at each function is the
pinned release's `sglang/srt/<path>:<line>` (`cptest.engines.sglang.releases.PINNED_RELEASE`).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from cptest.probe import records
from cptest.probe import runtime as _runtime
from cptest.probe.copy_batches import (
    COPY_ROWS,
    NO_RIDS,
    WHICH,
    WHICH_NONE,
    WHICH_POS,
    CopyBatch,
    Run,
    close_if_due,
    close_locked,
    join_run,
    open_batch,
)
from cptest.probe.records import StepDraft
from cptest.probe.runtime import Probe, get_probe


def int_list(values: Any) -> list[int] | None:
    """A small CPU list or tensor as ints; None stays None. Only for host-side metadata."""
    if values is None:
        return None
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [int(v) for v in values]


def text_positions(t: Any) -> Any:
    """M-RoPE positions are [3, n]: the first row is the text position."""
    return t[0] if getattr(t, "ndim", 1) == 2 else t


def around_model_runner_forward(original: Any, runner: Any, forward_batch: Any, *args: Any,
                                **kwargs: Any) -> Any:
    """AROUND model_executor/model_runner.py:1382 `ModelRunner.forward`.

    Opens a StepDraft before the forward (inner hooks fill it), then counts replay vs eager from
    `ModelRunnerOutput.can_run_graph` (model_runner.py:1526-1547) and writes a Step for an eager
    forward. SGLang's own exceptions pass through unchanged; the probe's never do. A paused probe
    (runtime.ENV_SWITCH) opens no draft, so the inner hooks find none and return at once.
    """
    probe = _runtime._PROBE or get_probe()
    if probe is None:
        return original(runner, forward_batch, *args, **kwargs)
    steady = probe.steady
    if steady is not None:
        if runner is steady.runner:  # the last step went on a run by either path: this one may too
            # (the short path does the chores itself, after the step, on the clock it reads then)
            result = _steady_forward(probe, steady, original, runner, forward_batch, args, kwargs)
            if result is not _NOT_STEADY:
                return result
        else:
            probe.settle_steady(disarm=True)
    now = probe.clock()
    if now >= probe.next_chores:
        probe.chores(now)
    if probe.paused or getattr(runner, "is_draft_worker", False):
        return original(runner, forward_batch, *args, **kwargs)
    if probe.timing:
        return _timed_forward(probe, original, runner, forward_batch, args, kwargs)
    # Begin and end are guarded inline (not through Probe.call): two calls fewer every step.
    try:
        pending = probe._pending  # Probe.run_ready, inline: earlier steps whose copies have arrived
        if pending and pending[0][1].ready():
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
    includes sending copies; `send` is also counted apart, in `copy_batches.close_locked`). The
    inner hooks (KV write, forward hooks) are not in it: `Probe.timed_inner` counts them apart. A
    separate function, so that evidence runs do not pay for the clock reads."""
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
    if probe.kv_shadowed is not None:
        probe.unshadow_kv()
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
    if probe.layers_sampled:  # a decode step hooks every layer when it opens a copy batch
        every = mode != "decode" or probe.copies is None
        if every is not probe.layers_on and probe.layer_forwards:
            probe.hook_layers(every)
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
        # step's hooks set differs from a new draft's (StepDraft.__init__ would set all of its fields).
        probe.spare = None
        draft.step, draft.mode, draft.batch_size, draft.rows_in, draft.rids = step, mode, bs, rows_in, rids
        draft.cp_configured = cp
        draft.attn_rows_seen = draft.ffn_rows = draft.logits_rows = draft.kv_rows = draft.graph_rows = None
        draft.ffn_out_rows = draft.layer_rows = None
        draft.attn_layers = draft.ffn_layers = 0
        probe.current = draft
        return
    try:  # not `if probe.drafts`: the watchdog may take the last one in between
        draft = probe.drafts.pop()
    except IndexError:
        draft = StepDraft(step=0, mode=mode, batch_size=0, rows_in=0, rids=rids)
    if mode == "decode":
        StepDraft.__init__(draft, step=step, mode=mode, batch_size=bs, rows_in=rows_in, rids=rids,
                           cp_configured=cp)
    else:
        StepDraft.__init__(
            draft, step=step, mode=mode, batch_size=bs, rows_in=rows_in, rids=rids,
            extend_lens=int_list(getattr(fb, "extend_seq_lens_cpu", None)),
            prefix_lens=int_list(getattr(fb, "extend_prefix_lens_cpu", None)), cp_configured=cp)
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

_GRAPH_KEYS: dict[tuple[bool, str], tuple[str, str]] = {
    (replay, mode): ("replay" if replay else "eager", "decode" if mode in ("decode", "idle") else "prefill")
    for replay in (False, True) for mode in ("extend", "decode", "mixed", "idle", "other")
}
"""(replayed, step mode) -> the graph counter's key (`Probe.count_graph`, made once)."""


def _end_step_body(probe: Probe, runner: Any, fb: Any, result: Any) -> None:
    draft, probe.current = probe.current, None
    if probe.kv_shadowed is not None:
        probe.unshadow_kv()
    if draft is None:
        return
    if probe.rank is None:
        probe.recycle(draft)
        return
    # Probe.count_graph, inline: the engine's thread is the counter's only writer (GraphCounter).
    if getattr(result, "can_run_graph", False):
        probe.graph.totals[_GRAPH_KEYS[True, draft.mode]] += 1
        # A replay is recorded too: the forward batch's requests and positions are what the
        # graph runner copied into the graph's inputs (decode_cuda_graph_runner.py:1122-1129), and
        # its padded size is the graph that ran. What happens inside (the inner hooks, the KV
        # write and its owner mask) is not seen: the record says so by `graph_rows`.
        rows = _graph_rows(runner)
        if rows is None:
            probe.warn_once("graph_rows", f"step {draft.step}: CUDA-graph replay without a readable "
                            "padded size (decode_cuda_graph_runner.bs); its step is not recorded")
            probe.recycle(draft)
            return
        draft.graph_rows = rows  # no inner hook fired: no mask or split tensor is pending
    else:
        probe.graph.totals[_GRAPH_KEYS[False, draft.mode]] += 1
        # Sized by the forward itself (model_runner.py:1566-1571), so read at its end. Decode steps
        # too: under attention DP their attention and MLP rows include padding that only the
        # buffer tells apart; without attention DP this is one attribute read of None.
        draft.dp_buffer = records.dp_buffer(fb)
    pos_t = getattr(fb, "positions", None)
    # Taken here, at the forward's end: every stream SGLang used in the forward has joined the
    # current one by now, so the tensors kept by the inner hooks are complete in its order.
    has_pos = probe.observe_positions and pos_t is not None
    mask, split = draft.kv_mask_pending, draft.split_pending
    # The clock as read: `Probe.now`'s rounding waits for the batch's records
    # (`copy_batches._record_t`), where it runs for all its steps in a row; on its own, once a step
    # after the engine's work, it cost several times as much (benchmarks/probe_step.py --engine-us).
    draft.t = probe.clock()
    # The KV slots of a step whose write was seen (an eager forward): every extend or mixed step;
    # a decode step where it carries the DCP owner mask anyway (its run's line packs them as a
    # column), or where it also records its reads; other decode steps keep positions alone.
    decode = draft.mode == "decode"
    read_every = probe.read_every
    reads = (_block_rows(probe, runner, fb, draft) if decode and read_every and has_pos
             and draft.graph_rows is None and draft.step % read_every == 0 and probe.reads_due(draft.t)
             else None)
    seen_write = (has_pos and draft.kv_rows is not None
                  and (not decode or mask is not None or reads is not None))
    slots = getattr(fb, "out_cache_loc", None) if seen_write and not draft.kv_at_loc else None
    if mask is None and split is None and slots is None and reads is None:  # a decode step's usual case
        if has_pos:
            draft.which = WHICH_POS
            if join_run(probe, draft, pos_t):
                _arm_steady(probe, runner, fb, draft)
                return
            tensors = [pos_t[0] if getattr(pos_t, "ndim", 1) == 2 else pos_t]  # text_positions
        else:
            tensors = []
            draft.which = WHICH_NONE
    else:
        draft.kv_mask_pending = None
        tensors = [text_positions(pos_t)] if has_pos else []
        if mask is not None:
            tensors.append(mask)
        if split is not None:
            tensors.append(split[0])
        if slots is not None:
            tensors.append(slots)
        if reads is not None:
            tensors.append(reads)
        draft.which = WHICH[has_pos, mask is not None, split is not None, slots is not None,
                            reads is not None]
    with probe.copy_lock:
        batch = probe.copies
        if batch is None:
            batch = open_batch(probe)
        elif tensors and not batch.fits(tensors):
            close_locked(probe)
            batch = open_batch(probe)
        if batch.add(draft, tensors):
            probe.spare = draft  # its run keeps its values: the draft serves the next step
            run = batch.run_  # the run the step opened or joined
            if run is not None and draft.which is WHICH_POS and tensors[0] is not pos_t:
                run.pos_2d = True  # text_positions took the first row: later steps of the run do too
        close_if_due(probe, batch)
    if probe.spare is draft and draft.which is WHICH_POS and draft.mode == "decode":
        _arm_steady(probe, runner, fb, draft)


def _block_rows(probe: Probe, runner: Any, fb: Any, draft: StepDraft) -> Any:
    """The block-table rows (`req_to_token`, cut to the longest length, flattened) of the requests
    this step records the reads of; their ids and lengths go on the draft. A step reads consecutive
    requests of its batch, from one that moves on with every sampled step, while their rows stay
    within READ_CELLS_MAX values: the rows' host copy and their ranges cost the probe in proportion
    to them. None where the runner keeps no block table (not a model runner of SGLang's); said
    once where the table, the batch's pool indices or lengths are not readable; noted where one
    request alone is longer than that."""
    pool = getattr(runner, "req_to_token_pool", None)
    if pool is None:
        return None
    table = getattr(pool, "req_to_token", None)
    index = getattr(fb, "req_pool_indices", None)
    lens_t = getattr(fb, "seq_lens_cpu", None)
    if table is None or index is None or lens_t is None:
        probe.warn_once("reads", f"step {draft.step}: no block table or lengths readable "
                        "(req_to_token_pool, req_pool_indices, seq_lens_cpu); kv_read is not recorded")
        return None
    lens = lens_t.tolist()
    n = len(lens)
    if n == 0 or n != len(draft.rids):
        return None
    first = (draft.step // max(probe.read_every, 1)) % n
    width, end = 0, first
    cap = _runtime.READ_CELLS_MAX
    while end < n and max(width, int(lens[end])) * (end - first + 1) <= cap:
        width = max(width, int(lens[end]))
        end += 1
    if end == first:
        draft.note(f"step {draft.step}: request {draft.rids[first]}'s {int(lens[first])} block-table "
                   f"values exceed {cap}; kv_read left empty")
        return None
    while end == n and first > 0 and max(width, int(lens[first - 1])) * (end - first + 1) <= cap:
        first -= 1  # room left at the batch's end: the requests before the first one too
        width = max(width, int(lens[first]))
    draft.read_lens = [int(x) for x in lens[first:end]]
    draft.read_rids = draft.rids[first:end]
    # index_select of the cut columns: one contiguous copy (advanced indexing took a slow path)
    return table[:, :width].index_select(0, index[first:end]).reshape(-1)


class Steady:
    """What the short path (`_steady_forward`) needs to put a decode-graph replay on the run
    the last step went on, read once when that step armed it (`_arm_steady`): the model runner,
    forward mode, requests and batch size a step must have to go on the run, the graph runner with
    the padded size and width it replayed, the copy batch and run with the bound methods that
    append to them, the draft the inner hooks fill if the step turns out eager, and the
    steps it counts until they are settled. One per probe
    (`Probe.steady_spare`), armed again and again."""

    __slots__ = ("runner", "mode", "rids", "bs", "graph_runner", "graph_bs", "width", "batch", "run", "draft",
                 "add_part", "add_row", "counted", "b", "pos_2d", "n", "full", "due", "eager",
                 "key", "kv_none", "kv_full", "no_layers", "step", "busy", "timed", "read_every", "pending",
                 "clock", "compact", "rows_in")

    def __init__(self) -> None:
        self.runner: Any = None
        self.mode: Any = None
        self.rids: list[str] = NO_RIDS
        self.bs = 0
        self.graph_runner: Any = None
        self.graph_bs = 0
        self.width: Any = 1
        self.batch: CopyBatch | None = None
        """The batch being filled; None once another thread took it (`copy_batches.send_copies`)."""
        self.run: Run | None = None
        self.draft: StepDraft | None = None
        self.add_part: Any = None
        """`batch.parts.append`."""
        self.add_row: Any = None
        """`run.rows.append`."""
        self.counted = False
        """The forward batch counts its input ids itself as an int, `num_token_non_padded_cpu`
        (`len(batch.input_ids)` when SGLang makes it, model_executor/forward_batch_info.py:837-842),
        changed only by the MLP-sync padding (model_executor/forward_batch_info.py:1394), which runs
        inside the forward (model_executor/model_runner.py:1302-1303), after the probe's begin: the
        short path reads `rows_in` there, as the arming step found it equal to its input ids' rows,
        instead of asking the tensor (a call into torch, about 1 us once a step on the GPU machine)."""
        self.b = 0
        """`run.b`: the rows each step adds to the batch's `held_rows`."""
        self.pos_2d = False
        """`run.pos_2d`: each step's positions are M-RoPE's, whose first row is kept."""
        self.n = 0
        """Steps put on the run since it was armed or last settled, not yet in the batch's counts
        and the graph counter's (`Probe.settle_steady` adds them): one int a step instead of three
        counts, each a few hundred ns once a step on a server."""
        self.full = 0
        """Steps more that fill the batch (`copy_batches.close_if_due`): to `Probe.copy_every`
        steps, or to COPY_ROWS rows of its runs, from what it held when armed."""
        self.due = 0.0
        """The clock at which the batch is sent: its first step's plus `Probe.copy_within_s`."""
        self.eager = False
        """A run of eager decode steps (whose inner hooks fill the draft), not of replays."""
        self.key: Any = _REPLAY_DECODE
        """The graph counter's key of the run's steps."""
        self.step = 0
        """The last step's index: `Probe.step_index` while armed (`Probe.settle_steady` writes it back)."""
        self.busy = False
        """True while the engine's thread puts a step on its run, which takes no lock: a thread that
        takes the batch being filled (`copy_batches.send_copies`) sends it only once this is False
        again, with the step in it."""
        self.timed = False
        self.read_every = 0
        self.pending: Any = None
        self.clock: Any = None
        """`Probe.timing`, `read_every`, `_pending` and `clock`, held here as the run is armed: the
        short path reads its probe's state from this one object's slots, not from the probe's
        dict of a hundred attributes, each read a cache miss or two once a step on a server."""
        self.compact = False
        self.rows_in = 0
        """A run of replays whose last row is a replay's row of step `step` with `rows_in` rows in:
        each step with as many rows in goes on it as its clock alone (`copy_batches.Run`), one
        that has other rows in by the general end."""
        self.kv_none = self.kv_full = self.no_layers = False
        """An eager run's KV write and layers (`Run.kv_none`, `Run.kv_full`, `not Run.layers`): what
        the inner hooks must have seen for a step to go on it (`copy_batches.join_run`)."""


_REPLAY_ROW_TAIL = (None, None, None, None, None, 0)
"""A replay's row from its batch size on (`copy_batches.Run`): no inner hook fired, no layer."""
_NOT_STEADY = object()
"""What `_steady_forward` returns when the step is not for it (it called no forward)."""
_REPLAY_DECODE = _GRAPH_KEYS[True, "decode"]
_EAGER_DECODE = _GRAPH_KEYS[False, "decode"]


def _arm_steady(probe: Probe, runner: Any, fb: Any, draft: StepDraft) -> None:
    """After a decode step of positions alone went on a run by the general path (`draft`, now
    `probe.spare`), a decode-graph replay or an eager step: let the next step try the short path.
    Not armed while the CP configuration is not known (the general begin looks it up again each
    step until it is), nor while the probe is paused, nor after an eager step that hooked every
    layer while the next one would not (the general begin takes the later layers' hooks away,
    `Probe.hook_layers`)."""
    probe.settle_steady(disarm=True)  # its steps counted before it is armed again
    if probe.cp_configured is None or probe.paused:
        return
    eager = draft.graph_rows is None
    if eager:
        if probe.layers_sampled and probe.layer_forwards and probe.layers_on:
            return
        gr, bs = None, 0
    else:
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
        st.runner, st.mode, st.rids, st.bs = runner, fb.forward_mode, run.rids, draft.batch_size
        st.graph_runner, st.graph_bs, st.width = gr, bs, getattr(gr, "captured_req_width", 1)
        st.eager, st.key = eager, _EAGER_DECODE if eager else _REPLAY_DECODE
        st.kv_none, st.kv_full, st.no_layers = run.kv_none, run.kv_full, not run.layers
        st.batch, st.run, st.draft = batch, run, draft
        st.add_part, st.add_row = batch.parts.append, run.rows.append
        counted = getattr(fb, "num_token_non_padded_cpu", None)
        st.counted = counted.__class__ is int and counted == draft.rows_in
        if counted.__class__ is int and not st.counted:  # the rule Steady.counted reads, not holding
            probe.warn_once("num_token_non_padded_cpu", f"step {draft.step}: SGLang's count of the input "
                            f"ids (num_token_non_padded_cpu {counted}) is not their rows ({draft.rows_in}) "
                            "as the forward begins; the short path counts the tensor's rows instead")
        st.b, st.pos_2d = run.b, run.pos_2d
        st.n = 0
        last = run.rows[-1] if run.rows else None
        st.compact = (not eager and last.__class__ is tuple and last[0] == probe.step_index
                      and last[1].__class__ is float  # a clock of floats: a float row is a clock
                      and last[2:] == (draft.rows_in, draft.batch_size, *_REPLAY_ROW_TAIL))
        st.rows_in = draft.rows_in
        st.step, st.busy, st.timed, st.read_every = probe.step_index, False, probe.timing, probe.read_every
        st.pending, st.clock = probe._pending, probe.clock
        st.full = min(probe.copy_every - batch.steps, -(-(COPY_ROWS - batch.held_rows) // max(run.b, 1)))
        st.due = batch.born + probe.copy_within_s
    probe.steady = st


def _steady_forward(probe: Probe, st: Steady, original: Any, runner: Any, fb: Any, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
    """The short path of a decode step that goes on the run the last step went on, of replays or
    of eager steps (`Steady.eager`, whose inner hooks fill the draft and whose every
    `Probe.read_every`-th step takes the general path to record its reads): the record the
    general path makes (`_begin_step_body`, `_end_step_body`, `join_run`), without the reads and
    writes that cannot change along such a run. On a server each is a few hundred
    ns, once a step after the engine's work has left the caches cold, so the path reads as few of
    SGLang's and the probe's objects as it can: the draft's fields are not set (the row is made
    from locals), the model runner and the forward mode are compared by identity, the graph
    runner, its padded size and width are compared with the run's, the batch's lists are appended
    to by methods bound when it was armed, the clock is read once after the forward (the row's time
    and the batch's age). Returns `_NOT_STEADY` (no forward called) when the step is not the
    run's before the forward. After it, a step that does not go on the run (eager, another graph
    size or runner, the batch closed or sent, anything read differently) gets the draft filled
    as the general begin fills it and the general end, which says what it finds. While the probe
    measures itself (`Probe.timing`) the time is added to `Probe.cost` as `_timed_forward` adds
    it, the checks of a step sent on to the general path counting as its `ready` time."""
    timed = st.timed
    t0 = time.perf_counter_ns() if timed else 0
    try:
        fm = fb.forward_mode
        rids = fb.rids
        step = st.step + 1
        read_every = st.read_every
        fits = not ((fm is not st.mode and _step_mode(fm) != "decode") or fb.batch_size != st.bs
                    or (rids is not st.rids and rids != st.rids)  # the same requests: equal item by item
                    or (st.eager and read_every and step % read_every == 0))  # its reads: the general end
        # an int: SGLang's own count of the input ids where the arming step found it right
        # (`Steady.counted`); else the tensor's, as `_begin_step_body` reads it
        rows_in = (fb.num_token_non_padded_cpu if st.counted else int(fb.input_ids.shape[0])) if fits else 0
    except Exception:  # something the general path reads otherwise, and says why
        fits = False
    if not fits:
        probe.settle_steady(disarm=True)
        if timed:
            _count_checks(probe.cost, t0)
        return _NOT_STEADY
    pending = st.pending
    # Probe.run_ready, inline: earlier batches whose copies have arrived are finished here, as the
    # general begin finishes them, and the step goes on (the batch being filled is never ready:
    # its copies are not sent yet). Their lines may end the run (a note goes into the batch being
    # filled): the step then ends by the general end.
    t1 = t0
    if pending and pending[0][1] is not st.batch and pending[0][1].ready():
        tr = time.perf_counter_ns() if timed else 0
        probe.settle_steady()  # the counts first, as the general path has them
        probe._run_pending(None)
        if timed:  # the finishing is the step's `ready` time, its checks its `begin`
            t1 = t0 + time.perf_counter_ns() - tr
    st.step = step
    draft = probe.current = st.draft  # for the inner hooks (of an eager step, or a replay that runs eager)
    if st.eager and draft is not None:  # what the inner hooks set, as the general begin resets it
        draft.step = step
        draft.attn_rows_seen = draft.ffn_rows = draft.logits_rows = draft.kv_rows = None
        draft.ffn_out_rows = draft.layer_rows = None
        draft.attn_layers = draft.ffn_layers = 0
    t2 = time.perf_counter_ns() if timed else 0
    try:
        result = original(runner, fb, *args, **kwargs)
    except BaseException as e:
        probe.settle_steady(disarm=True)
        probe.spare = None
        if draft is not None:
            draft.step = step
        probe.guarded("forward_raised")(_forward_raised)(probe, e)
        raise
    t3 = time.perf_counter_ns() if timed else 0
    probe.current = None
    if st.eager and probe.kv_shadowed is not None:  # (a replay that ran eager ends by the general end)
        probe.unshadow_kv()
    t = st.clock()
    row: Any = ()
    try:
        replayed = getattr(result, "can_run_graph", False)
        if st.eager:
            # `_end_step_body` and `join_run`'s tests of an eager decode step of positions alone
            # that fits its run: no DCP mask or CP split pending, nothing noted, the KV write and
            # layers the run's steps saw, no attention-DP buffer (sized at all: `records.dp_buffer`'s
            # first test; a sized one, whatever it holds, goes by the general end, which reads it)
            d = draft
            kv_rows = d.kv_rows
            pos = (fb.positions if not replayed and d.kv_mask_pending is None and d.split_pending is None
                   and d.notes is None and d.layer_rows is None and not d.cp_active
                   and (kv_rows is None) is st.kv_none and (kv_rows == st.b) is st.kv_full
                   and (not d.attn_layers) is st.no_layers
                   and getattr(fb, "global_dp_buffer_len", None) is None else None)
            if pos is not None:
                row = (step, t, rows_in, st.bs, d.attn_rows_seen, d.ffn_rows, d.logits_rows, kv_rows,
                       d.ffn_out_rows, d.attn_layers)
        else:
            gr = runner.decode_cuda_graph_runner if replayed else None
            pos = (fb.positions if gr is not None and gr is st.graph_runner and gr.bs == st.graph_bs
                   and getattr(gr, "captured_req_width", 1) == st.width and rows_in == st.rows_in else None)
            # the clock alone, for a row that is the last one's with the step one further (Run)
            row = t if st.compact else (step, t, rows_in, st.bs, None, None, None, None, None, 0)
    except Exception:
        pos = None
    done = False  # the step went on the run (or failed there, said): the general end must not record it
    if pos is not None:
        # Without copy_lock: only the watchdog may take the batch meanwhile (`send_copies`, which
        # then clears `st.batch`), and it sends what it took only once the engine's thread is out
        # of here (`Steady.busy`).
        st.busy = True
        try:
            batch = st.batch
            if batch is not None and batch.run_ is st.run:
                done = True
                st.add_part(pos[0] if st.pos_2d else pos)
                st.add_row(row)
                st.n = n = st.n + 1  # the batch's counts and the graph counter's, settled later
                # copy_batches.close_if_due, inline, on this step's clock: sent, the next step opens
                # a batch by the general end
                if n >= st.full or t >= st.due:
                    probe.settle_steady(disarm=True)
                    with probe.copy_lock:
                        close_locked(probe, on_engine_thread=True)
        except Exception as e:
            done = True
            probe.settle_steady(disarm=True)
            probe.call("step_end", probe.error, "step_end", e)
        finally:
            st.busy = False
    if not done:
        # Not on the run: the step as the general begin would have opened it, and the general end
        # (which arms the short path again when the step goes on a run of replays).
        try:
            probe.settle_steady(disarm=True)
            probe.spare = None
            draft.step, draft.mode, draft.batch_size, draft.rows_in = step, "decode", st.bs, rows_in
            draft.rids, draft.cp_configured, draft.graph_rows = st.rids, probe.cp_configured, None
            probe.current = draft
            _end_step_body(probe, runner, fb, result)
        except Exception as e:
            probe.call("step_end", probe.error, "step_end", e)
    if timed:
        _count_cost(probe.cost, t0, t1, t2, t3, time.perf_counter_ns())
    if t >= probe.next_chores:  # after the step's own time is counted: the chores time themselves
        probe.chores(t)
    return result


def _count_checks(cost: list[Any], t0: int) -> None:
    """The short path's checks of a step that they sent on to the general path: its `ready` time
    (the general path counts the step itself)."""
    spent = time.perf_counter_ns() - t0
    cost[0] += spent
    cost[4] += spent


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


def _cp_configured() -> bool | None:
    base = sys.modules.get("sglang.srt.layers.cp.base")
    if base is None:
        return None
    return base.get_cp_strategy() is not None  # layers/cp/base.py:274


