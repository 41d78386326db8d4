"""The hooks SGLang installs: what `plugin.TARGETS` registers with SGLang's HookRegistry and what
`forward_hooks` hands to `--forward-hooks`, each reading plain values out of SGLang's objects.

Each one is wrapped by `Probe.guarded` when it is installed, or contains its own errors
(`guards_itself`: the hooks called every layer or every step), so an exception becomes a ProbeNote
and never reaches SGLang. AFTER hooks return None, which HookRegistry reads as "keep the original
result" (plugins/hook_registry.py:375-383). Nothing here mutates a tensor or an SGLang object.

The hooks called once a run (geometry, KV pool, capacity, graph capture) write their record at
once. The hook around each forward is the step recording's (`steps.around_model_runner_forward`,
named here beside the others); the inner hooks (CP split, split positions, KV write, the forward
hooks) fill the draft it opened, and the device tensors they keep travel with the step's copy
batch (`copy_batches`).

The SGLang line cited at each function is the pinned release's `sglang/srt/<path>:<line>`
(`cptest.engines.sglang.releases.PINNED_RELEASE`).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import socket
import sys
import types
from collections.abc import Callable
from typing import Any, TypeVar

from cptest.probe import records
from cptest.probe import runtime as _runtime
from cptest.probe.forward_hooks import MODULES
from cptest.probe.runtime import Probe, get_probe
from cptest.probe.steps import around_model_runner_forward, int_list, text_positions
from cptest.rank_records import LayerPart

__all__ = [
    "after_capture_cuda_graphs",
    "after_cp_v1_split_positions",
    "after_initialize_model_parallel",
    "after_interleave_shard_positions",
    "after_kv_configure",
    "after_mla_set_kv_buffer",
    "after_prepare_cp_forward",
    "after_scheduler_init_info",
    "after_set_kv_buffer",
    "after_set_mla_kv_buffer",
    "after_zigzag_shard_positions",
    "around_model_runner_forward",
    "guards_itself",
    "on_attn_input",
    "on_logits_input",
    "on_mlp_input",
]
"""Every hook SGLang installs (`plugin.TARGETS`, `forward_hooks.MODULES`), and the marker for those
that contain their own errors."""

F = TypeVar("F", bound=Callable[..., Any])


def guards_itself(fn: F) -> F:
    """Mark a hook that contains its own errors: registered without `Probe.guarded`'s wrapper.

    For the hooks SGLang calls in every layer or every step: the wrapper is two more Python calls
    each time, and `after_set_kv_buffer` runs once per layer per step, probe on or paused.
    """
    fn._cptest_guards_itself = True  # type: ignore[attr-defined]
    return fn


# ---------------------------------------------------------------- once a run: geometry, pool, capacity
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
    probe.dcp_size = max(int(geo.sizes.get("dcp", 1)), 1)
    probe.dcp_rank = rank.dcp
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

    In the pinned release `Scheduler.max_total_num_tokens` is the model runner's value, i.e. per-rank *rows*
    under DCP (tp_worker.py:515-516); admission counts the allocator's slots instead
    (managers/schedule_policy.py:568-590), and the scheduler multiplies by dcp_size only for its pool
    statistics and the max_new_tokens clamp (scheduler.py:2005, 2137). The record carries the
    attribute as it is.
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
            batch_sizes=int_list(sizes) if sizes is not None else None,
        ))
    if runner is not None:
        probe.call("every_layer", _hook_every_layer, runner, probe)


_LAYER_MODULE = re.compile(
    r"model\.layers\.(\d+)\.(self_attn\.(?:attn|attn_mqa|attn_mqa_for_dcp_decode|attn_mha)|mlp)")
"""The modules of a layer whose rows the probe counts: Llama's and Qwen3's one attention
(`self_attn.attn`, forward_hooks.MODULES), or DeepSeek MLA's three (models/deepseek_v2.py:1900-1935:
`attn_mqa` for the absorbed path, `attn_mqa_for_dcp_decode` for decode under DCP, `attn_mha` for
the plain one), and the MLP."""


def _hook_every_layer(runner: Any, probe: Probe) -> None:
    """Give every layer the attention and MLP hooks that `--forward-hooks` gave the first, and move
    the hooks SGLang registered into instance forwards (`unregister_into_forward`).

    The plan's argv names the first layer's modules alone (`forward_hooks.MODULES`), and archives
    pin that argv: the other layers are hooked here, where the model is at hand. SGLang registers
    the `--forward-hooks` at the end of `capture_cuda_graphs` (cuda_graph_setup.py:157-164), so
    these too fire on eager forwards only. A layer whose spec the server was not given stays
    unhooked, as the first would be. With `runtime.ENV_LAYERS` set to `first` only the first layer's
    modules are hooked here: MLA's attention modules, which the argv's names do not match. The
    modules past the first layer go on `Probe.layer_forwards`, which decode steps between samples
    run without (`Probe.hook_layers`, `runtime.ENV_LAYER_STEPS`)."""
    first_only = os.environ.get(_runtime.ENV_LAYERS, "all") == "first"
    specs = getattr(getattr(runner, "server_args", None), "forward_hooks", None) or ()
    if isinstance(specs, str):
        specs = json.loads(specs)
    given = {s.get("name") for s in specs if isinstance(s, dict)}
    hooks = {"self_attn.attn": ("cptest_attn_rows", on_attn_input), "mlp": ("cptest_mlp_rows", on_mlp_input)}
    hooked_by_spec = {module for _, module in MODULES.values()}
    for name, module in runner.model.named_modules():
        if name in hooked_by_spec:
            unregister_into_forward(module)
            continue
        m = _LAYER_MODULE.fullmatch(name)
        if m is None or (first_only and m.group(1) != "0"):
            continue
        spec, hook = hooks["mlp" if m.group(2) == "mlp" else "self_attn.attn"]
        if spec in given:
            forward = wrap_forward(module, probe.timed_inner(hook))
            if forward is not None and m.group(1) != "0":
                probe.layer_forwards.append((module, forward))


WRAPPED = "_cptest_forward_hook"
"""The attribute `wrap_forward` leaves on a module it wrapped: the hook."""


def wrap_forward(module: Any, hook: Any) -> Any:
    """Call `hook(module, args, output)` after each forward of `module`, as `register_forward_hook`
    would, through an instance `forward` instead: a module with a registered hook leaves torch's
    fast call path, where an instance `forward` costs one Python call (benchmarks/probe_step.py
    --registered compares the two). The layers after the first are hooked this way, and the first
    layer's and the logits' hooks that SGLang registered are moved here (`unregister_into_forward`).
    Keyword arguments reach `forward` and not the hook, as with a registered hook. Returns the
    instance `forward` it set, None when `module` was wrapped already."""
    if getattr(module, WRAPPED, None) is not None:
        return None
    inner = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        out = inner(*args, **kwargs)
        hook(module, args, out)  # guards itself: never raises into the model
        return out

    module.forward = forward
    setattr(module, WRAPPED, hook)
    return forward


def unregister_into_forward(module: Any) -> bool:
    """Move the probe's row hook that SGLang registered on `module` (`--forward-hooks`,
    model_executor/hook_manager.py:55) into an instance `forward` (`wrap_forward`). A module with
    any registered forward hook leaves torch's fast call path on every call, while the probe is
    paused or switched off too, and that dispatch is outside the hook's own timing
    (`Probe.timed_inner`); SGLang keeps no handle, so the hook is the module's to move. Another
    plugin's hooks stay registered. Returns whether a hook was moved."""
    registered = getattr(module, "_forward_hooks", None)
    if not registered or getattr(module, WRAPPED, None) is not None:
        return False
    for key, hook in list(registered.items()):
        try:
            ours = inspect.unwrap(hook) in (on_attn_input, on_mlp_input, on_logits_input)
        except ValueError:  # a cycle of `__wrapped__`: not a wrapper of ours
            ours = False
        if ours:
            del registered[key]  # registered without kwargs or always_call: no other dict holds it
            wrap_forward(module, hook)
            return True
    return False


