"""cptest/probe/plugin.py against SGLang 0.5.17's real HookRegistry and source.

The real `hook_registry.py` is loaded from an unpacked 0.5.17 wheel (its own imports are stdlib
only; the `sglang.srt.plugins` package around it needs SGLang's dependencies, so the test loads the
file alone). Point `CPTEST_SGLANG_SRC` at the folder holding `sglang/` (default: /tmp/sgl/site or
/tmp/sgl/src); the tests are skipped where no such folder exists.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cptest.evidence import ProbeNote, RankId, read_records
from cptest.probe import plugin, runtime
from cptest.probe.plugin import Target
from cptest.probe.runtime import Probe


def _sglang_root() -> Path | None:
    for cand in (os.environ.get("CPTEST_SGLANG_SRC", ""), "/tmp/sgl/site", "/tmp/sgl/src", _engine_site()):
        if cand and (Path(cand) / "sglang/srt/plugins/hook_registry.py").is_file():
            return Path(cand)
    return None


def _engine_site() -> str:
    """The site-packages of the SGLang interpreter CI builds from the pinned wheel
    (`CPTEST_SGLANG_PYTHON`, tools/sglang-cpu-env.sh): the release's own files, installed."""
    python = os.environ.get("CPTEST_SGLANG_PYTHON", "")
    if not python or not Path(python).exists():
        return ""
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, timeout=60, check=False)
    return out.stdout.strip() if out.returncode == 0 else ""


ROOT = _sglang_root()
needs_sglang = pytest.mark.skipif(ROOT is None, reason="no unpacked SGLang 0.5.17 (set CPTEST_SGLANG_SRC)")


@pytest.fixture
def real_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    assert ROOT is not None
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    spec = importlib.util.spec_from_file_location(
        "sglang.srt.plugins.hook_registry", ROOT / "sglang/srt/plugins/hook_registry.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", mod)
    spec.loader.exec_module(mod)
    mod.HookRegistry.reset()
    yield mod
    mod.HookRegistry.reset()


@pytest.fixture
def probe(tmp_path: Path) -> Iterator[Probe]:
    p = Probe(tmp_path)
    runtime.set_probe(p)
    p.set_rank(RankId(world=0))
    yield p
    runtime.set_probe(None)
    p.close()


class Engine:
    """A stand-in SGLang class whose method a hook patches."""

    def compute(self, x: int) -> dict[str, int]:
        return {"x": x}


def _after_raises(result: Any, *args: Any, **kwargs: Any) -> None:
    raise KeyError("probe bug")


def _after_observes(result: Any, *args: Any, **kwargs: Any) -> None:
    runtime.get_probe().note(f"saw {result}")  # type: ignore[union-attr]


def test_register_does_nothing_when_the_probe_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(runtime.ENV_DIR, raising=False)
    runtime.set_probe(None)
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", None)  # import would fail
    plugin.register()  # returns before importing SGLang


