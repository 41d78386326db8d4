"""Factories for SGLang's `--forward-hooks` (model_executor/hook_manager.py:11-56 of the pinned release).

SGLang imports `hook_factory` ("module:function"), calls it with the spec's `config` and attaches
the returned callable with `register_forward_hook` to every module whose name matches
`target_modules` (fnmatch). The pinned release attaches them *after* CUDA-graph capture
(cuda_graph_setup.py:157-164), so they fire on eager forwards only. A factory returns None when the
probe is off, which SGLang logs and skips.

`spec()` is the value for `--forward-hooks` that the plan puts into argv (a JSON list).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

ForwardHook = Callable[[Any, tuple[Any, ...], Any], None]

MODULES: dict[str, tuple[str, str]] = {
    "cptest_attn_rows": ("cptest.probe.forward_hooks:attn_rows", "model.layers.0.self_attn.attn"),
    "cptest_mlp_rows": ("cptest.probe.forward_hooks:mlp_rows", "model.layers.0.mlp"),
    "cptest_logits_rows": ("cptest.probe.forward_hooks:logits_rows", "logits_processor"),
}
"""Spec name -> (factory, module name). Module names hold for Llama and Qwen3 in the pinned
release (models/llama.py:209,329,535; models/qwen3.py:149,350,502)."""


def _make(name: str, hook: str) -> ForwardHook | None:
    # Imported here, inside the engine: `spec()` is what the (pure) planner imports this module for.
    from cptest.probe import hooks
    from cptest.probe.runtime import get_probe

    probe = get_probe()
    if probe is None:
        return None
    fn = getattr(hooks, hook)
    return probe.timed_inner(fn if getattr(fn, "_cptest_guards_itself", False) else probe.guarded(name)(fn))


def attn_rows(config: dict[str, Any] | None = None) -> ForwardHook | None:
    return _make("attn_rows", "on_attn_input")


def mlp_rows(config: dict[str, Any] | None = None) -> ForwardHook | None:
    return _make("mlp_rows", "on_mlp_input")


def logits_rows(config: dict[str, Any] | None = None) -> ForwardHook | None:
    return _make("logits_rows", "on_logits_input")


def spec(names: tuple[str, ...] = tuple(MODULES)) -> str:
    """The `--forward-hooks` argument value (compact JSON) for the given hook names."""
    return json.dumps(
        [
            {"name": n, "target_modules": [MODULES[n][1]], "hook_factory": MODULES[n][0], "config": {}}
            for n in names
        ],
        separators=(",", ":"),
    )