# ---------------------------------------------------------------- inner hooks of a forward
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
    draft.cp_logical_rows = int_list(logical)


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
    draft.split_pending = (text_positions(result), keep,
                           records.ZigzagLayout(list(meta.split_list), list(meta.zigzag_index)))


def after_interleave_shard_positions(result: Any, strategy: Any, _positions: Any, forward_batch: Any,
                                     *_a: Any, **_k: Any) -> None:
    """AFTER layers/cp/interleave.py:103 `InterleaveCPStrategy.shard_position_ids`: this rank's
    positions, every cp-th packed token from its rank on (interleave.py:108-123), padded at the end."""
    probe = get_probe()
    draft = probe.current if probe else None
    if probe is None or draft is None or not probe.observe_positions:
        return
    logical = getattr(forward_batch.attn_cp_metadata, "per_rank_logical_token", None)
    rank = int(strategy.cp_rank)
    keep = int(logical[rank]) if logical else None
    draft.split_pending = (text_positions(result), keep, records.StrideLayout(rank, int(strategy.cp_size)))


def after_cp_v1_split_positions(result: Any, forward_batch: Any, _positions: Any, *_a: Any,
                                **_k: Any) -> None:
    """AFTER layers/utils/cp_utils.py:150 `cp_split_and_rebuild_position`: this rank's positions on a
    model's own CP-v1 split (with CP v2 off: Qwen3-MoE, models/qwen2_moe.py:915-923; DeepSeek
    V2/V3/V3.2, models/deepseek_v2.py:2771-2779; V4, models/deepseek_v4.py:2380-2383).

    Its metadata is CP v2's zigzag layout, `split_list` and `zigzag_index` over 2 x cp blocks of each
    sequence (cp_utils.py:470-673), without padding: each rank's rows are `per_rank_actual_token`.
    DSA's round-robin split leaves the metadata empty (cp_utils.py:482-483) and is not read here. The
    DSA backend calls this again on later layers (dsa_backend.py:3144-3146): the step's first call counts.
    """
    probe = get_probe()
    draft = probe.current if probe else None
    if probe is None or draft is None or draft.cp_active:
        return
    meta = forward_batch.attn_cp_metadata
    split_list = getattr(meta, "split_list", None)
    actual = getattr(meta, "per_rank_actual_token", None)
    if not split_list or not actual:
        return
    draft.cp_active = True
    draft.cp_rank = int(probe.rank.attn_cp) if probe.rank else 0
    draft.cp_logical_rows = int_list(actual)
    if probe.observe_positions and draft.cp_rank < len(actual):
        draft.split_pending = (text_positions(result), int(actual[draft.cp_rank]),
                               records.ZigzagLayout(list(split_list), list(meta.zigzag_index)))


