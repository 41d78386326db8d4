"""cptest/probe/records.py: plain values in, evidence records out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cptest.evidence import Graph, ProbeNote, RankId, parse_record
from cptest.probe import records
from cptest.probe.records import GraphCounter, StepDraft

RANK = RankId(world=1, tp=1, dcp=1)
RANK_JSON = RANK.model_dump_json()


@dataclass
class G:
    ranks: list[int]
    rank_in_group: int
    world_size: int = field(init=False)

    def __post_init__(self) -> None:
        self.world_size = len(self.ranks)


def test_geometry_of_tp2_dcp2_rank1_names_its_groups_and_ranks() -> None:
    groups = {"world": G([0, 1], 1), "tp": G([0, 1], 1), "dcp": G([0, 1], 1), "attn_cp": G([1], 0),
              "attn_tp": G([0, 1], 1), "pp": G([1], 0)}
    rank, geo = records.geometry(world_rank=1, groups=groups, pid=42, gpu=1, hostname="h", t=0.5)
    assert rank == RankId(world=1, tp=1, dcp=1, attn_cp=0, attn_tp=1, attn_dp=0, pid=42)
    assert geo.sizes == {"world": 2, "tp": 2, "dcp": 2, "attn_cp": 1, "attn_tp": 2, "pp": 1, "attn_dp": 1}
    assert geo.groups["dcp"] == [0, 1]
    assert parse_record(geo.model_dump_json()) == geo


def test_geometry_without_a_dcp_group_records_dcp_size_one_and_this_rank_alone() -> None:
    groups = {"world": G([0, 1, 2, 3], 3), "tp": G([0, 1, 2, 3], 3), "dcp": None,
              "attn_cp": G([1, 3], 1), "attn_tp": G([2, 3], 1)}
    rank, geo = records.geometry(world_rank=3, groups=groups, pid=1, gpu=None, hostname="", t=0)
    assert geo.sizes["dcp"] == 1 and geo.groups["dcp"] == [3]
    assert (rank.attn_cp, rank.attn_tp, rank.attn_dp) == (1, 1, 0)


def test_attn_dp_rank_is_derived_from_the_tp_rank_layout() -> None:
    # tp=8, attn_dp=2, attn_cp=2, attn_tp=2: tp rank 5 = (1*2 + 0)*2 + 1
    groups = {"world": G(list(range(8)), 5), "tp": G(list(range(8)), 5), "attn_cp": G([5, 7], 0),
              "attn_tp": G([4, 5], 1)}
    rank, geo = records.geometry(world_rank=5, groups=groups, pid=1, gpu=5, hostname="", t=0)
    assert rank.attn_dp == 1 and geo.sizes["attn_dp"] == 2


def test_unknown_forward_modes_are_other() -> None:
    assert records.mode_of("DECODE") == "decode"
    assert records.mode_of("TARGET_VERIFY") == "other"


def test_kv_pool_dtype_drops_the_torch_prefix() -> None:
    rec = records.kv_pool(rank=RANK, t=0, rows=1000, allocator_size=2000, page_size=1, allocator_page_size=2,
                          head_num=1, head_dim=64, layer_num=4, dtype="torch.bfloat16")
    assert rec.dtype == "bfloat16" and rec.allocator_size == 2000


def test_zigzag_local_positions_are_assigned_to_their_requests() -> None:
    # cp=2, two requests of 8 and 4 tokens -> 4 blocks each; rank 0 takes blocks 0 and 3 of each.
    split_list = [2, 2, 2, 2, 1, 1, 1, 1]
    zigzag_index = [0, 4, 3, 7]  # rank 0: block 0 of each, then block 3 of each (zigzag.py:172-180)
    local = [0, 1, 0, 6, 7, 3]
    out = records.split_zigzag_local(local, split_list, zigzag_index, ["a", "b"])
    assert out == {"a": [0, 1, 6, 7], "b": [0, 3]}


def test_zigzag_positions_that_do_not_fit_the_metadata_give_none() -> None:
    assert records.split_zigzag_local([0, 1], [2, 2, 2, 2], [0, 3], ["a"]) is None


def _draft(**kw: object) -> StepDraft:
    base: dict[str, object] = dict(step=3, mode="extend", batch_size=2, rows_in=6, rids=["a", "b"],
                                   extend_lens=[4, 2], prefix_lens=[0, 0], cp_configured=False)
    base.update(kw)
    return StepDraft(**base)  # type: ignore[arg-type]


def test_dcp_step_records_only_positions_whose_owner_mask_is_true() -> None:
    positions = [0, 1, 2, 3, 0, 1]
    mask = [p % 2 == 1 for p in positions]  # dcp=2, dcp_rank=1
    step = records.finish_step(_draft(kv_rows=6, kv_mask=mask, attn_rows_seen=6), rank=RANK, t=1.0,
                               positions=positions)
    assert step.kv_written == {"a": [(1, 2), (3, 4)], "b": [(1, 2)]}
    assert step.seq_positions == {"a": [(0, 4)], "b": [(0, 2)]}
    assert step.attn_rows == 6 and step.cp_active is False


def test_a_write_of_the_whole_batch_without_mask_records_every_position() -> None:
    step = records.finish_step(_draft(kv_rows=6), rank=RANK, t=0, positions=[5, 6, 7, 8, 0, 1])
    assert step.kv_written == {"a": [(5, 9)], "b": [(0, 2)]}


def test_a_write_that_does_not_match_the_batch_leaves_kv_written_empty_with_a_note() -> None:
    d = _draft(kv_rows=3)
    step = records.finish_step(d, rank=RANK, t=0, positions=[0, 1, 2, 3, 0, 1])
    assert step.kv_written == {}
    assert any("does not match" in n for n in d.notes)


def test_no_kv_write_seen_is_noted_not_guessed() -> None:
    d = _draft()
    step = records.finish_step(d, rank=RANK, t=0, positions=[0, 1, 2, 3, 0, 1])
    assert step.kv_written == {} and any("no KV write" in n for n in d.notes)


def test_attn_rows_are_unknown_without_the_attention_forward_hook() -> None:
    step = records.finish_step(_draft(kv_rows=6), rank=RANK, t=0, positions=[0, 1, 2, 3, 0, 1])
    assert step.attn_rows is None


def test_decode_batch_has_one_row_per_request() -> None:
    d = _draft(mode="decode", rows_in=2, extend_lens=None, prefix_lens=None, kv_rows=2)
    step = records.finish_step(d, rank=RANK, t=0, positions=[10, 4])
    assert step.seq_positions == {"a": [(10, 11)], "b": [(4, 5)]}
    assert step.extend_lens == []


def test_pcp_step_uses_the_logical_rows_and_observed_local_positions_of_this_rank() -> None:
    d = _draft(cp_configured=True, cp_active=True, cp_rank=1, cp_logical_rows=[3, 3],
               cp_local_positions={"a": [1, 2], "b": [1]}, kv_rows=6, attn_rows_seen=4)
    step = records.finish_step(d, rank=RANK, t=0, positions=[0, 1, 2, 3, 0, 1])
    assert step.attn_rows == 3  # logical, not the padded 4 rows the layer saw
    assert step.cp_active is True
    assert step.seq_positions == {"a": [(1, 3)], "b": [(1, 2)]}
    assert step.positions == [(1, 3)]
    assert step.kv_written == {"a": [(0, 4)], "b": [(0, 2)]}


def test_pcp_configured_but_not_applied_is_cp_inactive() -> None:
    step = records.finish_step(_draft(cp_configured=True, kv_rows=6), rank=RANK, t=0,
                               positions=[0, 1, 2, 3, 0, 1])
    assert step.cp_active is False


def test_cp_state_unknown_when_the_cp_module_was_not_seen() -> None:
    step = records.finish_step(_draft(cp_configured=None, kv_rows=6), rank=RANK, t=0,
                               positions=[0, 1, 2, 3, 0, 1])
    assert step.cp_active is None


def test_graph_counter_flushes_deltas_and_then_starts_again() -> None:
    c = GraphCounter(last_flush=0.0)
    for _ in range(3):
        c.add("replay", "decode")
    c.add("eager", "prefill")
    assert not c.due(0.5, 1.0) and c.due(1.0, 1.0)
    recs = [parse_record(records.late_line(g, 0.0)) for g in c.flush_late(RANK_JSON, 1.0)]
    assert {(r.event, r.phase, r.count) for r in recs} == {("replay", "decode", 3), ("eager", "prefill", 1)}
    assert not c.due(5.0, 1.0)


@pytest.mark.parametrize("clock", [1000.0, 1000.000123, 1001.5, 13345.678901])
def test_graph_counts_made_late_are_the_records_json(clock: float) -> None:
    """The chores keep the graph counts as tuples, made into their lines when written
    (`graph_count_late`, `late_line`): the text of each `Graph`'s `model_dump_json()` at the same
    `t`, which reads back as that record."""
    c = GraphCounter(last_flush=0.0)
    for _ in range(3):
        c.add("replay", "decode")
    c.add("eager", "prefill")
    late = c.flush_late(RANK_JSON, clock)
    t = round(clock - 1000.0, 6)
    want = [Graph(t=t, rank=RANK, event="eager", phase="prefill", count=1),
            Graph(t=t, rank=RANK, event="replay", phase="decode", count=3)]
    assert [records.late_line(g, 1000.0) for g in late] == [g.model_dump_json() for g in want]
    assert c.pending == {} and c.flush_late(RANK_JSON, clock) == []


@settings(max_examples=300, deadline=None)
@given(message=st.text(), t=st.floats(min_value=0, max_value=1e6, allow_nan=False), level=st.sampled_from(
    ["info", "warning", "error"]))
def test_a_note_made_late_is_the_records_json(message: str, t: float, level: str) -> None:
    """The measuring's notes are made into their lines when written (`note_late`): the record the
    `ProbeNote` is, whatever the message holds, and its `model_dump_json()`'s very text from 0.1 ms
    after the probe's start (before, Python writes the time as 6.1e-05 where pydantic writes
    0.000061, as for every line the probe makes without pydantic)."""
    late = records.note_late(RANK.model_dump_json(), 1000.0 + t, message, level)
    note = ProbeNote(t=round(1000.0 + t - 1000.0, 6), rank=RANK, level=level, message=message)  # type: ignore[arg-type]
    line = records.late_line(late, 1000.0)
    assert parse_record(line) == note
    if note.t >= 1e-4:
        assert line == note.model_dump_json()


def test_graph_counts_made_while_another_thread_flushes_are_all_written_once() -> None:
    # The engine's thread counts without a lock while the writer flushes: every count must land in
    # exactly one flush (none lost, none twice).
    import threading

    c = GraphCounter(last_flush=0.0)
    n = 200_000
    flushed: list[int] = []
    done = threading.Event()

    def flusher() -> None:
        while not done.is_set():
            flushed.extend(g[-1] for g in c.flush_late(RANK_JSON, 1.0))  # each record's count

    t = threading.Thread(target=flusher)
    t.start()
    for i in range(n):
        c.add("eager" if i % 3 else "replay", "decode")
    done.set()
    t.join()
    flushed.extend(g[-1] for g in c.flush_late(RANK_JSON, 2.0))
    assert sum(flushed) == n and all(k > 0 for k in flushed)
    assert c.pending == {} and c.flush_late(RANK_JSON, 3.0) == []


def test_eager_runner_bound_to_a_phase_means_its_graph_is_disabled() -> None:
    g = records.graph_capture(rank=RANK, t=0, phase="decode", runner_kind="EagerRunner", batch_sizes=None)
    assert g.event == "disabled"
    g = records.graph_capture(rank=RANK, t=0, phase="decode", runner_kind="DecodeCudaGraphRunner",
                              batch_sizes=[4, 1, 2])
    assert (g.event, g.batch_sizes) == ("capture", [1, 2, 4])


@settings(max_examples=400, deadline=None)
@given(
    positions=st.lists(st.integers(0, 5000), min_size=0, max_size=40),
    mask_kind=st.sampled_from(["owner", "none", "short", "unseen"]),
    dcp=st.integers(1, 4),
    mode=st.sampled_from(["decode", "extend", "mixed"]),
    rid_alphabet=st.sampled_from(["0123456789abcdef", 'ab"\\\n\u00e9-_']),
    repeat_rid=st.booleans(),
    cp_configured=st.sampled_from([None, False, True]),
    extend_len=st.integers(1, 2),
    t=st.floats(0, 1e6, allow_nan=False),
)
def test_the_line_the_probe_writes_is_the_record_finish_step_makes(
    positions: list[int], mask_kind: str, dcp: int, mode: str, rid_alphabet: str, repeat_rid: bool,
    cp_configured: bool | None, extend_len: int, t: float,
) -> None:
    """Most steps take a shortcut to their JSON line on the engine's thread; it must not change a thing."""
    n = len(positions)
    a = rid_alphabet
    rids = ["".join(a[(i * 7 + k) % len(a)] for k in range(5)) + str(i) for i in range(n)]
    if repeat_rid and n > 1:
        rids[-1] = rids[0]
    mask = {"owner": [p % dcp == 0 for p in positions], "none": None, "short": [True] * (n - 1) or None,
            "unseen": None}[mask_kind]
    kv_rows = None if mask_kind == "unseen" else n

    def draft() -> StepDraft:
        lens = [extend_len] * n if mode != "decode" else None
        return _draft(mode=mode, batch_size=n, rows_in=n, rids=list(rids), kv_rows=kv_rows, kv_mask=mask,
                      extend_lens=lens, prefix_lens=[7] * n if mode != "decode" else None, attn_rows_seen=n,
                      cp_configured=cp_configured)

    want_draft, line_draft = draft(), draft()
    want = records.finish_step(want_draft, rank=RANK, t=t, positions=positions)
    line = records.finish_step_line(line_draft, rank=RANK, rank_json=RANK.model_dump_json(), t=t,
                                    positions=positions)
    assert parse_record(line) == want
    assert line_draft.notes == want_draft.notes


