"""cptest/probe/hooks.py against fake SGLang objects holding small CPU tensors."""

from __future__ import annotations

import json
import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest

torch = pytest.importorskip("torch")

from cptest.evidence import Capacity, Geometry, Graph, KvPool, ProbeNote, RankId, Step, read_records  # noqa: E402
from cptest.probe import copy_batches, hooks, runtime  # noqa: E402
from cptest.probe import steps as probe_steps  # noqa: E402
from cptest.probe.runtime import Probe  # noqa: E402

MP = pytest.MonkeyPatch


def _records(p: Probe) -> list[Any]:
    assert p.rank is not None
    assert p.flush(timeout=10.0)
    return read_records(p.out_dir / f"rank{p.rank.world}.jsonl")[0]


@dataclass
class Group:
    ranks: list[int]
    rank: int
    local_rank: int = 0

    @property
    def rank_in_group(self) -> int:
        return self.ranks.index(self.rank)

    @property
    def world_size(self) -> int:
        return len(self.ranks)


def _fake_parallel_state(monkeypatch: MP, rank: int) -> None:
    ps = types.ModuleType("sglang.srt.distributed.parallel_state")
    ps._WORLD = Group([0, 1], rank, local_rank=rank)  # type: ignore[attr-defined]
    ps._TP = Group([0, 1], rank)  # type: ignore[attr-defined]
    ps._DCP = Group([0, 1], rank)  # type: ignore[attr-defined]
    ps._ATTN_CP = Group([rank], rank)  # type: ignore[attr-defined]
    ps._ATTN_TP = Group([0, 1], rank)  # type: ignore[attr-defined]
    ps._PP = Group([rank], rank)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sglang.srt.distributed.parallel_state", ps)


def test_geometry_hook_binds_the_rank_file_and_returns_none(probe: Probe, monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 1)
    assert hooks.after_initialize_model_parallel(None, tensor_model_parallel_size=2) is None
    (geo,) = _records(probe)
    assert isinstance(geo, Geometry) and geo.rank.dcp == 1 and geo.gpu == 1 and geo.groups["tp"] == [0, 1]


@dataclass
class Mode:
    name: str


@dataclass
class Batch:
    forward_mode: Mode
    input_ids: Any
    positions: Any
    rids: list[str]
    batch_size: int
    extend_seq_lens_cpu: list[int] | None = None
    extend_prefix_lens_cpu: list[int] | None = None
    attn_cp_metadata: Any = None
    num_token_non_padded_cpu: int | None = None
    """SGLang's count of the input ids as it makes the batch (`len(batch.input_ids)`): theirs unless given."""

    def __post_init__(self) -> None:
        if self.num_token_non_padded_cpu is None and self.input_ids is not None:
            self.num_token_non_padded_cpu = int(self.input_ids.shape[0])


@dataclass
class Output:
    can_run_graph: bool
    logits: Any = None


@dataclass
class Runner:
    is_draft_worker: bool = False
    calls: list[Any] = field(default_factory=list)


class Layer(torch.nn.Module):
    def forward(self, x: Any) -> Any:
        return x * 2


def _dcp_forward(dcp_rank: int, mlp: Layer) -> Any:
    """Stands in for ModelRunner.forward: SGLang's pool write and first MLP, as the hooks see them."""

    def forward(runner: Runner, fb: Batch, *a: Any, **k: Any) -> Output:
        runner.calls.append(fb)
        mask = fb.positions % 2 == dcp_rank  # triton_backend.py:1236
        k_rows = torch.zeros(fb.positions.shape[0], 1, 4)
        loc = fb.positions // 2
        hooks.after_set_kv_buffer(None, object(), object(), loc, k_rows, k_rows, dcp_kv_mask=mask)
        hooks.after_set_kv_buffer(None, object(), object(), loc, k_rows, k_rows)  # layer 1: ignored
        out = mlp(torch.ones(fb.input_ids.shape[0], 8))
        return Output(can_run_graph=False, logits=out)

    return forward


def _bound_with_mlp(monkeypatch: MP, rank: int) -> Layer:
    """The probe bound to world rank `rank` of TP 2, and an MLP whose input its hook sees."""
    _fake_parallel_state(monkeypatch, rank)
    hooks.after_initialize_model_parallel(None)
    mlp = Layer()
    mlp.register_forward_hook(hooks.on_mlp_input)
    return mlp


def test_an_eager_dcp_step_records_rows_and_owned_kv_positions(probe: Probe, monkeypatch: MP) -> None:
    mlp = _bound_with_mlp(monkeypatch, 1)
    fb = Batch(Mode("EXTEND"), torch.arange(7), torch.tensor([0, 1, 2, 3, 4, 0, 1]), ["r0", "r1"], 2,
               [5, 2], [0, 0])
    before = fb.positions.clone()
    result = hooks.around_model_runner_forward(_dcp_forward(1, mlp), Runner(), fb)
    assert isinstance(result, Output) and torch.equal(result.logits, torch.full((7, 8), 2.0))
    assert torch.equal(fb.positions, before)
    steps = [r for r in _records(probe) if isinstance(r, Step)]
    (s,) = steps
    assert (s.mode, s.batch_size, s.rows_in, s.ffn_rows) == ("extend", 2, 7, 7)
    assert s.kv_written == {"r0": [(1, 2), (3, 4)], "r1": [(1, 2)]}
    assert s.seq_positions == {"r0": [(0, 5)], "r1": [(0, 2)]}
    assert s.extend_lens == [5, 2] and s.rank.dcp == 1


def _dp_sizing_forward(mlp: Layer) -> Any:
    """Stands in for ModelRunner.forward under attention DP 2: it sizes the DP buffer as
    `prepare_mlp_sync_batch` does (this DP rank's 7 tokens and the other's 3, sum_len, aligned to
    4), then runs the MLP over the whole buffer."""

    def forward(runner: Runner, fb: Batch, *a: Any, **k: Any) -> Output:
        fb.original_global_num_tokens_cpu = [fb.input_ids.shape[0], 3]  # type: ignore[attr-defined]
        fb.global_num_tokens_cpu = [8, 4]  # type: ignore[attr-defined]
        fb.global_dp_buffer_len = 12  # type: ignore[attr-defined]
        fb.dp_padding_mode = types.SimpleNamespace(name="SUM_LEN")  # type: ignore[attr-defined]
        return Output(can_run_graph=False, logits=mlp(torch.ones(12, 8)))

    return forward


def test_an_extend_under_attention_dp_records_the_buffer_sglang_sized(probe: Probe, monkeypatch: MP) -> None:
    mlp = _bound_with_mlp(monkeypatch, 0)
    extend = Batch(Mode("EXTEND"), torch.arange(7), torch.arange(7), ["r0"], 1, [7], [0])
    decode = Batch(Mode("DECODE"), torch.arange(7), torch.arange(7, 14), [f"d{i}" for i in range(7)], 7)
    plain = Batch(Mode("EXTEND"), torch.arange(7), torch.arange(7), ["r1"], 1, [7], [0])
    hooks.around_model_runner_forward(_dp_sizing_forward(mlp), Runner(), extend)
    hooks.around_model_runner_forward(_dp_sizing_forward(mlp), Runner(), decode)
    hooks.around_model_runner_forward(lambda runner, fb: Output(can_run_graph=False), Runner(), plain)
    first, second, third = [r for r in _records(probe) if isinstance(r, Step)]
    assert first.dp_buffer is not None and first.ffn_rows == 12
    assert first.dp_buffer.model_dump() == {"tokens": [7, 3], "padded": [8, 4], "rows": 12, "mode": "sum_len"}
    # a decode step's attention and MLP rows hold the DP padding too: only the buffer tells it apart
    assert second.mode == "decode" and second.dp_buffer == first.dp_buffer
    assert third.dp_buffer is None and "dp_buffer" not in third.model_dump_json()


def _dp_padded_dcp_forward(dcp_rank: int, mlp: Layer) -> Any:
    """Stands in for ModelRunner.forward under attention DP 2 and DCP 2: `prepare_mlp_sync_batch`
    pads this DP rank's 7 rows to 8 with a dummy row after the real ones (positions and
    out_cache_loc alike), the pool write and the first MLP run over the padded rows and the
    buffer, and `post_forward_mlp_sync_batch` cuts the positions back to the real rows."""

    def forward(runner: Runner, fb: Batch, *a: Any, **k: Any) -> Output:
        fb.original_global_num_tokens_cpu = [7, 3]  # type: ignore[attr-defined]
        fb.global_num_tokens_cpu = [8, 4]  # type: ignore[attr-defined]
        fb.global_dp_buffer_len = 12  # type: ignore[attr-defined]
        fb.dp_padding_mode = types.SimpleNamespace(name="SUM_LEN")  # type: ignore[attr-defined]
        real = fb.positions
        fb.positions = torch.cat([real, torch.zeros(1, dtype=real.dtype)])
        mask = fb.positions % 2 == dcp_rank
        loc = torch.cat([torch.arange(100, 107), torch.zeros(1, dtype=torch.long)])
        k_rows = torch.zeros(8, 1, 4)
        hooks.after_set_kv_buffer(None, object(), object(), loc, k_rows, k_rows, dcp_kv_mask=mask)
        out = mlp(torch.ones(12, 8))
        fb.positions = real
        return Output(can_run_graph=False, logits=out)

    return forward


def test_a_kv_write_over_the_dp_padded_slice_is_recorded_for_the_real_rows(probe: Probe,
                                                                          monkeypatch: MP) -> None:
    mlp = _bound_with_mlp(monkeypatch, 1)
    fb = Batch(Mode("EXTEND"), torch.arange(7), torch.tensor([0, 1, 2, 3, 4, 0, 1]), ["r0", "r1"], 2,
               [5, 2], [0, 0])
    hooks.around_model_runner_forward(_dp_padded_dcp_forward(1, mlp), Runner(), fb)
    (s,) = [r for r in _records(probe) if isinstance(r, Step)]
    assert s.rows_in == 7 and s.ffn_rows == 12 and s.dp_buffer is not None
    # the dummy row (position 0, slot 0) is neither a write of r1 nor of r0
    assert s.kv_written == {"r0": [(1, 2), (3, 4)], "r1": [(1, 2)]}
    assert s.seq_positions == {"r0": [(0, 5)], "r1": [(0, 2)]}