@guards_itself
def after_set_kv_buffer(_result: Any, pool: Any, layer: Any, loc_info: Any, cache_k: Any, cache_v: Any,
                        *args: Any, **kwargs: Any) -> None:
    """AFTER mem_cache/memory_pool.py:2305 `MHATokenToKVPool.set_kv_buffer`, first layer of a step.

    Records how many rows the write took and, under DCP, the owner mask SGLang passed
    (triton: `positions % dcp_size == dcp_rank`, layers/attention/triton_backend.py:1230-1239).
    """
    probe = _runtime._PROBE  # `_first_write`, inline: every layer of every step comes here
    draft = probe.current if probe is not None else None
    if draft is None or draft.kv_rows is not None:
        return
    try:
        draft.kv_rows = int(cache_k.shape[0])
        mask = kwargs.get("dcp_kv_mask", args[3] if len(args) > 3 else None)
        if mask is not None and probe.observe_positions:
            draft.kv_mask_pending = mask  # copied with the step's positions when the forward ends
        _skip_later_writes(probe, pool)
    except Exception as e:
        probe.call("after_set_kv_buffer", probe.error, "after_set_kv_buffer", e)


def _skip_later_writes(probe: Probe, pool: Any) -> None:
    """After a step's first K/V write: the step's later layers write through the pool's own
    `set_kv_buffer`, put in the pool's instance dict until the step ends (`Probe.unshadow_kv`),
    instead of through SGLang's hook wrapper and this hook, which would find nothing to record:
    two Python calls a layer, the larger part of an eager step's probe time in a deep model. As
    `Probe.hook_layers` does for the layers' modules."""
    direct = probe.kv_direct
    if direct is None or direct[0] is not pool:
        direct = probe.kv_direct = (pool, _direct_write(pool))
    if direct[1] is not None:
        pool.__dict__["set_kv_buffer"] = direct[1]
        probe.kv_shadowed = pool


