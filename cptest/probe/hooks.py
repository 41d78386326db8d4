"""Hook bodies: read plain values out of SGLang 0.5.17 objects and hand them to `records`.

Every function here is called by SGLang's HookRegistry wrappers (see `plugin.TARGETS`) or by
torch forward hooks (`forward_hooks`). Each one is wrapped by `Probe.guarded`, so an exception
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
from typing import Any

from cptest.probe import records
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
    """The device tensors of up to COPY_EVERY steps, brought to host memory together.

    `send()` concatenates them and copies the result with `non_blocking=True` (into pinned
    memory, on the stream of the steps, after the kernels that made them), marked by one event:
    three CUDA calls per batch instead of a copy and an event per step, each of which cost
    10-20 us of the engine's CPU on the GPU machine. Until then the tensors are held as SGLang
    made them: 0.5.17 allocates positions and the DCP mask afresh for every forward
    (model_executor/forward_batch_info.py:904,923,967), so holding them keeps them unchanged.
    Host tensors (tests, CPU) are cloned when added.
    """

    __slots__ = ("born", "parts", "steps", "device", "stream", "offsets", "host", "done", "values_")

    def __init__(self, born: float) -> None:
        self.born = born
        self.parts: list[Any] = []
        self.steps = 0
        self.device: Any = None
        self.stream: Any = None
        self.offsets: list[int] = [0]
        self.host: Any = None
        self.done: Any = None
        self.values_: Any = None

    def fits(self, tensors: list[Any]) -> bool:
        return self.device is None or all(t.device == self.device for t in tensors)

    def add(self, tensors: list[Any]) -> int:
        """Hold one step's tensors; returns the index of its first part."""
        if self.device is None and tensors:
            self.device = tensors[0].device
            if tensors[0].is_cuda:
                self.stream = sys.modules["torch"].cuda.current_stream(self.device)
        first = len(self.parts)
        for t in tensors:
            flat = t if t.dim() == 1 else t.reshape(-1)  # SGLang's are 1-D: a reshape is a dispatch
            if self.stream is None:
                flat = flat.clone()
            self.parts.append(flat)
            self.offsets.append(self.offsets[-1] + int(flat.shape[0]))
        self.steps += 1
        return first

    def send(self) -> None:
        torch = sys.modules["torch"]
        if self.stream is None:
            self.host = torch.cat(self.parts) if self.parts else torch.empty(0)
        else:
            with torch.cuda.stream(self.stream):  # also right from the writer thread
                flat = torch.cat(self.parts)
                self.host = flat.to("cpu", non_blocking=True)
                self.done = torch.cuda.Event()
                self.done.record()
        self.parts = []

    def ready(self) -> bool:
        if self.host is None:
            return False
        if self.done is not None:
            if not self.done.query():
                return False
            self.done = None  # arrived: the steps of this batch after the first ask no more
        return True

    def part(self, i: int) -> Any:
        """Part `i` as a numpy view of the host copy (no per-value Python objects: the record
        packs it, `records.finish_step_line`)."""
        if self.values_ is None:
            if self.done is not None:
                self.done.synchronize()
            self.values_ = self.host.numpy()
        return self.values_[self.offsets[i]:self.offsets[i + 1]]


def send_copies(probe: Probe) -> None:
    """Send the batch being filled, if any: the probe must finish its pending work now."""
    with probe.copy_lock:
        _send_locked(probe)


def _send_locked(probe: Probe) -> None:
    batch, probe.copies = probe.copies, None
    if batch is not None:
        batch.send()


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
    probe = get_probe()
    if probe is None or probe.paused or getattr(runner, "is_draft_worker", False):
        return original(runner, forward_batch, *args, **kwargs)
    _begin_step(probe, runner, forward_batch)
    try:
        result = original(runner, forward_batch, *args, **kwargs)
    except BaseException as e:
        probe.guarded("forward_raised")(_forward_raised)(probe, e)
        raise
    _end_step(probe, forward_batch, result)
    return result


def _forward_raised(probe: Probe, e: BaseException) -> None:
    draft = probe.current
    probe.current = None
    step = draft.step if draft else -1
    probe.note(f"step {step}: SGLang forward raised {type(e).__name__}: {e}", "warning")


def _begin_step_body(probe: Probe, runner: Any, fb: Any) -> None:
    probe.run_ready()  # earlier steps whose copies the device has finished
    probe.step_index += 1
    if probe.cp_configured is None:
        probe.cp_configured = _cp_configured()
    mode = records.mode_of(getattr(fb.forward_mode, "name", str(fb.forward_mode)))
    ids = getattr(fb, "input_ids", None)
    rows_in = int(ids.shape[0]) if ids is not None else 0
    rids = list(getattr(fb, "rids", None) or [])  # str in SGLang; records.finish_step_line makes sure
    bs = int(getattr(fb, "batch_size", len(rids)) or 0)
    if not rids:
        rids = [f"#{i}" for i in range(bs)]
    probe.current = StepDraft(
        step=probe.step_index, mode=mode, batch_size=bs, rows_in=rows_in, rids=rids,
        extend_lens=_int_list(getattr(fb, "extend_seq_lens_cpu", None)) if mode != "decode" else None,
        prefix_lens=_int_list(getattr(fb, "extend_prefix_lens_cpu", None)) if mode != "decode" else None,
        cp_configured=probe.cp_configured,
    )