def test_a_decode_step_of_hex_request_ids_takes_the_shortcut(monkeypatch: Any) -> None:
    draft = _draft(mode="decode", batch_size=2, rows_in=2, rids=["9f0a", "c1"], kv_rows=2,
                   kv_mask=[True, False], extend_lens=None, prefix_lens=None)

    def general(*_a: object, **_k: object) -> None:
        raise AssertionError("took the general path")

    monkeypatch.setattr(records, "finish_step", general)
    line = records.finish_step_line(draft, rank=RANK, rank_json=RANK.model_dump_json(), t=2.0,
                                    positions=[8, 3])
    step = parse_record(line)
    assert step.kv_written == {"9f0a": [(8, 9)], "c1": []}  # type: ignore[union-attr]
    assert step.positions == [(3, 4), (8, 9)]  # type: ignore[union-attr]


def test_request_id_text_is_reused_only_while_the_ids_stay_the_same() -> None:
    text = records.RidText()
    ids = ["9f", "a0"]
    assert text.of(ids) == '9f","a0'
    assert text.of(list(ids)) == '9f","a0'
    ids.append('x"y')  # a caller changing its own list must not leave a stale text behind
    assert text.of(ids) is None
    assert text.of(["c1"]) == "c1"


def test_request_ids_that_are_not_strings_are_written_as_strings() -> None:
    draft = _draft(mode="decode", batch_size=2, rows_in=2, rids=[7, 8], kv_rows=2, kv_mask=None,
                   extend_lens=None, prefix_lens=None)
    line = records.finish_step_line(draft, rank=RANK, rank_json=RANK.model_dump_json(), t=0.0,
                                    positions=[3, 4])
    assert parse_record(line).seq_positions == {"7": [(3, 4)], "8": [(4, 5)]}  # type: ignore[union-attr]


def test_a_stride_split_is_read_per_request_by_packed_index() -> None:
    # cp 3, rank 2: packed tokens 2, 5, 8 of requests of 4, 2 and 5 tokens (ends 4, 6, 11)
    got = records.split_stride_local([12, 40, 72], 2, 3, ["a", "b", "c"], [4, 2, 5])
    assert got == {"a": [12], "b": [40], "c": [72]}
    assert records.split_stride_local([1, 2, 3, 4], 2, 3, ["a"], [10]) is None  # packed 11 is past the batch
    assert records.split_stride_local([1], 3, 3, ["a"], [10]) is None  # no such rank
    layout = records.StrideLayout(0, 2)
    assert records.split_local([0, 2], layout, ["a"], [4]) == {"a": [0, 2]}
    assert records.split_local([0, 2], layout, ["a"], None) is None  # the batch's lengths unread