def _direct_write(pool: Any) -> Any:
    """`pool.set_kv_buffer` without the probe's hook, bound to `pool`; None unless the method its
    class has is SGLang's hook wrapper (`plugins/hook_registry.py:375-383`, which keeps the
    function it wraps as `__wrapped__`) around this hook, with no other plugin's wrapper outside
    it (whose hook would be skipped too), and the pool keeps an instance dict."""
    wrapper = getattr(type(pool), "set_kv_buffer", None)
    inner = getattr(wrapper, "__wrapped__", None)
    cells = getattr(wrapper, "__closure__", None) or ()
    try:  # the hook as registered, under `Probe.timed_inner`'s wrapper while measuring
        ours = any(inspect.unwrap(c.cell_contents) is after_set_kv_buffer for c in cells)
    except ValueError:  # an empty cell, or a cycle of `__wrapped__`
        ours = False
    if inner is None or not ours or not hasattr(pool, "__dict__"):
        return None
    return types.MethodType(inner, pool)


@guards_itself
def after_set_mla_kv_buffer(_result: Any, pool: Any, layer: Any, loc: Any, cache_k_nope: Any,
                            *_args: Any, **_kwargs: Any) -> None:
    """AFTER `MLATokenToKVPool.set_mla_kv_buffer` (mem_cache/memory_pool.py:4095), first layer of a
    step: MLA's latent K/V write, which takes no owner mask from its caller. Under DCP its kernel
    keeps the rows where `loc % dcp == dcp_rank`, at `loc // dcp`
    (sglang/kernels/ops/kvcache/mla_buffer.py:39-41): the probe makes that mask from `loc`."""
    _mla_write(loc, cache_k_nope, at_loc=False)


@guards_itself
def after_mla_set_kv_buffer(_result: Any, pool: Any, layer: Any, loc_info: Any, cache_k: Any,
                            *_args: Any, **_kwargs: Any) -> None:
    """AFTER `MLATokenToKVPool.set_kv_buffer` (mem_cache/memory_pool.py:4019), first layer of a step.
    Under DCP it keeps the rows where `loc % dcp == dcp_rank`, but at row `loc` itself, not
    `loc // dcp` (mem_cache/memory_pool.py:4030-4044): the mask is recorded, the rows' slots are not, and a
    note says so once."""
    _mla_write(getattr(loc_info, "loc", loc_info), cache_k, at_loc=True)  # unwrap_write_loc


def _first_write() -> tuple[Probe | None, records.StepDraft | None]:
    """The probe and the step's draft when this is the step's first K/V write; (probe, None) for
    every layer after the first, and every layer while paused: nothing more to record."""
    probe = _runtime._PROBE
    draft = probe.current if probe is not None else None
    return probe, (draft if draft is not None and draft.kv_rows is None else None)