def _end_step_body(probe: Probe, fb: Any, result: Any) -> None:
    draft, probe.current = probe.current, None
    if draft is None or probe.rank is None:
        return
    phase = "decode" if draft.mode in ("decode", "idle") else "prefill"
    if bool(getattr(result, "can_run_graph", False)):
        probe.count_graph("replay", phase)
    else:
        probe.count_graph("eager", phase)
        pos_t = getattr(fb, "positions", None)
        # Taken here, at the forward's end: every stream SGLang used in the forward has joined the
        # current one by now, so the tensors kept by the inner hooks are complete in its order.
        which, tensors = [], []
        if probe.observe_positions and pos_t is not None:
            which.append("positions")
            tensors.append(_text_positions(pos_t))
        if draft.kv_mask_pending is not None:
            which.append("kv_mask")
            tensors.append(draft.kv_mask_pending)
        if draft.zigzag_pending is not None:
            which.append("zigzag")
            tensors.append(draft.zigzag_pending[0])
        draft.kv_mask_pending = None
        batch, first = None, 0
        if tensors:
            with probe.copy_lock:
                if probe.copies is not None and not probe.copies.fits(tensors):
                    _send_locked(probe)
                if probe.copies is None:
                    probe.copies, probe.kick = CopyBatch(probe.clock()), send_copies
                batch = probe.copies
                first = batch.add(tensors)
                if batch.steps >= COPY_EVERY or probe.clock() - batch.born >= COPY_WITHIN_S:
                    _send_locked(probe)
        probe.defer(StepJob(probe, draft, probe.now(), batch, first, tuple(which)))


class StepJob:
    """A step whose record waits for its host copies; `Probe.run_ready` finishes it."""

    __slots__ = ("probe", "draft", "t", "batch", "first", "which")

    def __init__(self, probe: Probe, draft: StepDraft, t: float, batch: CopyBatch | None, first: int,
                 which: tuple[str, ...]) -> None:
        self.probe, self.draft, self.t = probe, draft, t
        self.batch, self.first, self.which = batch, first, which

    def ready(self) -> bool:
        return self.batch is None or self.batch.ready()

    def run(self) -> None:
        self.probe.call("step_end", _finish_step, self)


def _finish_step(job: StepJob) -> None:
    """Once the step's host copies are done: resolve them and write its Step record."""
    probe, draft = job.probe, job.draft
    assert probe.rank is not None and probe.rank_json is not None
    got: dict[str, list[Any]] = {}
    if job.batch is not None:
        got = {name: job.batch.part(job.first + k) for k, name in enumerate(job.which)}
    if "kv_mask" in got:
        draft.kv_mask = got["kv_mask"]  # 0/1 (or bools): truth is what counts; a numpy view
    if "zigzag" in got:
        _resolve_zigzag(draft, got["zigzag"].tolist())
    positions = got.get("positions")
    probe.write(records.finish_step_line(draft, rank=probe.rank, rank_json=probe.rank_json, t=job.t,
                                         positions=positions, rid_text=probe.rid_text))
    for n in draft.notes:
        probe.warn_once(re.sub(r"\d+", "N", n), n)


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
        draft.notes.append(f"step {draft.step}: zigzag positions do not fit split_list/zigzag_index")
    draft.cp_local_positions = split


def after_set_kv_buffer(_result: Any, pool: Any, layer: Any, loc_info: Any, cache_k: Any, cache_v: Any,
                        *args: Any, **kwargs: Any) -> None:
    """AFTER mem_cache/memory_pool.py:2305 `MHATokenToKVPool.set_kv_buffer`, first layer of a step.

    Records how many rows the write took and, under DCP, the owner mask SGLang passed
    (triton: `positions % dcp_size == dcp_rank`, layers/attention/triton_backend.py:1230-1239).
    """
    probe = get_probe()
    draft = probe.current if probe else None
    if probe is None or draft is None or draft.kv_rows is not None:
        return
    draft.kv_rows = int(cache_k.shape[0])
    mask = kwargs.get("dcp_kv_mask", args[3] if len(args) > 3 else None)
    if mask is not None and probe.observe_positions:
        draft.kv_mask_pending = mask  # copied with the step's positions when the forward ends


# ---------------------------------------------------------------- torch forward hooks
def on_attn_input(_module: Any, args: tuple[Any, ...], _output: Any) -> None:
    """Forward hook on `model.layers.0.self_attn.attn` (RadixAttention, layers/radix_attention.py:150)."""
    probe = get_probe()
    draft = probe.current if probe else None
    if draft is not None and draft.attn_rows_seen is None and args:
        draft.attn_rows_seen = int(args[0].shape[0])


def on_mlp_input(_module: Any, args: tuple[Any, ...], _output: Any) -> None:
    """Forward hook on `model.layers.0.mlp`: rows entering the first MLP."""
    probe = get_probe()
    draft = probe.current if probe else None
    if draft is not None and draft.ffn_rows is None and args:
        draft.ffn_rows = int(args[0].shape[0])


def on_logits_input(_module: Any, args: tuple[Any, ...], _output: Any) -> None:
    """Forward hook on `logits_processor`: rows of hidden states entering it (input_ids, hidden, ...)."""
    probe = get_probe()
    draft = probe.current if probe else None
    if draft is not None and draft.logits_rows is None and len(args) > 1:
        draft.logits_rows = int(args[1].shape[0])


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


# The per-step path calls `Probe.call` directly: `guarded(name)(fn)` would cost a closure and a dict
# lookup each time, three times a step, a measurable part of the probe's cost.
def _begin_step(probe: Probe, runner: Any, fb: Any) -> None:
    probe.call("step_begin", _begin_step_body, probe, runner, fb)


def _end_step(probe: Probe, fb: Any, result: Any) -> None:
    probe.call("step_end", _end_step_body, probe, fb, result)
