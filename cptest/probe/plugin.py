"""The SGLang plugin entry point (`sglang.srt.plugins` group, `cptest_probe = cptest.probe.plugin:register`).

SGLang calls `register()` through `load_plugins()` in every scheduler process
(managers/scheduler.py:4895) and in the launcher (launch_server.py:66), then applies the hooks
(plugins/__init__.py:103-141). `register()` does nothing unless `CPTEST_PROBE_DIR` is set.

`TARGETS` is the release-specific knowledge, as data, with lines cited in the pinned release
(`cptest.engines.sglang.releases.PINNED_RELEASE`; the probe runs inside SGLang and imports no
cptest module above its own layer, so it cannot ask the release table). It never branches on a
version string: whether a target exists in the running SGLang is the test (`pkgutil.resolve_name`),
and one that does not resolve is reported as a ProbeNote warning (the evidence it would give is then
missing, and a checker says unknown) instead of failing the plugin.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from cptest.probe import hooks, pool_hooks
from cptest.probe.runtime import get_probe


@dataclass(frozen=True)
class Target:
    path: str
    """Dotted path HookRegistry resolves with pkgutil.resolve_name (module.Class.method)."""
    kind: Literal["before", "after", "around"]
    hook: Callable[..., Any]
    gives: str
    """What evidence goes missing when the target is absent."""
    cite: str
    """The pinned release's `sglang/srt/<path>:<line>`."""
    inner: bool = False
    """Fires inside a forward, every step: timed while the probe measures itself (`Probe.timed_inner`)."""


TARGETS: tuple[Target, ...] = (
    Target("sglang.srt.distributed.parallel_state.initialize_model_parallel", "after",
           hooks.after_initialize_model_parallel, "geometry", "distributed/parallel_state.py:2191"),
    Target("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator.configure", "after",
           hooks.after_kv_configure, "kv_pool", "mem_cache/kv_cache_configurator.py:239"),
    Target("sglang.srt.managers.scheduler.Scheduler.get_init_info", "after",
           hooks.after_scheduler_init_info, "capacity", "managers/scheduler.py:1607"),
    Target("sglang.srt.model_executor.model_runner_components.cuda_graph_setup.capture_cuda_graphs", "after",
           hooks.after_capture_cuda_graphs, "graph capture",
           "model_executor/model_runner_components/cuda_graph_setup.py:105"),
    Target("sglang.srt.model_executor.model_runner.ModelRunner.forward", "around",
           hooks.around_model_runner_forward, "steps and replay counts",
           "model_executor/model_runner.py:1382"),
    Target("sglang.srt.layers.cp.utils.prepare_cp_forward", "after",
           hooks.after_prepare_cp_forward, "PCP split (attn_rows, cp_active)", "layers/cp/utils.py:157",
           inner=True),
    Target("sglang.srt.layers.cp.zigzag.ZigzagCPStrategy.shard_position_ids", "after",
           hooks.after_zigzag_shard_positions, "zigzag rank positions", "layers/cp/zigzag.py:308",
           inner=True),
    Target("sglang.srt.layers.cp.interleave.InterleaveCPStrategy.shard_position_ids", "after",
           hooks.after_interleave_shard_positions, "interleave rank positions",
           "layers/cp/interleave.py:103", inner=True),
    Target("sglang.srt.layers.utils.cp_utils.cp_split_and_rebuild_position", "after",
           hooks.after_cp_v1_split_positions, "PCP split on a model's CP-v1 path (attn_rows, positions)",
           "layers/utils/cp_utils.py:150", inner=True),
    Target("sglang.srt.mem_cache.memory_pool.MHATokenToKVPool.set_kv_buffer", "after",
           hooks.after_set_kv_buffer, "kv_written", "mem_cache/memory_pool.py:2305", inner=True),
    Target("sglang.srt.mem_cache.memory_pool.MLATokenToKVPool.set_kv_buffer", "after",
           hooks.after_mla_set_kv_buffer, "kv_written (MLA)", "mem_cache/memory_pool.py:4019", inner=True),
    Target("sglang.srt.mem_cache.memory_pool.MLATokenToKVPool.set_mla_kv_buffer", "after",
           hooks.after_set_mla_kv_buffer, "kv_written (MLA)", "mem_cache/memory_pool.py:4095", inner=True),
    Target("sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run", "after",
           pool_hooks.after_get_next_batch_to_run, "pool samples", "managers/scheduler.py:2925"),
)


def register() -> None:
    """Register the probe's hooks with SGLang's HookRegistry; a no-op when the probe is off.

    Never raises: a failure is written as a ProbeNote (SGLang would only log it,
    plugins/__init__.py:135-136, and the run would silently lack evidence).
    """
    probe = get_probe()
    if probe is None:
        return
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except Exception as e:
        probe.note(f"cannot import sglang.srt.plugins.hook_registry: {type(e).__name__}: {e}", "error")
        return
    kinds = {"before": HookType.BEFORE, "after": HookType.AFTER, "around": HookType.AROUND}
    for t in TARGETS:
        try:
            pkgutil.resolve_name(t.path)
        except Exception as e:
            probe.note(f"hook target {t.path} ({t.cite}) not found: {type(e).__name__}: {e}; "
                       f"no {t.gives} evidence", "warning")
            continue
        # AROUND guards its own begin/end (SGLang's own exceptions must pass through unchanged);
        # the per-layer KV hook guards itself (a wrapper per layer per step is a measurable cost).
        own = t.kind == "around" or getattr(t.hook, "_cptest_guards_itself", False)
        fn = t.hook if own else probe.guarded(t.hook.__name__)(t.hook)
        HookRegistry.register(t.path, probe.timed_inner(fn) if t.inner else fn, kinds[t.kind])