def _mla_write(loc: Any, cache_k: Any, *, at_loc: bool) -> None:
    probe, draft = _first_write()
    if probe is None or draft is None:
        return
    try:
        draft.kv_rows = int(cache_k.shape[0])
        if probe.dcp_size > 1 and probe.observe_positions:
            # one comparison on the device, in the first layer only
            draft.kv_mask_pending = loc % probe.dcp_size == probe.dcp_rank
            if at_loc:
                draft.kv_at_loc = True
                probe.warn_once("mla_set_kv_buffer_dcp", "MLA's set_kv_buffer under DCP keeps rows "
                                "loc % dcp == dcp_rank at row loc, not loc // dcp "
                                "(mem_cache/memory_pool.py:4030-4044); those rows' kv_slots are not recorded")
    except Exception as e:
        probe.call("mla_kv_write", probe.error, "mla_kv_write", e)


# ---------------------------------------------------------------- torch forward hooks
@guards_itself
def on_attn_input(module: Any, args: tuple[Any, ...], _output: Any) -> None:
    """Forward hook on every layer's attention (RadixAttention, layers/radix_attention.py:150: Llama's
    and Qwen3's `self_attn.attn`, the first by `--forward-hooks`, the others and MLA's by
    `_hook_every_layer`): rows entering it. The
    layers run in order, so the hook's k-th call in a step is the step's k-th layer on this rank; a
    count that differs from the first layer's starts `layer_rows`. A layer may call attention more
    than once (MLA's plain path runs once more per chunk of a cached prefix,
    models/deepseek_common/attention_forward_methods/forward_mha.py:412, 508): a call with the layer
    id (`RadixAttention.layer_id`) of the one before it is that layer's again, not the next."""
    probe = _runtime._PROBE
    draft = probe.current if probe is not None else None
    if draft is None or not args:
        return
    try:
        layer_id = getattr(module, "layer_id", None)
        if layer_id is not None and draft.attn_layers and layer_id == draft.attn_layer_id:
            return
        draft.attn_layer_id = layer_id
        n = args[0].shape[0]
        k = draft.attn_layers
        draft.attn_layers = k + 1
        if k == 0:
            draft.attn_rows_seen = int(n)
        elif n != draft.attn_rows_seen or (draft.layer_rows is not None and "attn" in draft.layer_rows):
            _layer_rows(draft, "attn", k, int(n), draft.attn_rows_seen)
    except Exception as e:
        probe.call("attn_rows", probe.error, "attn_rows", e)


@guards_itself
def on_mlp_input(_module: Any, args: tuple[Any, ...], output: Any) -> None:
    """Forward hook on every layer's `mlp` (the dense MLP or the MoE block): rows entering it and
    rows leaving it, per layer as `on_attn_input` counts them."""
    probe = _runtime._PROBE
    draft = probe.current if probe is not None else None
    if draft is None or not args:
        return
    try:
        n = args[0].shape[0]
        o = output[0] if isinstance(output, tuple) else output
        out = None if o is None else int(o.shape[0])
        k = draft.ffn_layers
        draft.ffn_layers = k + 1
        if k == 0:
            draft.ffn_rows, draft.ffn_out_rows = int(n), out
            return
        lr = draft.layer_rows
        if n != draft.ffn_rows or (lr is not None and "ffn" in lr):
            _layer_rows(draft, "ffn", k, int(n), draft.ffn_rows)
        if out is not None and (out != draft.ffn_out_rows or (lr is not None and "ffn_out" in lr)):
            _layer_rows(draft, "ffn_out", k, out, draft.ffn_out_rows)
    except Exception as e:
        probe.call("mlp_rows", probe.error, "mlp_rows", e)


def _layer_rows(draft: Any, part: LayerPart, k: int, n: int, first: int | None) -> None:
    """Layer `k`'s count `n` of `part`, the layers before it having had the first one's (`first`)."""
    lr = draft.layer_rows
    if lr is None:
        lr = draft.layer_rows = {}
    rows = lr.get(part)
    if rows is None:
        rows = lr[part] = [-1 if first is None else first] * k
    rows.append(n)


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