def test_sglangs_thread_does_not_wait_for_a_steps_device_copies(probe: Probe, monkeypatch: MP) -> None:
    """A step's record is finished at a later step once its copies are done, never waited for."""
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    copy_done = threading.Event()

    class InFlight(copy_batches.CopyBatch):  # the device has not finished the copies until copy_done
        def poll(self) -> bool:
            return copy_done.is_set() and super().poll()

    monkeypatch.setattr(copy_batches, "CopyBatch", InFlight)
    fb = Batch(Mode("DECODE"), torch.arange(2), torch.tensor([9, 4]), ["a", "b"], 2)
    hooks.around_model_runner_forward(lambda r, b: Output(can_run_graph=False), Runner(), fb)
    fb.positions[0] = 99  # the engine reuses its buffer: the record keeps what the step used
    probe.note("after the step")
    hooks.around_model_runner_forward(lambda r, b: Output(can_run_graph=False), Runner(), fb)
    assert not probe.flush(timeout=0.2)  # nothing waits for the copies, not even a flush past its timeout
    assert not [r for r in read_records(probe.out_dir / "rank0.jsonl")[0] if isinstance(r, Step)]
    copy_done.set()
    recs = _records(probe)
    kinds = [type(r).__name__ for r in recs]
    assert kinds.index("Step") < kinds.index("ProbeNote")  # written in the order they were made
    first, second = [r for r in recs if isinstance(r, Step)]
    assert first.seq_positions == {"a": [(9, 10)], "b": [(4, 5)]}
    assert second.seq_positions == {"a": [(99, 100)], "b": [(4, 5)]}


def test_in_a_steady_decode_the_engines_thread_alone_sends_polls_and_finishes_the_copies(
        probe: Probe, monkeypatch: MP) -> None:
    """A probe thread that takes the GIL while SGLang's eager loop runs makes the engine wait for it
    at its next torch call (D114): the copies are sent, polled and finished on the engine's thread,
    a batch sent when full, finished at a later step's start."""
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    engine = threading.get_ident()
    calls: list[tuple[str, int]] = []

    class Watched(copy_batches.CopyBatch):
        def send(self, on_engine_thread: bool = False) -> None:
            calls.append(("send", threading.get_ident()))
            super().send(on_engine_thread)

        def poll(self) -> bool:
            calls.append(("poll", threading.get_ident()))
            return super().poll()

        def run(self) -> None:
            calls.append(("run", threading.get_ident()))
            super().run()

    monkeypatch.setattr(copy_batches, "CopyBatch", Watched)
    steps = 3 * copy_batches.COPY_EVERY + 5
    for i in range(steps):
        fb = Batch(Mode("DECODE"), torch.arange(2), torch.tensor([9 + i, 4 + i]), ["a", "b"], 2)
        hooks.around_model_runner_forward(lambda r, b: Output(can_run_graph=False), Runner(), fb)
    assert [c for c, _ in calls if c != "poll"] == ["send", "run"] * 3  # each full batch: sent, then finished
    assert {t for _, t in calls} == {engine}
    recs = [r for r in _records(probe) if isinstance(r, Step)]  # the flush finishes the last batch
    assert [r.seq_positions["a"] for r in recs] == [[(9 + i, 10 + i)] for i in range(steps)]


@dataclass
class GraphRunner:
    """What `DecodeCudaGraphRunner.load_batch` leaves behind: the padded size of the graph it chose
    (decode_cuda_graph_runner.py:1116, 1172) and the tokens per request it was captured with."""

    bs: int
    captured_req_width: int = 1


@dataclass
class GraphedRunner(Runner):
    decode_cuda_graph_runner: GraphRunner | None = None


def test_a_replayed_decode_step_is_recorded_with_its_graphs_rows(probe: Probe, monkeypatch: MP) -> None:
    """Under CUDA-graph replay no inner hook fires; the step's requests, positions and the graph's
    padded size are still recorded (D58), and its KV write is marked unobserved, not missing."""
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    runner = GraphedRunner(decode_cuda_graph_runner=GraphRunner(bs=4))
    for i in range(3):
        fb = Batch(Mode("DECODE"), torch.arange(3), torch.tensor([9 + i, 4 + i, 30 + i]), ["a", "b", "c"], 3)
        hooks.around_model_runner_forward(lambda r, b: Output(can_run_graph=True), runner, fb)
    recs = _records(probe)
    steps = [r for r in recs if isinstance(r, Step)]
    assert [s.seq_positions for s in steps] == [
        {"a": [(9 + i, 10 + i)], "b": [(4 + i, 5 + i)], "c": [(30 + i, 31 + i)]} for i in range(3)]
    assert all(s.graph_rows == 4 and s.replayed and s.rows_in == 3 and s.kv_written == {}
               and s.attn_rows is None and s.ffn_rows is None for s in steps)
    assert not [r for r in recs if isinstance(r, ProbeNote)]  # an unobserved write is not a missing one
    replays = [r for r in recs if isinstance(r, Graph) and (r.event, r.phase) == ("replay", "decode")]
    assert sum(r.count for r in replays) == 3


def test_replayed_steps_that_join_their_run_keep_m_ropes_text_row_and_change_of_graph_size(
        probe: Probe, monkeypatch: MP) -> None:
    """A step that goes on the run being filled skips the general path's look at its positions'
    shape (`copy_batches.join_run`, D73): the run remembers from its first step that positions are
    M-RoPE's [3, n], and every later step of it keeps the first (text) row too. A step whose graph
    size differs from the run's starts a new run, which looks again. (A model's positions keep
    their shape from step to step: 1-D, or [3, n] with M-RoPE.)"""
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    runner = GraphedRunner(decode_cuda_graph_runner=GraphRunner(bs=4))
    text = [[9 + i, 4 + i] for i in range(6)]
    for i in range(6):
        runner.decode_cuda_graph_runner.bs = 4 if i < 4 else 8  # type: ignore[union-attr]
        mrope = torch.tensor([text[i], [100, 100], [200, 200]])  # rows: text, height, width
        fb = Batch(Mode("DECODE"), torch.arange(2), mrope, ["a", "b"], 2)
        hooks.around_model_runner_forward(lambda r, b: Output(can_run_graph=True), runner, fb)
    steps = [r for r in _records(probe) if isinstance(r, Step)]
    assert [s.seq_positions for s in steps] == [{"a": [(a, a + 1)], "b": [(b, b + 1)]} for a, b in text]
    assert [s.graph_rows for s in steps] == [4, 4, 4, 4, 8, 8]
    assert (probe.out_dir / "rank0.jsonl").read_text().count('"kind":"steps"') == 2


def test_replays_and_eager_steps_never_share_a_block(probe: Probe, monkeypatch: MP) -> None:
    """A `steps` line carries one graph_rows for all its steps: a switch between eager and replay
    (or another padded size) over the same requests starts a new line, and every step reads back
    as what it was."""
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    runner = GraphedRunner(decode_cuda_graph_runner=GraphRunner(bs=8))
    kinds = [True] * 5 + [False] * 4 + [True] * 3
    for i, replay in enumerate(kinds):
        runner.decode_cuda_graph_runner = GraphRunner(bs=8 if i < 9 else 16)
        fb = Batch(Mode("DECODE"), torch.arange(2), torch.tensor([9 + i, 4 + i]), ["a", "b"], 2)
        hooks.around_model_runner_forward(lambda r, b, rp=replay: Output(can_run_graph=rp), runner, fb)
    steps = [r for r in _records(probe) if isinstance(r, Step)]
    assert [s.graph_rows for s in steps] == [8] * 5 + [None] * 4 + [16] * 3
    assert [s.seq_positions["a"] for s in steps] == [[(9 + i, 10 + i)] for i in range(len(kinds))]
    lines = (probe.out_dir / "rank0.jsonl").read_text().splitlines()
    assert sum('"kind":"steps"' in line for line in lines) == 3


