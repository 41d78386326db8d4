"""The probe's per-layer rows, the MLP's output rows and rows' identity, and the KV slots an
extend writes, against fake SGLang objects holding small CPU tensors (as tests/probe/test_hooks.py)."""

from __future__ import annotations

import json
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from cptest.evidence import ProbeNote, Step, slot_pairs  # noqa: E402
from cptest.probe import copy_batches, forward_hooks, hooks, runtime  # noqa: E402
from cptest.probe.runtime import Probe  # noqa: E402
from tests.probe.test_hooks import (  # noqa: E402
    MP,
    Batch,
    Mode,
    Output,
    Runner,
    _fake_parallel_state,
    _records,
    zigzag_step,
)


@dataclass
class SlotBatch(Batch):
    out_cache_loc: Any = None


class Rows(torch.nn.Module):
    """A stand-in module whose output keeps its first `keep` rows (all of them when None)."""

    def __init__(self, keep: int | None = None) -> None:
        super().__init__()
        self.keep = keep

    def forward(self, x: Any) -> Any:
        return x if self.keep is None else x[: self.keep]


def _model(mlp_keeps: list[int | None], attn_rows: list[int] | None = None) -> Any:
    """A model of one layer per entry: an attention module (fed `attn_rows[i]` rows, the batch's
    when None) and an MLP keeping `mlp_keeps[i]` rows, each carrying the probe's forward hooks,
    as `--forward-hooks` attaches them to every layer."""
    attns, mlps = [], []
    for keep in mlp_keeps:
        a, m = Rows(), Rows(keep)
        a.register_forward_hook(hooks.on_attn_input)
        m.register_forward_hook(hooks.on_mlp_input)
        attns.append(a)
        mlps.append(m)

    def forward(runner: Runner, fb: Batch, *_a: Any, **_k: Any) -> Output:
        n = int(fb.input_ids.shape[0])
        k = torch.zeros(n, 1, 4)
        hooks.after_set_kv_buffer(None, object(), object(), None, k, k)
        for i, (a, m) in enumerate(zip(attns, mlps, strict=True)):
            a(torch.zeros(attn_rows[i] if attn_rows else n, 8))
            m(torch.zeros(n, 8))
        return Output(can_run_graph=False)

    return forward


def _steps(probe: Probe) -> list[Step]:
    return [r for r in _records(probe) if isinstance(r, Step)]


def _extend(n: int = 4) -> SlotBatch:
    return SlotBatch(Mode("EXTEND"), torch.arange(n), torch.arange(n), ["a"], 1, [n], [0])