def test_the_plugin_and_every_hook_module_import_without_torch_or_sglang() -> None:
    """The probe imports on a CPU without SGLang (its tests run it against fakes): none of its
    modules imports torch or SGLang when it loads; the hooks read them from `sys.modules`."""
    script = ("import json, sys; import cptest.probe.plugin, cptest.probe.forward_hooks; "
              "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang') "
              "or m.startswith('cptest.probe.'))))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          check=True)
    loaded = json.loads(done.stdout)
    assert {"cptest.probe.copy_batches", "cptest.probe.hooks", "cptest.probe.steps"} <= set(loaded)
    assert [m for m in loaded if not m.startswith("cptest.")] == []


@needs_sglang
def test_a_raising_after_hook_keeps_the_original_result_under_the_real_registry(
    real_registry: Any, probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = f"{__name__}.Engine.compute"
    monkeypatch.setattr(plugin, "TARGETS", (
        Target(target, "after", _after_raises, "test", "-"),
        Target(target, "after", _after_observes, "test", "-"),
    ))
    original = Engine.compute
    try:
        plugin.register()
        real_registry.HookRegistry.apply_hooks()
        assert Engine.compute is not original
        assert Engine().compute(3) == {"x": 3}
    finally:
        Engine.compute = original  # type: ignore[method-assign]
    assert probe.flush()
    recs, _ = read_records(probe.out_dir / "rank0.jsonl")
    msgs = [(r.level, r.message) for r in recs if isinstance(r, ProbeNote)]
    assert ("error", "_after_raises: KeyError: 'probe bug'") in msgs
    assert ("info", "saw {'x': 3}") in msgs


@needs_sglang
def test_a_module_function_is_patched_where_another_module_imported_it_by_name(
    real_registry: Any, probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CP hooks target module-level functions (`prepare_cp_forward`, `cp_split_and_rebuild_position`)
    # that the models and the eager runner import by name before the plugin runs: the registry must
    # reach those copies too (`hook_registry._propagate_patch`), or the hook never fires.
    source, user = types.ModuleType("cptest_fake_cp_utils"), types.ModuleType("cptest_fake_model")

    def split(x: int) -> int:
        return x + 1

    split.__module__ = source.__name__
    source.split = split  # type: ignore[attr-defined]
    user.split = split  # type: ignore[attr-defined]  # `from cptest_fake_cp_utils import split`
    monkeypatch.setitem(sys.modules, source.__name__, source)
    monkeypatch.setitem(sys.modules, user.__name__, user)
    target = Target(f"{source.__name__}.split", "after", _after_observes, "test", "-")
    monkeypatch.setattr(plugin, "TARGETS", (target,))
    plugin.register()
    real_registry.HookRegistry.apply_hooks()
    assert user.split is not split and user.split(1) == 2  # type: ignore[attr-defined]
    assert probe.flush()
    recs, _ = read_records(probe.out_dir / "rank0.jsonl")
    assert [r.message for r in recs if isinstance(r, ProbeNote)] == ["saw 2"]


@needs_sglang
def test_a_target_missing_from_the_release_is_a_warning_not_a_failure(
    real_registry: Any, probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plugin, "TARGETS", (
        Target(f"{__name__}.Engine.no_such_method", "after", _after_observes, "graph capture", "x.py:1"),
    ))
    plugin.register()
    assert dict(real_registry.HookRegistry._hooks) == {}
    assert probe.flush()
    recs, _ = read_records(probe.out_dir / "rank0.jsonl")
    (note,) = recs
    assert isinstance(note, ProbeNote) and note.level == "warning"
    assert "no graph capture evidence" in note.message


@needs_sglang
@pytest.mark.parametrize("target", plugin.TARGETS, ids=lambda t: t.path.rsplit(".", 2)[-2])
def test_every_target_is_defined_at_its_cited_line_of_the_pinned_release(target: Target) -> None:
    assert ROOT is not None
    rel, line = target.cite.rsplit(":", 1)
    src = ROOT / "sglang/srt" / rel
    assert src.is_file(), f"{src} missing"
    module_path = "sglang/srt/" + rel.removesuffix(".py")
    assert target.path.replace(".", "/").startswith(module_path), (target.path, rel)
    names = target.path[len(module_path.replace("/", ".")) + 1:].split(".")
    tree = ast.parse(src.read_text())
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for name in names:
        defs = (n for n in body if isinstance(n, ast.FunctionDef | ast.ClassDef))
        node = next((n for n in defs if n.name == name), None)
        assert node is not None, f"{name} not found in {src}"
        body = node.body  # type: ignore[attr-defined]
    assert isinstance(node, ast.FunctionDef) and node.lineno == int(line)


class KVPool:
    """A stand-in K/V pool: `set_kv_buffer` as SGLang's MHA pool takes it, each call counted."""

    def __init__(self) -> None:
        self.writes = 0

    def set_kv_buffer(self, layer: Any, loc: Any, cache_k: Any, cache_v: Any, *args: Any,
                      **kwargs: Any) -> None:
        self.writes += 1


def _kv_steps(pool: KVPool, steps: int, layers: int, raise_at: int | None = None) -> None:
    """Eager decode steps of two requests through the probe's step hook, each writing K/V in every
    layer as SGLang's attention does (`forward_batch.token_to_kv_pool.set_kv_buffer`); the
    forward of step `raise_at` raises after its first layer's write."""
    import torch

    from cptest.probe import hooks

    runner = types.SimpleNamespace(is_draft_worker=False, decode_cuda_graph_runner=None)
    mode = types.SimpleNamespace(name="DECODE")
    for n in range(1, steps + 1):
        fb = types.SimpleNamespace(forward_mode=mode, input_ids=torch.arange(2),
                                   positions=torch.tensor([n, n]), rids=["a", "b"], batch_size=2,
                                   extend_seq_lens_cpu=None, extend_prefix_lens_cpu=None)

        def forward(_r: Any, b: Any, n: int = n) -> Any:
            k = torch.zeros(2, 1, 4)
            for layer in range(layers):
                pool.set_kv_buffer(layer, None, k, k)
                if n == raise_at:
                    raise RuntimeError("boom")
            return types.SimpleNamespace(can_run_graph=False)

        if n == raise_at:
            with pytest.raises(RuntimeError):
                hooks.around_model_runner_forward(forward, runner, fb)
        else:
            hooks.around_model_runner_forward(forward, runner, fb)
        assert "set_kv_buffer" not in pool.__dict__  # the step's end gave the hook back


def _counting(calls: list[int]) -> Any:
    """The K/V hook, its calls counted, wrapped as `Probe.timed_inner` wraps it (`__wrapped__`)."""
    import functools

    from cptest.probe import hooks

    @functools.wraps(hooks.after_set_kv_buffer)
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return hooks.after_set_kv_buffer(*args, **kwargs)

    return counted


def _ours(calls: list[int]) -> Target:
    """The probe's K/V hook as the plugin registers it (an inner hook), its calls counted."""
    return Target(f"{__name__}.KVPool.set_kv_buffer", "after", _counting(calls), "kv_written", "-",
                  inner=True)


def _hooked_kv_steps(registry: Any, monkeypatch: pytest.MonkeyPatch, targets: list[Target], steps: int,
                     raise_at: int | None = None) -> KVPool:
    """`targets` on `KVPool.set_kv_buffer` in their order, applied by the real HookRegistry, then
    `_kv_steps` of four layers on a pool: the pool, its class's own method given back."""
    monkeypatch.setattr(plugin, "TARGETS", tuple(targets))
    original = KVPool.set_kv_buffer
    try:
        plugin.register()
        registry.HookRegistry.apply_hooks()
        assert KVPool.set_kv_buffer is not original
        pool = KVPool()
        _kv_steps(pool, steps=steps, layers=4, raise_at=raise_at)
    finally:
        KVPool.set_kv_buffer = original  # type: ignore[method-assign]
    return pool


@needs_sglang
@pytest.mark.parametrize("timing", [False, True], ids=["untimed", "timed"])
def test_a_steps_later_kv_writes_skip_the_hook_and_every_step_is_still_seen(
    real_registry: Any, probe: Probe, monkeypatch: pytest.MonkeyPatch, timing: bool
) -> None:
    """After a step's first K/V write its later layers write through the pool's own method, not
    through SGLang's hook wrapper and the probe's hook: one hook call a step, not one a layer. Every
    write still happens, every step's write is recorded (the next step's first write reaches the
    hook again), and a forward that raises after its first write gives the hook back too."""
    from cptest.evidence import Step
    from cptest.probe import hooks

    probe.cp_configured = False
    probe.timing = timing
    calls: list[int] = []
    pool = _hooked_kv_steps(real_registry, monkeypatch, [_ours(calls)], steps=6, raise_at=3)
    assert pool.writes == 5 * 4 + 1  # every layer's write of every step, and the raising step's first
    assert len(calls) == 6  # one hook call a step
    assert probe.flush()
    steps = [r for r in read_records(probe.out_dir / "rank0.jsonl")[0] if isinstance(r, Step)]
    assert sorted(s.step for s in steps) == [1, 2, 4, 5, 6]
    assert all(s.kv_written for s in steps)
    assert hooks._direct_write(KVPool()) is None  # the class's own method again: nothing to skip


def _other_plugin(seen: list[int]) -> Any:
    def after(_result: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(1)

    return after


@needs_sglang
@pytest.mark.parametrize("ours_first", [True, False], ids=["ours-inside", "ours-outside"])
def test_another_plugins_kv_hook_still_sees_every_layer(
    real_registry: Any, probe: Probe, monkeypatch: pytest.MonkeyPatch, ours_first: bool
) -> None:
    """Another plugin's hook on the same method runs for every layer of every step, whether its
    wrapper is inside the probe's (the pool's own method then means that wrapper) or outside it
    (then nothing is skipped)."""
    probe.cp_configured = False
    calls: list[int] = []
    seen: list[int] = []
    ours = _ours(calls)
    theirs = Target(f"{__name__}.KVPool.set_kv_buffer", "after", _other_plugin(seen), "other", "-")
    pool = _hooked_kv_steps(real_registry, monkeypatch, [ours, theirs] if ours_first else [theirs, ours],
                            steps=3)
    assert pool.writes == len(seen) == 12
    assert len(calls) == (12 if ours_first else 3)  # registered first: SGLang wraps it inside the other



def _real_hook_manager(monkeypatch: pytest.MonkeyPatch) -> Any:
    """SGLang's own `model_executor/hook_manager.py` (it imports torch and the stdlib alone)."""
    assert ROOT is not None
    spec = importlib.util.spec_from_file_location(
        "sglang.srt.model_executor.hook_manager", ROOT / "sglang/srt/model_executor/hook_manager.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    return mod


@needs_sglang
def test_the_forward_hooks_sglang_registers_leave_torchs_hook_dispatch_and_still_count_rows(
    probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--forward-hooks` as SGLang's own hook manager registers them, then the probe's graph-setup
    hook: no module keeps a registered hook (each call takes torch's fast path), and a step still
    counts every layer's rows and the logits' rows."""
    import torch

    from cptest.evidence import Step
    from cptest.probe import forward_hooks, hooks
    from tests.probe.test_layers_and_slots import _Logits, _Model

    model = _Model(3)
    model.logits_processor = _Logits()
    specs = json.loads(forward_hooks.spec())
    _real_hook_manager(monkeypatch).register_forward_hooks(model, specs)
    assert len(model.model.layers[0].mlp._forward_hooks) == 1  # SGLang's registration, as it leaves it
    runner = types.SimpleNamespace(model=model, is_draft_worker=False,
                                   server_args=types.SimpleNamespace(forward_hooks=specs))
    hooks.after_capture_cuda_graphs(types.SimpleNamespace(prefill=None, decode=None), model_runner=runner)
    assert [name for name, m in model.named_modules() if m._forward_hooks] == []
    assert sum(getattr(m, hooks.WRAPPED, None) is not None for m in model.modules()) == 7

    def forward(_runner: Any, _fb: Any) -> Any:
        k = torch.zeros(5, 1, 4)
        hooks.after_set_kv_buffer(None, object(), object(), None, k, k)
        model.logits_processor(None, model(torch.zeros(5, 8)))
        return types.SimpleNamespace(can_run_graph=False)

    fb = types.SimpleNamespace(forward_mode=types.SimpleNamespace(name="EXTEND"), input_ids=torch.arange(5),
                               positions=torch.arange(5), rids=["a"], batch_size=1, extend_seq_lens_cpu=[5],
                               extend_prefix_lens_cpu=[0])
    hooks.around_model_runner_forward(forward, types.SimpleNamespace(is_draft_worker=False), fb)
    assert probe.flush()
    (step,) = [r for r in read_records(probe.out_dir / "rank0.jsonl")[0] if isinstance(r, Step)]
    assert (step.layers, step.ffn_rows, step.ffn_out_rows, step.logits_rows) == (3, 5, 5, 5)