def test_a_replay_whose_padded_size_cannot_be_read_is_counted_and_said(probe: Probe, monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    fb = Batch(Mode("DECODE"), torch.arange(2), torch.tensor([9, 4]), ["a", "b"], 2)
    for _ in range(3):
        hooks.around_model_runner_forward(lambda r, b: Output(can_run_graph=True), Runner(), fb)
    recs = _records(probe)
    assert not [r for r in recs if isinstance(r, Step)]
    notes = [r.message for r in recs if isinstance(r, ProbeNote)]
    assert len(notes) == 1 and "padded size" in notes[0]
    replays = [r for r in recs if isinstance(r, Graph) and (r.event, r.phase) == ("replay", "decode")]
    assert sum(r.count for r in replays) == 3


def test_an_exception_inside_the_probe_never_reaches_the_engine(probe: Probe, monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    sentinel = Output(can_run_graph=False)
    broken_batch = object()  # no forward_mode, no positions: every probe read fails
    assert hooks.around_model_runner_forward(lambda r, b: sentinel, Runner(), broken_batch) is sentinel
    notes = [r for r in _records(probe) if isinstance(r, ProbeNote)]
    assert notes and notes[0].level == "error" and notes[0].message.startswith("step_begin")


def test_an_engine_exception_passes_through_unchanged_and_is_noted(probe: Probe,
                                                                   monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    fb = Batch(Mode("DECODE"), torch.arange(1), torch.tensor([3]), ["a"], 1)

    def forward(r: Runner, b: Batch) -> Output:
        raise RuntimeError("CUDA error: out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        hooks.around_model_runner_forward(forward, Runner(), fb)
    notes = [r for r in _records(probe) if isinstance(r, ProbeNote)]
    assert "SGLang forward raised RuntimeError" in notes[-1].message


def test_a_draft_worker_forward_is_not_observed(probe: Probe, monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    fb = Batch(Mode("DECODE"), torch.arange(1), torch.tensor([3]), ["a"], 1)
    hooks.around_model_runner_forward(lambda r, b: Output(False), Runner(is_draft_worker=True), fb)
    assert [type(r) for r in _records(probe)] == [Geometry]


@dataclass
class Meta:
    split_list: list[int]
    zigzag_index: list[int]
    per_rank_actual_token: list[int]
    per_rank_logical_token: list[int]


class Zigzag:
    cp_rank = 1


def zigzag_step(probe: Probe, monkeypatch: MP, inner: Callable[[], None] | None = None) -> Step:
    """The Step of one PCP zigzag extend on rank 1 of cp 2: one request of 10 tokens, blocks
    [3,3,2,2], rank 1 owning blocks 1 and 2 (positions 3..7); `inner` runs inside the forward,
    after the CP split and the KV write (further hooks of the forward)."""
    _fake_parallel_state(monkeypatch, 1)
    hooks.after_initialize_model_parallel(None)
    probe.cp_configured = True
    probe.rank = probe.rank.model_copy(update={"attn_cp": 1})  # type: ignore[union-attr]
    meta = Meta([3, 3, 2, 2], [1, 2], per_rank_actual_token=[6, 6], per_rank_logical_token=[5, 5])
    fb = Batch(Mode("EXTEND"), torch.arange(10), torch.arange(10), ["q"], 1, [10], [0])
    loaded = Batch(Mode("EXTEND"), torch.arange(10), torch.arange(10), ["q"], 1, [10], [0],
                   attn_cp_metadata=meta)

    def forward(r: Runner, b: Batch) -> Output:
        hooks.after_prepare_cp_forward(None, loaded)
        sharded = torch.tensor([3, 4, 5, 6, 7, 0])  # padded to the physical 6 rows
        hooks.after_zigzag_shard_positions(sharded, Zigzag(), loaded.positions, loaded)
        k = torch.zeros(10, 1, 4)
        hooks.after_set_kv_buffer(None, object(), object(), None, k, k)
        if inner is not None:
            inner()
        return Output(False)

    hooks.around_model_runner_forward(forward, Runner(), fb)
    (s,) = [r for r in _records(probe) if isinstance(r, Step)]
    return s


def test_a_zigzag_step_records_this_ranks_blocks(probe: Probe, monkeypatch: MP) -> None:
    s = zigzag_step(probe, monkeypatch)
    assert (s.cp_active, s.attn_rows) == (True, 5)
    assert s.seq_positions == {"q": [(3, 8)]}
    assert s.kv_written == {"q": [(0, 10)]}


class Interleave:
    cp_rank = 1
    cp_size = 2


def test_an_interleave_step_records_every_second_packed_token_per_request(probe: Probe,
                                                                          monkeypatch: MP) -> None:
    """Rank 1 of cp 2 over two requests of 5 and 4 tokens (request b's prefix 6): packed tokens
    1, 3, 5, 7 are a's 1 and 3 and b's 6 + 0 and 6 + 2; one padding row follows."""
    _fake_parallel_state(monkeypatch, 1)
    hooks.after_initialize_model_parallel(None)
    probe.cp_configured = True
    probe.rank = probe.rank.model_copy(update={"attn_cp": 1})  # type: ignore[union-attr]
    positions = torch.tensor([0, 1, 2, 3, 4, 6, 7, 8, 9])
    meta = Meta([], [], per_rank_actual_token=[5, 5], per_rank_logical_token=[5, 4])
    fb = Batch(Mode("EXTEND"), torch.arange(9), positions, ["a", "b"], 2, [5, 4], [0, 6])
    loaded = Batch(Mode("EXTEND"), torch.arange(9), positions, ["a", "b"], 2, [5, 4], [0, 6],
                   attn_cp_metadata=meta)

    def forward(r: Runner, b: Batch) -> Output:
        hooks.after_prepare_cp_forward(None, loaded)
        hooks.after_interleave_shard_positions(torch.tensor([1, 3, 6, 8, 0]), Interleave(), positions, loaded)
        return Output(False)

    hooks.around_model_runner_forward(forward, Runner(), fb)
    (s,) = [r for r in _records(probe) if isinstance(r, Step)]
    assert (s.cp_active, s.attn_rows) == (True, 4)
    assert s.seq_positions == {"a": [(1, 2), (3, 4)], "b": [(6, 7), (8, 9)]}


def cp_v1_step(probe: Probe, monkeypatch: MP, metas: list[Any]) -> Step:
    """The Step of one extend on rank 1 of cp 2 whose model calls its CP-v1 position split once per
    entry of `metas` (a DSA model's backend calls it again on later layers), the step's batch being
    one request of 10 tokens."""
    _fake_parallel_state(monkeypatch, 1)
    hooks.after_initialize_model_parallel(None)
    probe.cp_configured = True
    probe.rank = probe.rank.model_copy(update={"attn_cp": 1})  # type: ignore[union-attr]
    fb = Batch(Mode("EXTEND"), torch.arange(10), torch.arange(10), ["q"], 1, [10], [0])

    def forward(r: Runner, b: Batch) -> Output:
        for meta in metas:
            split = Batch(Mode("EXTEND"), torch.arange(10), torch.arange(10), ["q"], 1, [10], [0],
                          attn_cp_metadata=meta)
            # cp_utils.cp_split_and_rebuild_position's result: this rank's blocks, no padding
            zigzag = getattr(meta, "split_list", None)
            mine = torch.tensor([3, 4, 5, 6, 7]) if zigzag else torch.arange(1, 10, 2)
            hooks.after_cp_v1_split_positions(mine, split, split.positions)
        return Output(False)

    hooks.around_model_runner_forward(forward, Runner(), fb)
    (s,) = [r for r in _records(probe) if isinstance(r, Step)]
    return s


@dataclass
class V1Meta:
    split_list: list[int] | None = None
    zigzag_index: list[int] | None = None
    per_rank_actual_token: list[int] | None = None


def test_a_cp_v1_split_records_this_ranks_blocks_without_padding(probe: Probe, monkeypatch: MP) -> None:
    s = cp_v1_step(probe, monkeypatch, [V1Meta([3, 3, 2, 2], [1, 2], [5, 5])])
    assert (s.cp_active, s.attn_rows) == (True, 5)
    assert s.seq_positions == {"q": [(3, 8)]}


def test_the_first_cp_v1_split_of_a_step_counts(probe: Probe, monkeypatch: MP) -> None:
    later = V1Meta([5, 1, 2, 2], [1, 2], [7, 3])  # another call's metadata must not replace the first's
    s = cp_v1_step(probe, monkeypatch, [V1Meta([3, 3, 2, 2], [1, 2], [5, 5]), later])
    assert (s.attn_rows, s.seq_positions) == (5, {"q": [(3, 8)]})


def test_a_round_robin_split_is_not_read_as_a_zigzag_one(probe: Probe, monkeypatch: MP) -> None:
    # DSA's round-robin split leaves the metadata empty (cp_utils.py:482-483): nothing to read
    s = cp_v1_step(probe, monkeypatch, [V1Meta()])
    assert not s.cp_active and s.attn_rows is None


@dataclass
class Pool:
    size: int = 1000
    page_size: int = 1
    head_num: int = 1
    head_dim: int = 64
    layer_num: int = 4
    dtype: str = "torch.bfloat16"


@dataclass
class Alloc:
    size: int = 2000
    page_size: int = 2


@dataclass
class KvResult:
    token_to_kv_pool: Pool = field(default_factory=Pool)
    token_to_kv_pool_allocator: Alloc = field(default_factory=Alloc)


def test_pool_and_capacity_hooks_record_what_sglang_built(probe: Probe, monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    for draft in (False, True):
        configurator = types.SimpleNamespace(is_draft_worker=draft)
        hooks.after_kv_configure(KvResult(), configurator, pre_model_load_memory=1)
    sched = types.SimpleNamespace(max_total_num_tokens=1000, max_running_requests=48,
                                  model_config=types.SimpleNamespace(context_len=4096))
    assert hooks.after_scheduler_init_info({"status": "ready"}, sched) is None
    recs = _records(probe)
    (pool,) = [r for r in recs if isinstance(r, KvPool)]
    (cap,) = [r for r in recs if isinstance(r, Capacity)]
    assert (pool.rows, pool.allocator_size, pool.allocator_page_size) == (1000, 2000, 2)
    assert pool.dtype == "bfloat16"
    assert (cap.max_total_num_tokens, cap.max_running_requests, cap.context_len) == (1000, 48, 4096)
    assert cap.rank == RankId(world=0, tp=0, dcp=0, attn_cp=0, attn_tp=0, attn_dp=0, pid=cap.rank.pid)


def test_steps_travel_in_batches_and_come_out_in_order_with_their_own_values(probe: Probe,
                                                                            monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 1)
    hooks.after_initialize_model_parallel(None)
    mlp = Layer()
    n_steps = 2 * copy_batches.COPY_EVERY + 3
    for i in range(n_steps):
        rids = [f"r{k}" for k in range(1 + i % 3)]
        pos = torch.tensor([100 + i + 10 * k for k in range(len(rids))])
        fb = Batch(Mode("DECODE"), torch.arange(len(rids)), pos, rids, len(rids))
        hooks.around_model_runner_forward(_dcp_forward(1, mlp), Runner(), fb)
        pos.add_(1000)  # the engine's later use of its own tensor
    steps = [r for r in _records(probe) if isinstance(r, Step)]
    assert [s.step for s in steps] == list(range(1, n_steps + 1))
    for i, s in enumerate(steps):
        want = {f"r{k}": 100 + i + 10 * k for k in range(1 + i % 3)}
        assert s.seq_positions == {r: [(p, p + 1)] for r, p in want.items()}
        assert s.kv_written == {r: [(p, p + 1)] if p % 2 == 1 else [] for r, p in want.items()}


def test_with_positions_off_steps_are_recorded_without_any_copy(tmp_path: Path, monkeypatch: MP) -> None:
    p = Probe(tmp_path, observe_positions=False, graph_flush_s=0.0)
    runtime.set_probe(p)
    try:
        _fake_parallel_state(monkeypatch, 1)
        hooks.after_initialize_model_parallel(None)
        fb = Batch(Mode("DECODE"), torch.arange(2), torch.tensor([5, 6]), ["a", "b"], 2)
        hooks.around_model_runner_forward(_dcp_forward(1, Layer()), Runner(), fb)
        assert p.copies is None or p.copies.parts == []  # no tensor was gathered for the host
        (s,) = [r for r in _records(p) if isinstance(r, Step)]
        assert (s.mode, s.batch_size, s.rows_in) == ("decode", 2, 2)
        assert s.seq_positions == {} and s.kv_written == {}
    finally:
        runtime.set_probe(None)
        p.close()


def test_decode_steps_are_written_packed_and_read_back_as_numbers(probe: Probe, monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 1)
    hooks.after_initialize_model_parallel(None)
    fb = Batch(Mode("DECODE"), torch.arange(3), torch.tensor([70000, 5, 2**31 - 1]), ["a", "b", "c"], 3)
    hooks.around_model_runner_forward(_dcp_forward(1, Layer()), Runner(), fb)
    (s,) = [r for r in _records(probe) if isinstance(r, Step)]
    line = next(x for x in (probe.out_dir / "rank1.jsonl").read_text().splitlines() if '"step"' in x)
    assert '"pos":"' in line and '"kv":"011"' in line  # no number turned into text on the engine's thread
    assert s.seq_positions == {"a": [(70000, 70001)], "b": [(5, 6)], "c": [(2**31 - 1, 2**31)]}
    assert s.kv_written == {"a": [], "b": [(5, 6)], "c": [(2**31 - 1, 2**31)]}


def test_a_switched_off_probe_records_no_step_until_switched_on(tmp_path: Path, monkeypatch: MP) -> None:
    switch = tmp_path / "switch"
    p = Probe(tmp_path / "probe", graph_flush_s=0.0, switch=switch)
    runtime.set_probe(p)
    try:
        _fake_parallel_state(monkeypatch, 0)
        hooks.after_initialize_model_parallel(None)
        calls: list[int] = []

        def forward(runner: Runner, fb: Batch) -> Output:
            calls.append(1)
            return Output(can_run_graph=False)

        def step(position: int) -> None:
            fb = Batch(Mode("DECODE"), torch.arange(1), torch.tensor([position]), ["a"], 1)
            hooks.around_model_runner_forward(forward, Runner(), fb)

        step(1)
        switch.write_text("off\n")
        p.poll_switch()
        step(2)
        switch.write_text("on\n")
        p.poll_switch()
        step(3)
        assert len(calls) == 3  # the engine's forward ran every time
        recs = _records(p)
        assert [s.seq_positions for s in recs if isinstance(s, Step)] == [{"a": [(1, 2)]}, {"a": [(3, 4)]}]
        notes = [r.message for r in recs if isinstance(r, ProbeNote) and r.message.startswith("probe ")]
        assert notes == [f"probe paused by {switch}", f"probe resumed by {switch}"]
    finally:
        runtime.set_probe(None)
        p.close()


def _count_general_ends(monkeypatch: MP) -> list[int]:
    """A list that grows by one for each step that ends by the general path (`steps._end_step_body`)."""
    ends: list[int] = []
    end = probe_steps._end_step_body

    def counted_end(*a: Any) -> None:
        ends.append(1)
        end(*a)

    monkeypatch.setattr(probe_steps, "_end_step_body", counted_end)
    return ends


def _two_request_replays(monkeypatch: MP, p: Probe, calls: list[int]) -> Callable[[int], None]:
    """`p` bound to a rank whose CP configuration is known, and a step that replays a decode graph
    of requests a and b at positions `pos` and `pos + 1000` (each forward appends to `calls`)."""
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    p.cp_configured = False
    runner = GraphedRunner(decode_cuda_graph_runner=GraphRunner(bs=2))
    decode = Mode("DECODE")

    def replay(r: Any, fb: Batch) -> Output:
        calls.append(1)
        return Output(can_run_graph=True)

    def step(pos: int) -> None:
        fb = Batch(decode, torch.arange(2), torch.tensor([pos, pos + 1000]), ["a", "b"], 2)
        hooks.around_model_runner_forward(replay, runner, fb)

    return step


def test_replays_on_the_short_path_stop_being_recorded_when_switched_off_and_are_all_counted(
        tmp_path: Path, monkeypatch: MP) -> None:
    """The short path of a run of replays asks neither whether the probe is paused nor counts each
    replay into the graph counter: the switch takes it away, and the replays it carried are added
    to the counts before they are written. Every replay recorded as a step is counted once, none
    while paused, and the short path carried most of them (or this proves nothing)."""
    switch = tmp_path / "switch"
    p = Probe(tmp_path / "probe", graph_flush_s=1e9, switch=switch)
    runtime.set_probe(p)
    general = _count_general_ends(monkeypatch)
    try:
        calls: list[int] = []
        replay = _two_request_replays(monkeypatch, p, calls)

        def steps(first: int, n: int) -> None:
            for pos in range(first, first + n):
                replay(pos)

        steps(0, 20)
        assert p.steady is not None  # armed: the next replays take the short path
        switch.write_text("off\n")
        p.poll_switch()
        assert p.steady is None
        steps(100, 10)
        switch.write_text("on\n")
        p.poll_switch()
        steps(200, 15)
        assert p.flush(timeout=10.0)
        assert len(calls) == 45  # the engine's forward ran every time
        recs = _records(p)
        recorded = [s.seq_positions["a"][0][0] for s in recs if isinstance(s, Step)]
        assert recorded == [*range(20), *range(200, 215)]
        replays = sum(g.count for g in recs if isinstance(g, Graph) and g.event == "replay")
        assert replays == 35
        assert len(general) < 35 / 2  # most replays went by the short path
    finally:
        runtime.set_probe(None)
        p.close()


@pytest.mark.parametrize("count", [2, 99, None], ids=["right", "wrong", "absent"])
def test_the_short_path_takes_rows_in_from_sglangs_count_only_where_the_arming_step_found_it_right(
        tmp_path: Path, monkeypatch: MP, count: int | None) -> None:
    """A run's later steps read `rows_in` from the forward batch's own int count of its input ids
    (`num_token_non_padded_cpu`) when the step that armed the short path had it equal to its input
    ids' rows; otherwise (a count that disagrees, or none) they ask the tensor, as the general path
    does. Either way every step records its input ids' 2 rows, and the short path carries most."""
    p = Probe(tmp_path / "probe", graph_flush_s=1e9)
    p._start_watchdog = lambda: None  # type: ignore[method-assign]
    runtime.set_probe(p)
    general = _count_general_ends(monkeypatch)
    try:
        _fake_parallel_state(monkeypatch, 0)
        hooks.after_initialize_model_parallel(None)
        p.cp_configured = False
        runner = GraphedRunner(decode_cuda_graph_runner=GraphRunner(bs=2))
        for pos in range(40):
            fb = Batch(Mode("DECODE"), torch.arange(2), torch.tensor([pos, pos + 1000]), ["a", "b"], 2)
            fb.num_token_non_padded_cpu = count
            hooks.around_model_runner_forward(lambda r, b: Output(can_run_graph=True), runner, fb)
        assert p.flush(timeout=10.0)
        steps = [s for s in _records(p) if isinstance(s, Step)]
        assert len(steps) == 40 and {s.rows_in for s in steps} == {2}
        assert len(general) < 10
        said = [n.message for n in _records(p)
                if isinstance(n, ProbeNote) and "num_token_non_padded" in n.message]
        assert len(said) == (1 if count == 99 else 0)  # once, where SGLang's count is an int that disagrees
    finally:
        runtime.set_probe(None)
        p.close()


def test_replays_on_the_short_path_do_the_chores_when_they_are_due(tmp_path: Path, monkeypatch: MP) -> None:
    """A busy scheduler iteration leaves the chores to its step (pool_hooks), so the short path does
    them after its step, on the clock it read then: every time they are due, and only then."""
    now = [50.0]
    p = Probe(tmp_path / "probe", clock=lambda: now[0], graph_flush_s=1e9)
    p._start_watchdog = lambda: None  # type: ignore[method-assign]
    runtime.set_probe(p)
    general = _count_general_ends(monkeypatch)
    rounds: list[float] = []
    chores = p.chores
    monkeypatch.setattr(p, "chores", lambda t: (rounds.append(t), chores(t)))
    try:
        calls: list[int] = []
        replay = _two_request_replays(monkeypatch, p, calls)
        for pos in range(60):
            now[0] += 0.01  # 10 ms a step: the chores are due every tenth (runtime.CHORES_S)
            replay(pos)
        assert len(general) < 10  # the short path carried the steps
        gaps = [b - a for a, b in zip(rounds, rounds[1:], strict=False)]
        assert len(rounds) >= 5 and all(runtime.CHORES_S <= g < runtime.CHORES_S + 0.0101 for g in gaps)
    finally:
        runtime.set_probe(None)
        p.close()


def test_replays_under_a_clock_of_ints_keep_whole_rows(tmp_path: Path, monkeypatch: MP) -> None:
    """A replay kept as its clock alone is told from a whole row by being a float
    (`copy_batches.Run`): under a clock that gives ints the short path keeps whole rows, and every
    replay is recorded at its own step and time."""
    p = Probe(tmp_path / "probe", clock=lambda: 1000, graph_flush_s=1e9)
    p._start_watchdog = lambda: None  # type: ignore[method-assign]
    runtime.set_probe(p)
    general = _count_general_ends(monkeypatch)
    try:
        replay = _two_request_replays(monkeypatch, p, [])
        for pos in range(20):  # all at one time: an int clock ticks in whole seconds
            replay(pos)
        assert p.steady is not None and not p.steady.compact
        assert len(general) < 5  # the short path carried the replays
        steps = [s for s in _records(p) if isinstance(s, Step)]
        want = [(k, 0.0, k - 1) for k in range(1, 21)]
        assert [(s.step, s.t, s.seq_positions["a"][0][0]) for s in steps] == want
    finally:
        runtime.set_probe(None)
        p.close()


@pytest.mark.parametrize("timing", [False, True], ids=["untimed", "timed"])
def test_the_graph_counts_and_notes_written_while_replays_fill_a_batch_leave_their_run_whole(
        tmp_path: Path, monkeypatch: MP, timing: bool) -> None:
    """The chores write the graph counts once a second, and while the probe measures itself its
    cost note, in the middle of a batch of replays: they follow the run's one `steps` line instead
    of ending the run (a record would, and the next replay would start another run by the general
    path). Every replay is counted once."""
    now = [50.0]
    p = Probe(tmp_path / "probe", clock=lambda: now[0], graph_flush_s=0.25)
    p._start_watchdog = lambda: None  # type: ignore[method-assign]
    runtime.set_probe(p)
    general = _count_general_ends(monkeypatch)
    try:
        replay = _two_request_replays(monkeypatch, p, [])
        p.timing = timing
        p._last_notes = 49.6  # the measuring's notes due half way
        for pos in range(95):
            now[0] += 0.01  # most of a second of replays: the counts are due about four times, one batch
            replay(pos)
        assert len(general) == 1  # the run's first step alone; nothing written ended the run
        lines = (p.out_dir / "rank0.jsonl").read_text().splitlines() if p.flush(timeout=10.0) else []
        kinds = [json.loads(line)["kind"] for line in lines]
        assert kinds.count("steps") == 1 and kinds.index("steps") < kinds.index("graph")
        costs = [k for k, line in enumerate(lines) if '"message":"cost [' in line]
        assert bool(costs) is timing and all(k > kinds.index("steps") for k in costs)
        recs = read_records(p.out_dir / "rank0.jsonl")[0]
        counts = [g for g in recs if isinstance(g, Graph) and g.event == "replay"]
        assert len(counts) >= 3 and sum(g.count for g in counts) == 95
    finally:
        runtime.set_probe(None)
        p.close()


def test_a_batch_taken_by_another_thread_while_a_replay_goes_on_it_is_sent_with_that_replay(
        tmp_path: Path, monkeypatch: MP) -> None:
    """The short path appends a replay to the batch being filled without the lock. The watchdog may
    take that batch to send it (`send_copies`) just after the engine's thread read it: it then
    waits for the replay to be on it, and the replay is recorded with its positions."""
    p = Probe(tmp_path / "probe", graph_flush_s=1e9)
    p._start_watchdog = lambda: None  # type: ignore[method-assign]  # this test plays the watchdog
    runtime.set_probe(p)
    try:
        step = _two_request_replays(monkeypatch, p, [])
        for pos in range(5):
            step(pos)
        st = p.steady
        assert st is not None
        appending, sent = threading.Event(), threading.Event()
        add_part = st.add_part
        taken_first: list[bool] = []

        def slow_add_part(t: Any) -> None:  # the engine's thread, between reading the batch and appending
            appending.set()
            sent.wait(0.5)  # the watchdog takes the batch meanwhile; it must not send it yet
            taken_first.append(p.copies is None and not sent.is_set())
            add_part(t)

        st.add_part = slow_add_part
        batch = p.copies

        def take() -> None:
            assert appending.wait(10.0)
            copy_batches.send_copies(p)
            sent.set()

        watchdog = threading.Thread(target=take)
        watchdog.start()
        step(5)
        watchdog.join(10.0)
        assert taken_first == [True] and sent.is_set()
        assert p.copies is None and batch is not None and batch.host is not None
        step(6)  # on a batch of its own, by the general path
        assert p.flush(timeout=10.0)
        recs = _records(p)
        steps = [s for s in recs if isinstance(s, Step)]
        assert [s.seq_positions["a"][0][0] for s in steps] == list(range(7))
        assert [s.seq_positions["b"][0][0] for s in steps] == [1000 + k for k in range(7)]
    finally:
        runtime.set_probe(None)
        p.close()


def test_a_timing_probe_notes_its_own_time_per_step_never_more_than_the_steps_took(
        probe: Probe, monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 1)
    hooks.after_initialize_model_parallel(None)
    probe.timing = True
    for i in range(copy_batches.COPY_EVERY + 4):  # one batch of copies sent from the engine's thread
        fb = Batch(Mode("DECODE"), torch.arange(2), torch.tensor([5 + i, 9 + i]), ["a", "b"], 2)
        hooks.around_model_runner_forward(_dcp_forward(1, Layer()), Runner(), fb)
    probe.flush()
    (note,) = [r for r in _records(probe) if isinstance(r, ProbeNote) and r.message.startswith("cost ")]
    cost = json.loads(note.message[5:])
    (_epoch, steps, probe_ns, span_ns, ready_ns, begin_ns, end_ns, send_ns, slow, slow_ns, watchdog_ns,
     pool_ns, pool_calls, pool_read_ns, pool_reads, w_send_ns, w_finish_ns, w_lines_ns, chores_ns,
     inner_ns, measuring_ns, fin_lines_ns, fin_write_ns, fin_give_back_ns) = cost
    assert steps == copy_batches.COPY_EVERY + 4 and 0 < probe_ns <= span_ns
    assert ready_ns + begin_ns + end_ns == probe_ns  # the parts are the whole
    assert 0 < send_ns <= end_ns  # the engine's thread sends the full batch as its step ends
    assert 0 <= slow <= steps and (slow_ns == 0) == (slow == 0)
    assert watchdog_ns >= 0  # the watchdog's rounds, off the engine's thread (not in probe_ns)
    assert pool_ns == pool_calls == pool_read_ns == pool_reads == 0  # no scheduler iteration here
    assert w_send_ns + w_finish_ns + w_lines_ns == watchdog_ns  # the watchdog's phases are its whole round
    assert chores_ns > 0  # the first step's chores, outside the step's parts
    assert 0 <= measuring_ns <= chores_ns  # the measuring's own work is part of the chores'
    assert inner_ns == 0  # this test calls the inner hooks as they are, not as registered (timed_inner)
    # the batches' finishing by phase: the full one in a step's `ready`, the last one by the flush
    assert fin_lines_ns > 0 and fin_write_ns > 0 and fin_give_back_ns > 0
    assert len([r for r in _records(probe) if isinstance(r, Step)]) == steps  # timing changes no record


def test_decode_runs_over_the_same_requests_share_a_line_and_read_back_step_by_step(
        probe: Probe, monkeypatch: MP) -> None:
    _fake_parallel_state(monkeypatch, 1)
    hooks.after_initialize_model_parallel(None)
    mlp = Layer()
    plan = [["a", "b"]] * 5 + [["a"]] * 3 + [["a", "c"]] * 4  # requests leave and join mid-batch
    for i, rids in enumerate(plan):
        fresh = list(rids)  # SGLang builds a new list each forward
        pos = torch.tensor([10 * i + k for k in range(len(rids))])
        fb = Batch(Mode("DECODE"), torch.arange(len(rids)), pos, fresh, len(rids))
        hooks.around_model_runner_forward(_dcp_forward(1, mlp), Runner(), fb)
    steps = [r for r in _records(probe) if isinstance(r, Step)]
    assert [s.step for s in steps] == list(range(1, len(plan) + 1))
    for i, (s, rids) in enumerate(zip(steps, plan, strict=True)):
        want = {r: 10 * i + k for k, r in enumerate(rids)}
        assert s.seq_positions == {r: [(p, p + 1)] for r, p in want.items()}
        assert s.kv_written == {r: [(p, p + 1)] if p % 2 == 1 else [] for r, p in want.items()}
        assert (s.batch_size, s.rows_in, s.mode) == (len(rids), len(rids), "decode")
    text = (probe.out_dir / "rank1.jsonl").read_text()
    assert text.count('"kind":"steps"') == 3  # one line per run of equal requests, not per step
    assert '"kind":"step"' not in text


def test_a_record_written_while_a_batch_fills_joins_it_in_order_and_the_batch_goes_whole(
        probe: Probe, monkeypatch: MP) -> None:
    """A pool sample every 4 scheduler iterations (D59) closed the copy batch being filled and sent
    it: batches of 4 steps (D67). A record written while a batch fills now joins it: the batch
    stays open and is sent when full. A pool sample
    does not split the run of decode steps it was made in: it follows the run's one `steps` line
    (D72); any other record is written between the steps made before and after it."""
    from cptest.evidence import PoolSample
    from cptest.probe import pool_hooks
    from cptest.probe.pool_hooks import PoolSampler

    _fake_parallel_state(monkeypatch, 1)
    hooks.after_initialize_model_parallel(None)
    monkeypatch.setattr(pool_hooks, "_SAMPLER", PoolSampler(every=4, quiet_every=4))
    engine = threading.get_ident()
    sent_on_engine: list[int] = []

    class Watched(copy_batches.CopyBatch):
        def send(self, on_engine_thread: bool = False) -> None:
            if threading.get_ident() == engine:
                sent_on_engine.append(self.steps)
            super().send(on_engine_thread)

    monkeypatch.setattr(copy_batches, "CopyBatch", Watched)
    alloc = types.SimpleNamespace(size=1024, free=1024, available_size=lambda: alloc.free)
    running = types.SimpleNamespace(reqs=[object(), object()])
    plan = types.SimpleNamespace(running_batch=running, batch_to_run=running)
    sched = types.SimpleNamespace(token_to_kv_pool_allocator=alloc, waiting_queue=[], forward_ct=0)
    batches = []
    n = copy_batches.COPY_EVERY
    for _ in range(2 * n):
        alloc.free -= 2
        pool_hooks.after_get_next_batch_to_run(plan, sched)
        if sched.forward_ct == n + 6:
            probe.note("a note")
        j = sched.forward_ct
        fb = Batch(Mode("DECODE"), torch.arange(2), torch.tensor([100 + j, 200 + j]), ["a", "b"], 2)
        hooks.around_model_runner_forward(_dcp_forward(1, Layer()), Runner(), fb)
        sched.forward_ct += 1
        batches.append(probe.copies)
    # one batch of n steps, closed when full, then another
    assert all(b is batches[0] for b in batches[:n - 1]) and batches[n - 1] is None
    assert all(b is batches[n] for b in batches[n:-1]) and batches[-1] is None
    assert sent_on_engine == [n, n]
    recs = [r for r in _records(probe) if isinstance(r, (Step, PoolSample, ProbeNote))]
    # Samples made while no batch fills (0, before the first step; n, between the batches) come
    # in order; the others after their run's steps; the note splits the second batch's run, and the
    # sample made before it in that run (n + 4) comes before it.
    steps = [("Step", j + 1) for j in range(2 * n)]
    assert [(type(r).__name__, getattr(r, "step", None)) for r in recs] == [
        ("PoolSample", 0), *steps[:n], *[("PoolSample", k) for k in range(4, n, 4)],
        ("PoolSample", n), *steps[n:n + 6], ("PoolSample", n + 4), ("ProbeNote", None),
        *steps[n + 6:], *[("PoolSample", k) for k in range(n + 8, 2 * n, 4)]]
    steps_read = [r for r in recs if isinstance(r, Step)]
    assert [s.seq_positions for s in steps_read] == [{"a": [(100 + j, 101 + j)], "b": [(200 + j, 201 + j)]}
                                                      for j in range(2 * n)]
    text = (probe.out_dir / "rank1.jsonl").read_text()
    assert text.count('"kind":"steps"') == 3  # a block of steps stops at a record, not at a pool sample


@pytest.mark.parametrize("chores_s", [runtime.CHORES_S, 0.0])
def test_a_pool_sample_made_between_two_batches_goes_out_in_the_closed_batchs_one_write(
        probe: Probe, monkeypatch: MP, chores_s: float) -> None:
    """Once a batch is sent, the next step opens the next one; a pool sample made in between (the
    scheduler's hook runs before the forward) joins the closed batch still waiting to be written,
    after its lines, instead of a write of its own: every write of a busy decode is a batch's.
    The chores, which that hook also runs, may fall in between too (at every call here): their
    graph counts, made late, join the closed batch as well, and a sample after them still does."""
    from cptest.probe import pool_hooks
    from cptest.probe.pool_hooks import PoolSampler

    monkeypatch.setattr(runtime, "CHORES_S", chores_s)
    _fake_parallel_state(monkeypatch, 1)
    hooks.after_initialize_model_parallel(None)
    monkeypatch.setattr(pool_hooks, "_SAMPLER", PoolSampler(every=4, quiet_every=4))
    chunks: list[bytes] = []
    real_write = runtime.os.write

    def write(fd: int, data: bytes) -> int:
        chunks.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(runtime.os, "write", write)
    alloc = types.SimpleNamespace(size=1024, free=1024, available_size=lambda: alloc.free)
    running = types.SimpleNamespace(reqs=[object(), object()])
    plan = types.SimpleNamespace(running_batch=running, batch_to_run=running)
    sched = types.SimpleNamespace(token_to_kv_pool_allocator=alloc, waiting_queue=[], forward_ct=0)
    n = copy_batches.COPY_EVERY
    for _ in range(2 * n + 1):
        alloc.free -= 2
        pool_hooks.after_get_next_batch_to_run(plan, sched)
        j = sched.forward_ct
        fb = Batch(Mode("DECODE"), torch.arange(2), torch.tensor([100 + j, 200 + j]), ["a", "b"], 2)
        hooks.around_model_runner_forward(_dcp_forward(1, Layer()), Runner(), fb)
        sched.forward_ct += 1
    probe.flush()
    busy = [c for c in chunks if b'"kind":"step' in c or b'"kind":"pool_sample"' in c]
    # the first sample (before any step) alone; then one write per batch: two full ones (a `steps`
    # line each) and the last step's (a `step` line), at flush
    assert [(c.count(b'"kind":"steps"'), c.count(b'"kind":"step"')) for c in busy] == [
        (0, 0), (1, 0), (1, 0), (0, 1)]
    first, second = (c.decode().splitlines() for c in busy[1:3])
    def kinds(lines: list[str]) -> list[tuple[str, Any]]:
        records = [json.loads(line) for line in lines]
        return [(r["kind"], r.get("step")) for r in records if r["kind"] != "graph"]

    samples = [("pool_sample", k) for k in range(4, n + 1, 4)]  # n: made after the batch was sent
    assert kinds(first) == [("steps", list(range(1, n + 1))), *samples]
    assert kinds(second)[0] == ("steps", list(range(n + 1, 2 * n + 1)))
    assert kinds(second)[-1] == ("pool_sample", 2 * n)  # made between the second batch and the last step
    got = [r for r in _records(probe) if isinstance(r, Step)]
    assert [s.step for s in got] == list(range(1, 2 * n + 2))


def test_a_pool_sample_joins_a_closed_batch_only_when_it_is_the_last_pending_work_and_free(
        probe: Probe) -> None:
    """`attach_record` without a batch being filled: the sample goes after the closed batch's
    lines only while that batch is the last pending item and no other thread holds the pending
    work (which may be writing that batch); otherwise it is refused and written as any record."""
    sample = ("pool_sample",)
    assert not copy_batches.attach_record(probe, sample)  # nothing pending
    closed = copy_batches.open_batch(probe)
    probe.copies = None  # closed, not written yet
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with probe._pending_lock:
            held.set()
            release.wait(5)

    other = threading.Thread(target=hold)
    other.start()
    held.wait(5)
    try:
        assert not copy_batches.attach_record(probe, sample)  # busy: never waited for
    finally:
        release.set()
        other.join()
    assert closed.later == []
    assert not copy_batches.attach_record(probe, ProbeNote(t=0.0, level="info", message="m"))  # samples only
    assert copy_batches.attach_record(probe, sample) and closed.later == [sample]
    probe.write("a record after the batch")  # queued behind it: the batch is no longer the last
    assert not copy_batches.attach_record(probe, sample) and closed.later == [sample]
    probe._pending.clear()


def test_a_decode_steps_reused_draft_starts_as_a_new_one(probe: Probe, monkeypatch: MP) -> None:
    """A step that joined a run leaves its draft to the next decode step, which resets only what a
    decode step's hooks set (D69): every field the hooks read starts as in a draft made afresh
    (`which` and `t` are set at every step's end, `first` where the batch keeps the draft)."""
    import dataclasses

    from cptest.probe.records import StepDraft

    _fake_parallel_state(monkeypatch, 1)
    hooks.after_initialize_model_parallel(None)
    fb = Batch(Mode("DECODE"), torch.arange(2), torch.tensor([5, 9]), ["a", "b"], 2)
    hooks.around_model_runner_forward(_dcp_forward(1, Layer()), Runner(), fb)  # attn, KV, mask: all set
    spare = probe.spare
    assert spare is not None and spare.kv_rows == 2
    probe_steps._begin_step_body(probe, Runner(), fb)
    assert probe.current is spare
    fresh = StepDraft(step=probe.step_index, mode="decode", batch_size=2, rows_in=2, rids=spare.rids,
                      cp_configured=probe.cp_configured)
    for f in dataclasses.fields(StepDraft):
        if f.name not in ("which", "t", "first"):
            assert getattr(spare, f.name) == getattr(fresh, f.name), f.name
    probe.current = None


def test_batches_finished_at_later_steps_keep_the_records_in_the_order_they_were_made(
        probe: Probe, monkeypatch: MP) -> None:
    """The engine's thread finishes each batch at a later step's start (D114), with notes written
    between steps: records come out in the order they were made."""
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    engine = threading.get_ident()
    finished_on: list[int] = []

    class Watched(copy_batches.CopyBatch):
        def run(self) -> None:
            finished_on.append(threading.get_ident())
            super().run()

    monkeypatch.setattr(copy_batches, "CopyBatch", Watched)
    steps = 3 * copy_batches.COPY_EVERY + 5
    for i in range(steps):
        fb = Batch(Mode("DECODE"), torch.arange(2), torch.tensor([9 + i, 4 + i]), ["a", "b"], 2)
        hooks.around_model_runner_forward(lambda r, b: Output(can_run_graph=False), Runner(), fb)
        if i % 7 == 3:
            probe.note(f"after step {i + 1}")
    assert finished_on == [engine] * 3  # the three full batches, each at a later step's start
    recs = _records(probe)
    order = [r.step if isinstance(r, Step) else r.message for r in recs
             if isinstance(r, Step) or (isinstance(r, ProbeNote) and r.level == "info")]
    want: list[Any] = []
    for i in range(steps):
        want.append(i + 1)
        if i % 7 == 3:
            want.append(f"after step {i + 1}")
    assert order == want


def _replays_and_turns(probe: Probe, tick: Any = None) -> int:
    """Decode steps of one rank as SGLang 0.5.17 runs them with decode graphs (one ForwardMode
    object), with every turn that ends a run of replays: a batch of copies filling up, eager steps
    in between, the padded size, the captured width and the graph runner changing, other requests,
    a replay without positions, as many other requests, a batch size that is not the run's, a
    prefill over the same requests, M-RoPE positions, a forward that raised, a padded size that
    cannot be read, input ids of another length (the short path keeps a replay as its clock alone
    where its row is the last one's but for the step, `copy_batches.Run`). After every step no
    draft is both the spare and among those free for reuse. `tick`, when given, is called before
    each step (a clock the scenario moves). Returns the number of steps."""
    decode = Mode("DECODE")
    gr = GraphRunner(bs=4)
    runner = GraphedRunner(decode_cuda_graph_runner=gr)
    mlp = Layer()
    n = 0

    def step(rids: list[str], kind: str = "replay", positions: Any = "1d", bs: int | None = None,
             rows: int | None = None) -> None:
        nonlocal n
        n += 1
        if tick is not None:
            tick()
        if positions == "1d":
            positions = torch.tensor([10 * n + k for k in range(len(rids))])
        elif positions == "mrope":
            text = [10 * n + k for k in range(len(rids))]
            positions = torch.tensor([text, [7] * len(rids), [8] * len(rids)])  # text, height, width
        fb = Batch(decode, torch.arange(rows or len(rids)), positions, list(rids), bs or len(rids))
        if kind == "extend":  # one new token for each request, as a prefill of the same requests
            fb = Batch(Mode("EXTEND"), fb.input_ids, positions, list(rids), len(rids), [1] * len(rids),
                       [10 * n] * len(rids))
        if kind == "raise":
            with pytest.raises(RuntimeError):
                hooks.around_model_runner_forward(lambda r, b: (_ for _ in ()).throw(RuntimeError("boom")),
                                                  runner, fb)
        else:
            replay = kind == "replay"
            forward = (lambda r, b: Output(can_run_graph=True)) if replay else _dcp_forward(0, mlp)
            hooks.around_model_runner_forward(forward, runner, fb)
        assert all(d is not probe.spare for d in probe.drafts)

    ab, abc, abcd = ["a", "b"], ["a", "b", "c"], ["a", "b", "c", "d"]
    for _ in range(copy_batches.COPY_EVERY + 4):
        step(ab)
    step(ab, "eager")
    step(ab, "eager")
    for _ in range(5):
        step(ab)
    gr.bs = 8
    for _ in range(3):
        step(ab)
    gr.captured_req_width = 2
    for _ in range(3):
        step(ab)
    runner.decode_cuda_graph_runner = gr = GraphRunner(bs=8)
    for _ in range(3):
        step(ab)
    for _ in range(3):
        step(abc)
    step(abc, positions=None)
    for _ in range(3):
        step(abc)
    axc = ["a", "x", "c"]
    for _ in range(3):  # as many requests, not the same ones
        step(axc)
    step(axc, bs=4)  # a batch size that is not the run's: the record says what SGLang said
    for _ in range(2):
        step(axc)
    step(axc, "extend")  # another forward mode over the same requests
    quoted = ['q"x', "y", "z"]  # an id JSON escapes: each step of the run gets a line of its own,
    for _ in range(3):  # which carries its batch size
        step(quoted)
    step(quoted, bs=4)
    step(quoted)
    for _ in range(3):
        step(abc)
    for _ in range(6):  # other requests: a new run, whose positions are M-RoPE's from its first step
        step(abcd, positions="mrope")
    # Not right after a batch was closed: without a writer thread the next step finishes it by the
    # general path, and the raise is for the short one (batches fill alike either way).
    while probe.copies is None or probe.copies.steps < 2:
        step(abcd, positions="mrope")
    step(abcd, "raise")
    for _ in range(3):
        step(abc)
    gr.bs = None  # type: ignore[assignment]
    step(abc)
    gr.bs = 8
    for _ in range(3):
        step(abc)
    step(abc, rows=4)  # input ids of another length: the record says so, and the next step's again
    for _ in range(3):
        step(abc)
    return n


class PathRun(NamedTuple):
    """What one path's run of a scenario wrote and did (`_by_each_path`)."""

    text: bytes
    """The rank file, without the timing probe's cost notes (they hold clock readings)."""
    general_ends: int
    """Steps that ended by the general path (`steps._end_step_body`)."""
    steps: int
    cost: list[int]
    """`Probe.cost` before the flush."""


def _by_each_path(tmp_path: Path, monkeypatch: MP, scenario: Callable[[Probe, Any], int],
                  timing: bool) -> tuple[PathRun, PathRun]:
    """The same scenario with the short path taken where it can be (`steps._arm_steady`) and
    with every step taken by the general one: what each wrote and how many steps ended by the
    general path. The clock moves 10 us a step, moved by the scenario: the two paths read it a
    different number of times, and no batch grows old enough for the engine to send it before it
    is full. The reads' credit never runs out: it spends real time, not the scenario's."""
    _fake_parallel_state(monkeypatch, 0)
    general_ends = _count_general_ends(monkeypatch)

    def run(short: bool) -> PathRun:
        now = [0.0]

        def tick() -> None:
            now[0] += 1e-5

        p = Probe(tmp_path / ("short" if short else "general"), clock=lambda: now[0], graph_flush_s=1e9)
        p._start_watchdog = lambda: None  # type: ignore[method-assign]  # it would read the clock too
        runtime.set_probe(p)
        try:
            with monkeypatch.context() as m:
                if not short:
                    m.setattr(probe_steps, "_arm_steady", lambda *a: None)
                hooks.after_initialize_model_parallel(None)
                p.cp_configured = False  # SGLang's CP module is loaded: the configuration is known
                p.timing = timing
                p.read_share = 1e9
                general_ends.clear()
                steps = scenario(p, tick)
                cost = list(p.cost)
                assert p.flush(timeout=10.0)
        finally:
            runtime.set_probe(None)
            p.close()
        text = b"".join(line for line in (p.out_dir / "rank0.jsonl").read_bytes().splitlines(keepends=True)
                        if b'"message":"cost [' not in line)
        return PathRun(text, len(general_ends), steps, cost)

    return run(short=False), run(short=True)


@pytest.mark.parametrize("timing", [False, True], ids=["untimed", "timed"])
def test_replays_by_the_short_path_write_the_bytes_the_general_path_writes(
        tmp_path: Path, monkeypatch: MP, timing: bool) -> None:
    """D74: a replay that goes on the run of replays the last step went on takes the short path
    (`steps._steady_forward`); the rank file is the same, byte for byte, as when every step takes
    the general one. The short path must actually carry most of the steps (or the test proves
    nothing), and the timing probe counts every step once, whichever path it took."""
    general, short = _by_each_path(tmp_path, monkeypatch, _replays_and_turns, timing)
    steps = general.steps
    assert general.general_ends == steps - 1  # every step but the one that raised ends by the general path
    assert short.general_ends < steps / 2  # most end by the short one
    assert short.text == general.text
    recs = read_records(tmp_path / "short" / "rank0.jsonl")[0]
    # every step but the one that raised and the replay without a readable padded size
    assert len([r for r in recs if isinstance(r, Step)]) == steps - 2
    if timing:  # [probe ns, counted steps, ...]: each step that returned counted once
        assert general.cost[1] == short.cost[1] == steps - 1
        assert short.cost[0] == short.cost[4] + short.cost[5] + short.cost[6]
        for run in (general, short):  # the batches' finishing by phase, within the steps' `ready`
            assert all(run.cost[i] > 0 for i in (21, 22, 23)) and sum(run.cost[21:24]) <= run.cost[4]


BIG = 2**25 + 1


def _odd_positions(probe: Probe, tick: Any) -> int:
    """Replays whose batches of 16 steps each hold one step whose positions are not one of its
    requests' each (a position more, or M-RoPE's [3, n] in a run of 1-D ones), or of another dtype
    (int32, float). The short path appends such a step's positions as the run's (`CopyBatch._cat`
    finds them out when the batch is sent); the general path asks each step's."""
    probe.copy_every = 16
    runner = GraphedRunner(decode_cuda_graph_runner=GraphRunner(bs=4))
    decode = Mode("DECODE")
    rids = ["a", "b", "c"]
    n = 0
    for odd in (None, "one more", "int32", "float", "mrope", None):
        for k in range(16):
            n += 1
            tick()
            if odd is not None and k == 9:
                width, dtype = ((4, torch.int64) if odd == "one more" else (3, torch.int64) if odd == "mrope"
                                else (3, getattr(torch, odd)))
            else:
                width, dtype = 3, torch.int64
            # past float32's exact integers: promoted to float, the other steps' would change
            positions = torch.tensor([BIG + 10 * n + i for i in range(width)], dtype=dtype)
            if odd == "mrope" and k == 9:
                positions = torch.stack([positions, positions + 1, positions + 2])
            fb = Batch(decode, torch.arange(3), positions, list(rids), 3)
            hooks.around_model_runner_forward(lambda r, b: Output(can_run_graph=True), runner, fb)
    return n


@pytest.mark.parametrize("timing", [False, True], ids=["untimed", "timed"])
def test_replays_with_odd_positions_write_the_bytes_the_general_path_writes(
        tmp_path: Path, monkeypatch: MP, timing: bool) -> None:
    """A batch of replays is sent as one concatenation of its positions, without asking each
    step's tensor its size and dtype (`CopyBatch._cat`); one step whose positions are one more
    than its requests, M-RoPE's in a run of 1-D ones, or of another dtype, still gets what the
    general path records of it."""
    general, short = _by_each_path(tmp_path, monkeypatch, _odd_positions, timing)
    assert short.general_ends < general.steps / 2
    assert short.text == general.text
    recs = [r for r in read_records(tmp_path / "short" / "rank0.jsonl")[0] if isinstance(r, Step)]
    assert len(recs) == general.steps == 96
    by_step = {r.step: r for r in recs}
    assert by_step[26].positions == []  # a position more than its requests: none is theirs
    for n in (25, 27, 41, 42, 43, 57, 59, 73, 75):  # the steps next to the odd ones, and the int32 one
        assert [tuple(r) for r in by_step[n].positions] == [(BIG + 10 * n, BIG + 10 * n + 3)]  # [start, end)


def _eager_decodes_and_turns(probe: Probe, tick: Any) -> int:
    """Eager decode steps of one rank without DCP (a KV write of one row a request, the first MLP's
    rows), with every turn that ends their run: a batch of copies filling up, a step that records
    its reads (every `read_every`-th), a KV write of another size, a write not seen, other
    requests, a replay, a DCP owner mask, a forward that raised, M-RoPE positions. Returns the
    number of steps."""
    decode = Mode("DECODE")
    runner = GraphedRunner(decode_cuda_graph_runner=GraphRunner(bs=4))
    # SGLang's block table, which a step that records its reads reads (steps._block_rows)
    runner.req_to_token_pool = types.SimpleNamespace(  # type: ignore[attr-defined]
        req_to_token=torch.arange(4 * 16, dtype=torch.int32).reshape(4, 16))
    mlp = Layer()
    mlp.register_forward_hook(hooks.on_mlp_input)
    n = 0

    def step(rids: list[str], kind: str = "eager", write: int | None = None, positions: str = "1d") -> None:
        nonlocal n
        n += 1
        tick()
        text = [10 * n + k for k in range(len(rids))]
        pos = (torch.tensor(text) if positions == "1d"
               else torch.tensor([text, [7] * len(rids), [8] * len(rids)]))  # M-RoPE: text, height, width
        fb = Batch(decode, torch.arange(len(rids)), pos, list(rids), len(rids))
        fb.req_pool_indices = torch.arange(len(rids))  # type: ignore[attr-defined]
        fb.seq_lens_cpu = torch.full((len(rids),), 5)  # type: ignore[attr-defined]

        def forward(r: Any, b: Batch) -> Output:
            if kind == "raise":
                raise RuntimeError("boom")
            if kind == "replay":
                return Output(can_run_graph=True)
            rows = len(rids) if write is None else write
            if rows:
                k_rows = torch.zeros(rows, 1, 4)
                loc = torch.arange(rows)
                mask = loc % 2 == 0 if kind == "mask" else None
                hooks.after_set_kv_buffer(None, object(), object(), loc, k_rows, k_rows, dcp_kv_mask=mask)
            return Output(can_run_graph=False, logits=mlp(torch.ones(len(rids), 8)))

        if kind == "raise":
            with pytest.raises(RuntimeError):
                hooks.around_model_runner_forward(forward, runner, fb)
        else:
            hooks.around_model_runner_forward(forward, runner, fb)
        assert all(d is not probe.spare for d in probe.drafts)

    ab, abc = ["a", "b"], ["a", "b", "c"]
    for _ in range(copy_batches.COPY_EVERY + 40):  # a batch fills; steps 32, 64, ... record reads
        step(ab)
    step(ab, write=3)  # a KV write of another size
    for _ in range(3):
        step(ab)
    step(ab, write=0)  # no write seen
    for _ in range(3):
        step(ab)
    for _ in range(3):
        step(abc)
    step(abc, "replay")
    for _ in range(3):
        step(abc)
    step(abc, "mask")
    for _ in range(3):
        step(abc)
    step(abc, "raise")
    for _ in range(3):
        step(abc)
    for _ in range(3):
        step(abc, positions="mrope")
    return n


def _eager_decodes_with_a_dp_buffer(probe: Probe, tick: Any) -> int:
    """Eager decode steps of the same three requests whose forwards, from the 12th to the 20th,
    size an attention-DP buffer (as `prepare_mlp_sync_batch` does): those steps' records carry it,
    whichever path they take. Returns the number of steps."""
    runner = GraphedRunner(decode_cuda_graph_runner=GraphRunner(bs=4))
    mlp = Layer()
    mlp.register_forward_hook(hooks.on_mlp_input)
    rids = ["a", "b", "c"]
    n = 0
    for n in range(1, 31):
        tick()
        positions = torch.tensor([10 * n + k for k in range(3)])
        fb = Batch(Mode("DECODE"), torch.arange(3), positions, list(rids), 3)
        sized = 12 <= n <= 20

        def forward(r: Any, b: Batch, sized: bool = sized) -> Output:
            k_rows = torch.zeros(3, 1, 4)
            hooks.after_set_kv_buffer(None, object(), object(), torch.arange(3), k_rows, k_rows)
            if sized:
                b.original_global_num_tokens_cpu = [3, 5]  # type: ignore[attr-defined]
                b.global_num_tokens_cpu = [5, 5]  # type: ignore[attr-defined]
                b.global_dp_buffer_len = 10  # type: ignore[attr-defined]
                b.dp_padding_mode = types.SimpleNamespace(name="MAX_LEN")  # type: ignore[attr-defined]
            return Output(can_run_graph=False, logits=mlp(torch.ones(10 if sized else 3, 8)))

        hooks.around_model_runner_forward(forward, runner, fb)
    return n


@pytest.mark.parametrize("timing", [False, True], ids=["untimed", "timed"])
def test_eager_decode_steps_with_an_attention_dp_buffer_leave_the_short_path(
        tmp_path: Path, monkeypatch: MP, timing: bool) -> None:
    """An eager step whose forward sized an attention-DP buffer does not go on its run by the short
    path: it ends by the general end, which records the buffer on the step's own line, the bytes
    the general path writes."""
    general, short = _by_each_path(tmp_path, monkeypatch, _eager_decodes_with_a_dp_buffer, timing)
    assert short.general_ends < general.steps / 2
    assert short.text == general.text
    steps = [r for r in read_records(tmp_path / "short" / "rank0.jsonl")[0] if isinstance(r, Step)]
    assert [s.step for s in steps if s.dp_buffer is not None] == list(range(12, 21))


@pytest.mark.parametrize("timing", [False, True], ids=["untimed", "timed"])
def test_eager_decode_steps_by_the_short_path_write_the_bytes_the_general_path_writes(
        tmp_path: Path, monkeypatch: MP, timing: bool) -> None:
    """An eager decode step of positions alone that goes on the run the last step went on takes the
    short path too (its inner hooks fill the draft as under the general begin); the rank file is
    the same, byte for byte, and the short path carries most of the steps."""
    general, short = _by_each_path(tmp_path, monkeypatch, _eager_decodes_and_turns, timing)
    steps = general.steps
    assert general.general_ends == steps - 1  # every step but the one that raised ends by the general path
    assert short.general_ends < steps / 4
    assert short.text == general.text
    recs = read_records(tmp_path / "short" / "rank0.jsonl")[0]
    assert len([r for r in recs if isinstance(r, Step)]) == steps - 1
    assert len([r for r in recs if isinstance(r, Step) and r.kv_read]) >= 8  # every 32nd step's reads
    counts = {(g.event, g.phase): g.count for g in recs if isinstance(g, Graph)}
    assert counts == {("eager", "decode"): steps - 2, ("replay", "decode"): 1}
    if timing:  # each step that returned counted once, whichever path it took
        assert general.cost[1] == short.cost[1] == steps - 1


def test_an_idle_schedulers_loop_sends_and_finishes_the_batch_its_last_steps_left(
        tmp_path: Path, monkeypatch: MP) -> None:
    """D114: no probe thread finishes a busy engine's records; when the engine goes idle, SGLang's
    scheduler keeps calling the pool hook every loop iteration, whose chores send and finish the
    batch being filled once it waited IDLE_S, on the engine's thread."""
    from cptest.probe import pool_hooks
    from cptest.probe.pool_hooks import PoolSampler

    now = [50.0]
    p = Probe(tmp_path, clock=lambda: now[0], graph_flush_s=1e9)
    p._start_watchdog = lambda: None  # type: ignore[method-assign]  # the engine's thread alone
    runtime.set_probe(p)
    monkeypatch.setattr(pool_hooks, "_SAMPLER", PoolSampler(every=1_000))
    try:
        _fake_parallel_state(monkeypatch, 0)
        hooks.after_initialize_model_parallel(None)
        for i in range(3):  # fewer than a batch: it stays open when the requests end
            fb = Batch(Mode("DECODE"), torch.arange(2), torch.tensor([9 + i, 4 + i]), ["a", "b"], 2)
            hooks.around_model_runner_forward(lambda r, b: Output(can_run_graph=False), Runner(), fb)
            now[0] += 0.004
        alloc = types.SimpleNamespace(size=64, available_size=lambda: 64)
        idle = types.SimpleNamespace(running_batch=None, batch_to_run=None)
        sched = types.SimpleNamespace(token_to_kv_pool_allocator=alloc, waiting_queue=[], forward_ct=3)
        path = tmp_path / "rank0.jsonl"

        def steps_on_disk() -> list[int]:
            return [r.step for r in read_records(path)[0] if isinstance(r, Step)] if path.exists() else []

        pool_hooks.after_get_next_batch_to_run(idle, sched)  # idle, but the batch is not old yet
        assert steps_on_disk() == [] and p.copies is not None
        for _ in range(10):  # the loop goes on idle, one iteration a millisecond here
            now[0] += 0.02
            pool_hooks.after_get_next_batch_to_run(idle, sched)
        assert steps_on_disk() == [1, 2, 3] and not p._pending
    finally:
        runtime.set_probe(None)
        p.close()


def _busy_then_idle(tmp_path: Path, monkeypatch: MP,
                    busy_s: float) -> tuple[list[int], list[int], float, float]:
    """Decode steps every 10 ms for `busy_s`, the pool hook (and so the chores) between them, then
    the idle loop for 0.5 s. Returns the steps on disk when the steps stopped, the steps on disk at
    the end, the clock of the last step, and the clock at which the steps reached the disk."""
    from cptest.probe import pool_hooks
    from cptest.probe.pool_hooks import PoolSampler

    now = [50.0]
    p = Probe(tmp_path, clock=lambda: now[0], graph_flush_s=1e9)
    p._start_watchdog = lambda: None  # type: ignore[method-assign]  # the engine's thread alone
    runtime.set_probe(p)
    monkeypatch.setattr(pool_hooks, "_SAMPLER", PoolSampler(every=1_000))
    path = tmp_path / "rank0.jsonl"

    def steps_on_disk() -> list[int]:
        return [r.step for r in read_records(path)[0] if isinstance(r, Step)] if path.exists() else []

    try:
        _fake_parallel_state(monkeypatch, 0)
        hooks.after_initialize_model_parallel(None)
        alloc = types.SimpleNamespace(size=64, available_size=lambda: 64)
        loop = types.SimpleNamespace(running_batch=None, batch_to_run=None)
        sched = types.SimpleNamespace(token_to_kv_pool_allocator=alloc, waiting_queue=[], forward_ct=0)
        for i in range(round(busy_s / 0.01)):
            fb = Batch(Mode("DECODE"), torch.arange(2), torch.tensor([9 + i, 4 + i]), ["a", "b"], 2)
            hooks.around_model_runner_forward(lambda r, b: Output(can_run_graph=False), Runner(), fb)
            last = now[0]
            now[0] += 0.005
            pool_hooks.after_get_next_batch_to_run(loop, sched)
            now[0] += 0.005
            pool_hooks.after_get_next_batch_to_run(loop, sched)
        busy = steps_on_disk()
        landed = None
        for _ in range(100):
            now[0] += 0.005
            pool_hooks.after_get_next_batch_to_run(loop, sched)
            if landed is None and len(steps_on_disk()) == round(busy_s / 0.01):
                landed = now[0]
        assert landed is not None and not p._pending
        return busy, steps_on_disk(), last, landed
    finally:
        runtime.set_probe(None)
        p.close()


def test_a_busy_engines_chores_leave_the_batch_being_filled_to_its_steps(tmp_path: Path,
                                                                         monkeypatch: MP) -> None:
    """While steps keep joining the batch being filled, the chores leave it open past IDLE_S
    (its steps close it at `Probe.copy_within_s`); once they stop, it is sent IDLE_S after the last
    step, not after the first, and finished on a later iteration of the idle loop."""
    busy_s = 0.3  # over IDLE_S, under the copy bound
    assert runtime.IDLE_S < busy_s < runtime.COPY_WITHIN_S - runtime.IDLE_S
    busy, done, last, landed = _busy_then_idle(tmp_path, monkeypatch, busy_s)
    assert busy == []
    assert done == list(range(1, 31))
    assert last + runtime.IDLE_S <= landed <= last + runtime.IDLE_S + 2 * runtime.CHORES_S


def test_a_busy_engines_batch_closes_at_its_copy_bound(tmp_path: Path, monkeypatch: MP) -> None:
    """Steps that keep coming send their batch once its first step is `Probe.copy_within_s` old: a
    busy rank's records reach the file within that bound, however long the decode lasts."""
    busy, done, _, _ = _busy_then_idle(tmp_path, monkeypatch, 1.2)
    assert busy and busy == list(range(1, len(busy) + 1))
    first_batch = round(runtime.COPY_WITHIN_S / 0.01)
    assert first_batch <= len(busy) < 120 and done == list(range(1, 121))


@pytest.mark.parametrize("replay", [True, False])
def test_a_batch_closes_at_its_probes_own_step_bound(probe: Probe, monkeypatch: MP, replay: bool) -> None:
    """`Probe.copy_every` (CPTEST_PROBE_COPY_EVERY) decides how many steps a batch holds, on the
    short path of replays and on the general one alike."""
    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    probe.copy_every = 8
    runner = GraphedRunner(decode_cuda_graph_runner=GraphRunner(bs=4))
    rids = ["a", "b", "c", "d"]
    for i in range(3 * 8 + 2):
        fb = Batch(Mode("DECODE"), torch.arange(4), torch.arange(4) + 9 + i, rids, 4)
        hooks.around_model_runner_forward(lambda r, b: Output(can_run_graph=replay), runner, fb)
    probe.flush()
    lines = [json.loads(x) for x in (probe.out_dir / "rank0.jsonl").read_text().splitlines()]
    assert [len(x["step"]) for x in lines if x["kind"] == "steps"] == [8, 8, 8, 2]


@pytest.mark.parametrize("replay", [True, False])
def test_a_batch_of_many_requests_closes_at_its_rows_so_its_line_stays_short(
        probe: Probe, monkeypatch: MP, replay: bool) -> None:
    """A run's `steps` line grows with its steps times its requests: a batch closes once its runs
    hold COPY_ROWS rows, before COPY_EVERY steps, so the line stays far inside the longest that
    cptest reads (`bounds.EVIDENCE.line`), whichever path the steps took (the short path of
    replays, `join_run`, `CopyBatch.add`)."""
    from cptest.bounds import EVIDENCE

    _fake_parallel_state(monkeypatch, 0)
    hooks.after_initialize_model_parallel(None)
    n = 1024
    per_batch = copy_batches.COPY_ROWS // n
    assert per_batch < copy_batches.COPY_EVERY
    runner = GraphedRunner(decode_cuda_graph_runner=GraphRunner(bs=n))
    rids = [f"r{i}" for i in range(n)]
    for i in range(per_batch + 5):
        fb = Batch(Mode("DECODE"), torch.arange(n), torch.arange(n) + 9 + i, rids, n)
        hooks.around_model_runner_forward(lambda r, b: Output(can_run_graph=replay), runner, fb)
    probe.flush()
    lines = [json.loads(x) for x in (probe.out_dir / "rank0.jsonl").read_text().splitlines()]
    blocks = [len(x["step"]) for x in lines if x["kind"] == "steps"]
    assert blocks[0] == per_batch and sum(blocks) == per_batch + 5
    longest = max(len(x) for x in (probe.out_dir / "rank0.jsonl").read_bytes().splitlines())
    assert EVIDENCE.line is not None and longest < EVIDENCE.line / 4