def test_a_step_records_how_many_layers_ran_and_no_per_layer_list_when_all_agree(
        probe: Probe, monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    hooks.around_model_runner_forward(_model([None] * 3), Runner(), _extend())
    (s,) = _steps(probe)
    assert (s.layers, s.attn_rows, s.ffn_rows, s.ffn_out_rows, s.layer_rows) == (3, 4, 4, 4, None)
    assert s.ffn_seq_positions is None and s.ffn_out_seq_positions is None  # the attention rows


def test_a_layer_whose_rows_differ_from_the_first_lists_every_layer_of_that_part_alone(
        probe: Probe, monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    model = _model([None, None, 2, None], attn_rows=[4, 3, 4, 4])
    hooks.around_model_runner_forward(model, Runner(), _extend())
    (s,) = _steps(probe)
    assert s.layers == 4 and (s.ffn_rows, s.ffn_out_rows) == (4, 4)
    assert s.layer_rows == {"attn": [4, 3, 4, 4], "ffn_out": [4, 4, 2, 4]}


def test_a_decode_step_with_a_layer_of_its_own_leaves_the_run_and_says_so(probe: Probe,
                                                                          monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    same, odd = _model([None, None]), _model([None, 1])

    def decode(step: int) -> SlotBatch:
        return SlotBatch(Mode("DECODE"), torch.arange(2), torch.tensor([5 + step, 9 + step]), ["a", "b"], 2)

    for k, fwd in enumerate([same, same, odd, same, same]):
        hooks.around_model_runner_forward(fwd, Runner(), decode(k))
    steps = _steps(probe)
    assert [s.layers for s in steps] == [2] * 5
    assert [s.layer_rows for s in steps] == [None, None, {"ffn_out": [2, 1]}, None, None]
    assert [s.ffn_out_rows for s in steps] == [2] * 5
    assert [s.seq_positions["b"] for s in steps] == [[(9 + k, 10 + k)] for k in range(5)]
    text = (probe.out_dir / "rank0.jsonl").read_text()
    assert text.count('"kind":"steps"') == 2 and '"layers":2' in text  # the runs before and after it


def test_an_extend_under_dcp_records_the_rank_local_pool_rows_of_what_it_wrote(
        probe: Probe, monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 1)  # dcp 2, this rank 1: it stores odd positions
    hooks.after_initialize_model_parallel(None)
    # request a at positions 0..5 in slots 100..105, request b at 0..2 in slots 41, 40, 43
    loc = torch.tensor([100, 101, 102, 103, 104, 105, 41, 40, 43])
    fb = SlotBatch(Mode("EXTEND"), torch.arange(9), torch.tensor([0, 1, 2, 3, 4, 5, 0, 1, 2]), ["a", "b"], 2,
                   [6, 3], [0, 0], out_cache_loc=loc)

    def forward(runner: Runner, b: Batch) -> Output:
        k = torch.zeros(9, 1, 4)
        hooks.after_set_kv_buffer(None, object(), object(), None, k, k, dcp_kv_mask=b.positions % 2 == 1)
        return Output(can_run_graph=False)

    hooks.around_model_runner_forward(forward, Runner(), fb)
    (s,) = _steps(probe)
    assert s.kv_written == {"a": [(1, 2), (3, 4), (5, 6)], "b": [(1, 2)]}
    # loc // 2 of the rows this rank owns: a's 101, 103, 105 -> 50, 51, 52 (positions 1, 3, 5)
    assert s.kv_slots == {"a": [(1, 6, 50)], "b": [(1, 2, 20)]}  # one run over a's owned positions
    assert slot_pairs(s.kv_slots["a"], s.kv_written["a"]) == [(1, 50), (3, 51), (5, 52)]


def test_without_dcp_a_contiguous_allocation_is_one_run_per_request(probe: Probe, monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    probe.dcp_size = 1
    fb = _extend(6)
    fb.out_cache_loc = torch.arange(30, 36)
    hooks.around_model_runner_forward(_model([None]), Runner(), fb)
    (s,) = _steps(probe)
    assert s.kv_slots == {"a": [(0, 6, 30)]}


def test_a_decode_step_records_no_slots_and_keeps_its_run(probe: Probe, monkeypatch: MP) -> None:
    """Decode steps' slots are not copied: their runs stay one line a batch."""
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    for k in range(3):
        fb = SlotBatch(Mode("DECODE"), torch.arange(1), torch.tensor([7 + k]), ["a"], 1,
                       out_cache_loc=torch.tensor([50 + k]))
        hooks.around_model_runner_forward(_model([None]), Runner(), fb)
    steps = _steps(probe)
    assert [s.kv_slots for s in steps] == [{}] * 3 and [s.layers for s in steps] == [1] * 3
    assert (probe.out_dir / "rank0.jsonl").read_text().count('"kind":"steps"') == 1


def _zigzag_step(probe: Probe, monkeypatch: MP, mlp_in: int, mlp_out: int) -> Step:
    """test_hooks' zigzag extend (rank 1 computes positions 3..7 of 10), its first layer's
    attention seeing the padded shard of 6 rows and its MLP `mlp_in` rows in, `mlp_out` out."""
    def layer() -> None:
        hooks.on_attn_input(None, (torch.zeros(6, 8),), None)
        hooks.on_mlp_input(None, (torch.zeros(mlp_in, 8),), torch.zeros(mlp_out, 8))

    return zigzag_step(probe, monkeypatch, layer)


def test_a_pcp_mlp_over_its_shard_sees_the_attention_rows(probe: Probe, monkeypatch: MP) -> None:
    s = _zigzag_step(probe, monkeypatch, mlp_in=6, mlp_out=6)
    assert s.seq_positions == {"q": [(3, 8)]} and s.layers == 1
    # the shard is 5 rows (logical), attention saw 6: the padded count is kept beside it
    assert (s.attn_rows, s.attn_rows_padded) == (5, 6)
    assert s.ffn_seq_positions is None and s.ffn_out_seq_positions is None


def test_a_pcp_mlp_over_the_gathered_batch_names_the_whole_batchs_rows_and_the_cut_back_output(
        probe: Probe, monkeypatch: MP) -> None:
    s = _zigzag_step(probe, monkeypatch, mlp_in=10, mlp_out=5)
    assert (s.ffn_rows, s.ffn_out_rows) == (10, 5)
    assert s.ffn_seq_positions == {"q": [(0, 10)]}
    assert s.ffn_out_seq_positions is None  # cut back to this rank's attention rows


def test_mlp_rows_that_fit_no_layout_are_noted_not_guessed(probe: Probe, monkeypatch: MP) -> None:
    s = _zigzag_step(probe, monkeypatch, mlp_in=7, mlp_out=7)
    assert s.ffn_rows == 7 and s.ffn_seq_positions is None
    notes = [r.message for r in _records(probe) if getattr(r, "kind", "") == "probe_note"]
    assert any("7 rows entering the MLP" in n for n in notes)


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = torch.nn.Module()
        self.self_attn.attn = Rows()
        self.mlp = Rows()

    def forward(self, x: Any) -> Any:
        return self.mlp(self.self_attn.attn(x))


class _Model(torch.nn.Module):
    """SGLang's module names: `model.layers.<i>.self_attn.attn`, `model.layers.<i>.mlp`."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList(_Layer() for _ in range(layers))

    def forward(self, x: Any) -> Any:
        for layer in self.model.layers:
            x = layer(x)
        return x


class _MlaLayer(torch.nn.Module):
    """DeepSeek MLA's names (models/deepseek_v2.py): three attention modules carrying the layer's id,
    of which an extend with a cached prefix calls `attn_mha` once more per prefix chunk."""

    def __init__(self, layer_id: int, prefix_chunks: int) -> None:
        super().__init__()
        self.self_attn = torch.nn.Module()
        for name in ("attn_mqa", "attn_mqa_for_dcp_decode", "attn_mha"):
            setattr(self.self_attn, name, Rows())
            getattr(self.self_attn, name).layer_id = layer_id
        self.mlp = Rows()
        self.prefix_chunks = prefix_chunks

    def forward(self, x: Any) -> Any:
        out = self.self_attn.attn_mha(x)
        for _ in range(self.prefix_chunks):
            self.self_attn.attn_mha(x)
        return self.mlp(out)


class _MlaModel(_Model):
    def __init__(self, layers: int, prefix_chunks: int = 0) -> None:
        torch.nn.Module.__init__(self)
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList(_MlaLayer(i, prefix_chunks) for i in range(layers))


def _graph_setup(probe: Probe, monkeypatch: MP, specs: list[str], model: _Model | None = None) -> _Model:
    """What SGLang's `capture_cuda_graphs` leaves: the `--forward-hooks` on the first layer's
    modules (those of the given specs), then the probe's AFTER hook with the model runner."""
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    model = model or _Model(3)
    first = dict(model.named_modules())
    for name in specs:
        factory, module = forward_hooks.MODULES[name]
        if module in first:  # SGLang registers a spec on the modules its name matches, if any
            first[module].register_forward_hook(getattr(forward_hooks, factory.split(":")[1])())
    runner = types.SimpleNamespace(model=model, is_draft_worker=False, server_args=types.SimpleNamespace(
        forward_hooks=json.loads(forward_hooks.spec(tuple(specs)))))
    hooks.after_capture_cuda_graphs(types.SimpleNamespace(prefill=None, decode=None), model_runner=runner)
    return model


def _hooks(module: Any) -> int:
    """Row hooks on `module`: registered ones (SGLang's `--forward-hooks`) and cptest's wrapper."""
    return len(module._forward_hooks) + (getattr(module, hooks.WRAPPED, None) is not None)


def test_a_wrapped_forward_calls_the_hook_with_its_args_and_output_and_keeps_torchs_fast_path() -> None:
    seen: list[tuple[Any, tuple[Any, ...], Any]] = []
    layer = torch.nn.Linear(8, 3)
    hooks.wrap_forward(layer, lambda m, a, o: seen.append((m, a, o)))
    hooks.wrap_forward(layer, lambda m, a, o: seen.append(("twice",)))  # a second wrap is ignored
    x = torch.zeros(5, 8)
    out = layer(x)
    assert out.shape == (5, 3) and len(seen) == 1
    (m, a, o), = seen
    assert m is layer and a == (x,) and o is out
    assert not layer._forward_hooks  # nothing registered: torch's call takes its fast path


def test_the_graph_setup_hook_gives_every_layer_the_first_layers_forward_hooks(
        probe: Probe, monkeypatch: MP) -> None:
    model = _graph_setup(probe, monkeypatch, ["cptest_attn_rows", "cptest_mlp_rows"])

    def forward(runner: Runner, fb: Batch) -> Output:
        k = torch.zeros(4, 1, 4)
        hooks.after_set_kv_buffer(None, object(), object(), None, k, k)
        model(torch.zeros(4, 8))
        return Output(can_run_graph=False)

    hooks.around_model_runner_forward(forward, Runner(), _extend())
    (s,) = _steps(probe)
    assert (s.layers, s.ffn_rows, s.ffn_out_rows, s.layer_rows) == (3, 4, 4, None)


class _Logits(torch.nn.Module):
    """SGLang's `logits_processor`: called with the input ids, then the hidden states."""

    def forward(self, _ids: Any, hidden: Any) -> Any:
        return hidden


def test_the_hooks_sglang_registered_move_into_forwards_and_another_plugins_hook_stays(
        probe: Probe, monkeypatch: MP) -> None:
    model = _Model(2)
    model.logits_processor = _Logits()
    theirs: list[int] = []
    first = model.model.layers[0]
    first.mlp.register_forward_hook(lambda m, a, o: theirs.append(int(o.shape[0])))
    _graph_setup(probe, monkeypatch, list(forward_hooks.MODULES), model)
    moved = (first.self_attn.attn, first.mlp, model.logits_processor)
    assert [getattr(m, hooks.WRAPPED, None) is not None for m in moved] == [True, True, True]
    # Nothing of the probe's is left registered: torch's fast call path, bar the other plugin's.
    assert [len(m._forward_hooks) for m in moved] == [0, 1, 0]

    def forward(runner: Runner, fb: Batch) -> Output:
        k = torch.zeros(4, 1, 4)
        hooks.after_set_kv_buffer(None, object(), object(), None, k, k)
        model.logits_processor(None, model(torch.zeros(4, 8)))
        return Output(can_run_graph=False)

    hooks.around_model_runner_forward(forward, Runner(), _extend())
    (s,) = _steps(probe)
    assert (s.layers, s.ffn_rows, s.logits_rows, theirs) == (2, 4, 4, [4])


def test_a_module_keeps_a_registered_hook_that_is_not_the_probes() -> None:
    module = Rows()
    module.register_forward_hook(lambda m, a, o: None)
    assert not hooks.unregister_into_forward(module)
    assert len(module._forward_hooks) == 1 and getattr(module, hooks.WRAPPED, None) is None


def test_a_layer_is_not_hooked_for_a_spec_the_server_was_not_given(probe: Probe, monkeypatch: MP) -> None:
    model = _graph_setup(probe, monkeypatch, ["cptest_mlp_rows"])
    attn_hooks = [_hooks(layer.self_attn.attn) for layer in model.model.layers]
    mlp_hooks = [_hooks(layer.mlp) for layer in model.model.layers]
    assert (attn_hooks, mlp_hooks) == ([0, 0, 0], [1, 1, 1])


def test_with_the_first_layer_alone_asked_for_no_other_layer_is_hooked(probe: Probe, monkeypatch: MP) -> None:
    monkeypatch.setenv(runtime.ENV_LAYERS, "first")
    model = _graph_setup(probe, monkeypatch, ["cptest_attn_rows", "cptest_mlp_rows"])
    assert [_hooks(layer.mlp) for layer in model.model.layers] == [1, 0, 0]


def _decode_after_setup(model: _Model) -> Any:
    def forward(runner: Runner, fb: Batch) -> Output:
        k = torch.zeros(2, 1, 4)
        hooks.after_set_kv_buffer(None, object(), object(), None, k, k)
        model(torch.zeros(2, 8))
        return Output(can_run_graph=False)

    return forward


def _decode(step: int) -> SlotBatch:
    return SlotBatch(Mode("DECODE"), torch.arange(2), torch.tensor([5 + step, 9 + step]), ["a", "b"], 2)


def test_decode_steps_hook_every_layer_when_they_open_a_copy_batch_and_the_first_layer_between(
        probe: Probe, monkeypatch: MP) -> None:
    """Sampled per-layer rows (runtime.ENV_LAYER_STEPS): an extend, and the decode step that opens
    each copy batch, see all three layers; the decode steps between see the first alone, whose
    modules run their class's forward."""
    model = _graph_setup(probe, monkeypatch, ["cptest_attn_rows", "cptest_mlp_rows"])
    hooks.around_model_runner_forward(_model([None] * 3), Runner(), _extend(2))
    n = copy_batches.COPY_EVERY + 3
    for k in range(n):
        hooks.around_model_runner_forward(_decode_after_setup(model), Runner(), _decode(k))
        later = [m for layer in model.model.layers[1:] for m in (layer.self_attn.attn, layer.mlp)]
        assert all(("forward" in m.__dict__) is probe.layers_on for m in later)
        assert all(_hooks(m) == 1 for m in (model.model.layers[0].self_attn.attn, model.model.layers[0].mlp))
    steps = _steps(probe)
    assert [s.mode for s in steps] == ["extend"] + ["decode"] * n
    layers = [s.layers for s in steps[1:]]
    # the extend's batch takes the first decode steps; the one after the batch is sent opens the next
    first_open = copy_batches.COPY_EVERY - 1
    assert layers == [1] * first_open + [3] + [1] * (n - first_open - 1)
    assert all(s.ffn_rows == 2 and s.ffn_out_rows == 2 and s.layer_rows is None for s in steps[1:])
    assert [s.seq_positions["b"] for s in steps[1:]] == [[(9 + k, 10 + k)] for k in range(n)]
    # the sampled step stays on its batch's run: one `steps` line a batch, its layers one per step
    text = (probe.out_dir / "rank0.jsonl").read_text()
    assert text.count('"kind":"steps"') == 2
    assert '"layers":1}' in text and '"layers":[3,1,1,1]}' in text


def test_with_every_layer_asked_for_each_decode_step_hooks_them_all(tmp_path: Path, monkeypatch: MP) -> None:
    monkeypatch.setenv(runtime.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(runtime.ENV_LAYER_STEPS, "all")
    monkeypatch.setattr(runtime, "_PROBE", None)
    probe = runtime.get_probe()
    assert probe is not None and not probe.layers_sampled
    try:
        model = _graph_setup(probe, monkeypatch, ["cptest_attn_rows", "cptest_mlp_rows"])
        for k in range(copy_batches.COPY_EVERY + 2):
            hooks.around_model_runner_forward(_decode_after_setup(model), Runner(), _decode(k))
        assert {s.layers for s in _steps(probe)} == {3}
    finally:
        runtime.set_probe(None)
        probe.close()


@dataclass
class ReadBatch(SlotBatch):
    req_pool_indices: Any = None
    seq_lens_cpu: Any = None


@dataclass
class TablePool:
    req_to_token: Any


@dataclass
class TableRunner(Runner):
    """A model runner with SGLang's block table (`req_to_token_pool.req_to_token`)."""

    req_to_token_pool: Any = None


def _dcp_decode(owner_rank: int) -> Any:
    """One layer's pool write under DCP2, the owner mask as the triton backend makes it."""

    def forward(runner: Runner, fb: Batch, *_a: Any, **_k: Any) -> Output:
        k = torch.zeros(int(fb.input_ids.shape[0]), 1, 4)
        hooks.after_set_kv_buffer(None, object(), object(), None, k, k,
                                  dcp_kv_mask=fb.positions % 2 == owner_rank)
        return Output(can_run_graph=False)

    return forward


def test_dcp_decode_steps_record_the_pool_rows_they_wrote_in_their_runs_line(
        probe: Probe, monkeypatch: MP) -> None:
    """Under DCP a decode step carries its owner mask anyway: its slots join it as a column of the
    run's one line, so that every position's row is known where the write was seen."""
    _fake_parallel_state(monkeypatch, 1)  # dcp 2, this rank 1: odd positions
    hooks.after_initialize_model_parallel(None)
    probe.read_every = 0
    for k in range(3):
        fb = SlotBatch(Mode("DECODE"), torch.arange(2), torch.tensor([10 + k, 5 + k]), ["a", "b"], 2,
                       out_cache_loc=torch.tensor([200 + 2 * k, 301 + 2 * k]))
        hooks.around_model_runner_forward(_dcp_decode(1), Runner(), fb)
    steps = _steps(probe)
    written = [{rid: rs for rid, rs in s.kv_written.items() if rs} for s in steps]
    assert written == [{"b": [(5, 6)]}, {"a": [(11, 12)]}, {"b": [(7, 8)]}]
    # loc // 2: b's 301 -> 150 at step 0, a's 202 -> 101 at step 1, b's 305 -> 152 at step 2
    assert [s.kv_slots for s in steps] == [{"b": [(5, 6, 150)]}, {"a": [(11, 12, 101)]}, {"b": [(7, 8, 152)]}]
    text = (probe.out_dir / "rank1.jsonl").read_text()
    assert text.count('"kind":"steps"') == 1 and '"slots":' in text


def test_a_sampled_decode_step_records_the_rows_its_attention_reads_from_the_block_table(
        probe: Probe, monkeypatch: MP) -> None:
    """kv_read: the rank's share of each request's block-table row over its length, pool row loc // dcp."""
    _fake_parallel_state(monkeypatch, 1)
    hooks.after_initialize_model_parallel(None)
    probe.read_every = 2  # steps 2, 4, ... record their reads
    probe.read_share = 1.0  # never over: the reads' time is part of the time the probe ran
    table = torch.zeros(4, 16, dtype=torch.int32)
    table[3, :7] = torch.tensor([40, 41, 42, 43, 44, 45, 46], dtype=torch.int32)  # request a
    table[1, :4] = torch.tensor([90, 91, 92, 95], dtype=torch.int32)  # request b
    runner = TableRunner(req_to_token_pool=TablePool(table))
    for k in range(2):
        fb = ReadBatch(Mode("DECODE"), torch.arange(2), torch.tensor([5 + k, 2 + k]), ["a", "b"], 2,
                       out_cache_loc=torch.tensor([45 + k, 92 + 3 * k]),
                       req_pool_indices=torch.tensor([3, 1]), seq_lens_cpu=torch.tensor([6 + k, 3 + k]))
        hooks.around_model_runner_forward(_dcp_decode(1), runner, fb)
    first, second = _steps(probe)
    assert first.step % 2 == 1 and first.kv_read == {}  # not sampled
    # step 2: a has length 7: odd positions 1, 3, 5 -> rows 41 // 2, 43 // 2, 45 // 2 = 20, 21, 22;
    # b has length 4: positions 1, 3 -> 91 // 2, 95 // 2 = 45, 47
    assert second.kv_read == {"a": [(20, 23)], "b": [(45, 46), (47, 48)]}
    # it wrote b's position 3 (odd) into row (92 + 3) // 2 = 47, which it reads in the same step
    assert {r: w for r, w in second.kv_written.items() if w} == {"b": [(3, 4)]}
    assert second.kv_slots == {"b": [(3, 4, 47)]}


def test_a_step_whose_block_table_is_too_large_notes_it_and_reads_nothing(
        probe: Probe, monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    probe.read_every = 1
    probe.read_share = 1.0
    monkeypatch.setattr(runtime, "READ_CELLS_MAX", 4)
    runner = TableRunner(req_to_token_pool=TablePool(torch.zeros(2, 16, dtype=torch.int32)))
    fb = ReadBatch(Mode("DECODE"), torch.arange(1), torch.tensor([8]), ["a"], 1,
                   out_cache_loc=torch.tensor([3]), req_pool_indices=torch.tensor([0]),
                   seq_lens_cpu=torch.tensor([9]))
    hooks.around_model_runner_forward(_dcp_decode(0), runner, fb)
    (s,) = _steps(probe)
    assert s.kv_read == {}
    notes = [json.loads(line) for line in (probe.out_dir / "rank0.jsonl").read_text().splitlines()
             if '"kind":"probe_note"' in line]
    assert any("request a's 9 block-table values exceed 4; kv_read left empty" in n["message"] for n in notes)


def test_sampled_steps_read_as_many_consecutive_requests_as_fit_moving_on_each_time(
        probe: Probe, monkeypatch: MP) -> None:
    """The rows a step reads are capped (the writer thread makes their ranges): it takes
    consecutive requests from one that moves on with every sampled step."""
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    probe.dcp_size = 1
    probe.read_every = 1
    probe.read_share = 1.0
    monkeypatch.setattr(runtime, "READ_CELLS_MAX", 8)  # two requests of 4
    table = torch.arange(4 * 8, dtype=torch.int32).reshape(4, 8)
    runner = TableRunner(req_to_token_pool=TablePool(table))
    read = []
    for k in range(4):
        fb = ReadBatch(Mode("DECODE"), torch.arange(3), torch.tensor([3 + k] * 3), ["a", "b", "c"], 3,
                       out_cache_loc=torch.tensor([0, 1, 2]), req_pool_indices=torch.tensor([0, 1, 2]),
                       seq_lens_cpu=torch.tensor([4, 4, 4]))
        hooks.around_model_runner_forward(_model([None]), runner, fb)
    read = [s.kv_read for s in _steps(probe)]
    # steps 1..4 start at request step % 3: b+c, c (+ b before it: the end has room), a+b, b+c
    assert [sorted(r) for r in read] == [["b", "c"], ["b", "c"], ["a", "b"], ["b", "c"]]
    assert read[2] == {"a": [(0, 4)], "b": [(8, 12)]}  # each request's row of the table, its length


def _reading_every_step(probe: Probe, monkeypatch: MP) -> Any:
    """Rank 0 of a world without DCP whose every decode step samples its reads; returns a step of
    one request, 4 tokens long, whose block-table row is 0..3."""
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    probe.dcp_size, probe.read_every = 1, 1
    runner = TableRunner(req_to_token_pool=TablePool(torch.arange(16, dtype=torch.int32).reshape(2, 8)))

    def step() -> None:
        fb = ReadBatch(Mode("DECODE"), torch.arange(1), torch.tensor([3]), ["a"], 1,
                       out_cache_loc=torch.tensor([3]), req_pool_indices=torch.tensor([0]),
                       seq_lens_cpu=torch.tensor([4]))
        hooks.around_model_runner_forward(_model([None]), runner, fb)

    return step


def test_sampled_steps_skip_their_reads_while_finishing_reads_is_over_its_share(
        tmp_path: Path, monkeypatch: MP) -> None:
    """Reads of long, scattered rows take milliseconds per sampled step to finish: the probe
    skips samples while they took more than `read_share` of the time that passed (a quiet spell
    saving up no more than READ_CREDIT_MAX_NS), says so once, and counts the skips when it closes."""
    now = [100.0]
    probe = Probe(tmp_path, clock=lambda: now[0], graph_flush_s=0.0)
    runtime.set_probe(probe)
    try:
        step = _reading_every_step(probe, monkeypatch)
        probe.read_credit_ns = -30_000_000  # reads that took 30 ms
        now[0] = 110.0  # 10 s later: 25 ms of credit at 0.25 %
        step()  # still 5 ms over: skipped
        step()  # the same: skipped, not noted again
        now[0] = 1110.0  # a long quiet spell saves up READ_CREDIT_MAX_NS, no more
        step()
        assert 0 <= probe.read_credit_ns <= runtime.READ_CREDIT_MAX_NS
        probe.close()
    finally:
        runtime.set_probe(None)
    reads = [s.kv_read for s in _steps(probe)]
    assert reads == [{}, {}, {"a": [(0, 4)]}]
    assert probe.reads_skipped == 2 and probe.read_ns > 0  # the third step's finishing counted
    messages = [r.message for r in _records(probe) if isinstance(r, ProbeNote)]
    assert sum("reads sampled less often" in m for m in messages) == 1
    assert any(m.startswith("2 sampled step(s) recorded no reads") for m in messages)


def test_a_paused_spell_saves_up_no_read_credit(tmp_path: Path, monkeypatch: MP) -> None:
    """The reads' share is of the probe's running time: a measuring probe paused by its switch
    saves up no credit meanwhile, so its next running window does not spend a pause's worth of
    reads on top of its own (an evidence run is never paused)."""
    now = [100.0]
    switch = tmp_path / "switch"
    switch.write_text("on", encoding="utf-8")
    probe = Probe(tmp_path, clock=lambda: now[0], graph_flush_s=0.0, switch=switch)
    runtime.set_probe(probe)
    try:
        step = _reading_every_step(probe, monkeypatch)
        probe.poll_switch()
        probe.read_credit_ns = -5_000_000  # reads that took 5 ms
        now[0] = 101.0  # 1 s running: 2.5 ms of credit at 0.25 %
        switch.write_text("off", encoding="utf-8")
        probe.poll_switch()
        assert probe.paused
        now[0] = 111.0  # 10 s paused: nothing saved up
        switch.write_text("on", encoding="utf-8")
        probe.poll_switch()
        assert not probe.paused
        now[0] = 111.5  # 0.5 s running since: still 1.25 ms over
        step()
        now[0] = 112.5  # 1 s more: 1.25 ms to spend
        step()
        probe.close()
    finally:
        runtime.set_probe(None)
    assert [s.kv_read for s in _steps(probe)] == [{}, {"a": [(0, 4)]}]
    assert probe.reads_skipped == 1


def test_sampled_steps_stop_recording_reads_once_their_lines_reach_the_files_share(
        tmp_path: Path, monkeypatch: MP) -> None:
    """A rank file must stay within what cptest reads of an evidence file: once the lines of the
    steps that recorded their reads hold READ_BYTES_MAX, no sampled step records them, whatever
    the time credit; said once, with the bytes, and counted at close."""
    monkeypatch.setattr(runtime, "READ_BYTES_MAX", 1)  # the first read line fills it
    probe = Probe(tmp_path, graph_flush_s=0.0)
    runtime.set_probe(probe)
    try:
        step = _reading_every_step(probe, monkeypatch)
        for _ in range(3):
            step()
            assert probe.flush(timeout=10.0)  # the step's line made: its bytes counted
        probe.close()
    finally:
        runtime.set_probe(None)
    assert [s.kv_read for s in _steps(probe)] == [{"a": [(0, 4)]}, {}, {}]
    assert probe.reads_skipped == 2 and probe.read_bytes > 100
    messages = [r.message for r in _records(probe) if isinstance(r, ProbeNote)]
    assert sum("reads no longer recorded" in m for m in messages) == 1
    assert not any("reads sampled less often" in m for m in messages)  # the credit was not what stopped them
    assert any(m.startswith("2 sampled step(s) recorded no reads") and f"{probe.read_bytes:,} bytes" in m
               for m in messages)


def _mla_forward(pool_method: str) -> Any:
    """One layer's latent K/V write through the MLA pool's `pool_method`, which takes no owner mask:
    the pool (or its kernel) keeps the rows with loc % dcp == dcp_rank."""

    def forward(runner: Runner, fb: Batch, *_a: Any, **_k: Any) -> Output:
        n = int(fb.input_ids.shape[0])
        latent = torch.zeros(n, 1, 8)
        if pool_method == "set_mla_kv_buffer":
            hooks.after_set_mla_kv_buffer(None, object(), object(), fb.out_cache_loc, latent, latent[..., :2])
        else:
            hooks.after_mla_set_kv_buffer(None, object(), object(), fb.out_cache_loc, latent, latent)
        return Output(can_run_graph=False)

    return forward


def test_an_mla_write_under_dcp_records_the_rows_the_pool_keeps_and_their_slots(
        probe: Probe, monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 1)  # dcp 2, this rank 1
    hooks.after_initialize_model_parallel(None)
    # positions 0..3 at allocator slots 10..13: this rank keeps the odd slots, at slot // 2
    fb = SlotBatch(Mode("EXTEND"), torch.arange(4), torch.arange(4), ["a"], 1, [4], [0],
                   out_cache_loc=torch.tensor([10, 11, 12, 13]))
    hooks.around_model_runner_forward(_mla_forward("set_mla_kv_buffer"), Runner(), fb)
    (s,) = _steps(probe)
    assert s.kv_written == {"a": [(1, 2), (3, 4)]}
    assert slot_pairs(s.kv_slots["a"], s.kv_written["a"]) == [(1, 5), (3, 6)]


def test_mla_set_kv_buffer_under_dcp_records_the_owners_not_slots_and_says_why(
        probe: Probe, monkeypatch: MP) -> None:
    """That path keeps its rows at the allocator's slot itself: recording slot // dcp would be false."""
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    for _ in range(2):
        fb = SlotBatch(Mode("EXTEND"), torch.arange(4), torch.arange(4), ["a"], 1, [4], [0],
                       out_cache_loc=torch.tensor([10, 11, 12, 13]))
        hooks.around_model_runner_forward(_mla_forward("set_kv_buffer"), Runner(), fb)
    first, second = _steps(probe)
    assert first.kv_written == {"a": [(0, 1), (2, 3)]} and first.kv_slots == {} == second.kv_slots
    notes = [r.message for r in _records(probe) if getattr(r, "kind", "") == "probe_note"]
    assert sum("not loc // dcp" in n for n in notes) == 1  # said once


def test_an_mla_write_without_dcp_is_every_row(probe: Probe, monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    probe.dcp_size = 1
    fb = SlotBatch(Mode("EXTEND"), torch.arange(3), torch.arange(3), ["a"], 1, [3], [0],
                   out_cache_loc=torch.tensor([7, 8, 9]))
    hooks.around_model_runner_forward(_mla_forward("set_mla_kv_buffer"), Runner(), fb)
    (s,) = _steps(probe)
    assert s.kv_written == {"a": [(0, 3)]} and s.kv_slots == {"a": [(0, 3, 7)]}


@pytest.mark.parametrize("prefix_chunks", [0, 2])
def test_mla_attention_is_hooked_on_every_layer_and_counted_once_per_layer(
        probe: Probe, monkeypatch: MP, prefix_chunks: int) -> None:
    """The argv names `self_attn.attn`, which MLA has not: its attention modules are hooked here, on
    every layer, and a layer calling attention again (a prefix chunk) is still one layer."""
    specs = ["cptest_attn_rows", "cptest_mlp_rows"]
    model = _graph_setup(probe, monkeypatch, specs, _MlaModel(3, prefix_chunks))
    hooked = {name for name, m in model.named_modules() if _hooks(m)}
    assert {f"model.layers.{i}.self_attn.{a}" for i in range(3)
            for a in ("attn_mqa", "attn_mqa_for_dcp_decode", "attn_mha")} <= hooked

    def forward(runner: Runner, fb: Batch) -> Output:
        model(torch.zeros(4, 8))
        return Output(can_run_graph=False)

    hooks.around_model_runner_forward(forward, Runner(), _extend())
    (s,) = _steps(probe)
    assert (s.layers, s.attn_rows, s.ffn_rows, s.layer_rows) == (3, 4, 4, None)


def test_with_the_first_layer_alone_asked_for_mlas_first_attention_is_still_hooked(
        probe: Probe, monkeypatch: MP) -> None:
    monkeypatch.setenv(runtime.ENV_LAYERS, "first")
    model = _graph_setup(probe, monkeypatch, ["cptest_attn_rows", "cptest_mlp_rows"], _MlaModel(3))
    assert [_hooks(layer.self_attn.attn_mha) for layer in model.model.layers] == [1, 0, 0]
    assert [_hooks(layer.mlp) for layer in model.model.layers] == [1, 0, 0]
