"""cptest/evidence.py: the compact decode form of Step, as the probe writes it and readers see it,
and the fields of schema v6."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import pytest

from cptest.errors import EvidenceError
from cptest.evidence import Step, parse_record, ranges_minus, read_records, slot_pairs

BASE = {"v": 1, "kind": "step", "rank": {"world": 1}, "step": 4, "mode": "decode", "batch_size": 3,
        "rows_in": 3}


def _line(**extra: object) -> str:
    return json.dumps({**BASE, **extra})


def test_the_compact_form_reads_as_the_full_record() -> None:
    rows = {"rids": ["a", "b", "c"], "pos": [9, 7, 8], "kv": [1, 0, 1]}
    step = parse_record(_line(rows=rows))
    assert isinstance(step, Step)
    assert step.seq_positions == {"a": [(9, 10)], "b": [(7, 8)], "c": [(8, 9)]}
    assert step.kv_written == {"a": [(9, 10)], "b": [], "c": [(8, 9)]}
    assert step.positions == [(7, 10)]
    full = json.loads(step.model_dump_json())
    assert "rows" not in full and parse_record(json.dumps(full)) == step  # it round-trips as a full record


@pytest.mark.parametrize(("kv", "written"), [("all", {"a": [(2, 3)]}), (None, {})])
def test_kv_all_means_every_row_and_null_means_no_write_seen(kv: object, written: object) -> None:
    step = parse_record(_line(batch_size=1, rows_in=1, rows={"rids": ["a"], "pos": [2], "kv": kv}))
    assert step.kv_written == written  # type: ignore[union-attr]


@pytest.mark.parametrize("rows", [
    {"rids": ["a", "b"], "pos": [1], "kv": None},           # lengths differ
    {"rids": ["a", "a"], "pos": [1, 2], "kv": None},        # a request twice: not one row each
    {"rids": ["a"], "pos": [1], "kv": [1, 0]},              # owners for rows that do not exist
    {"rids": ["a"], "pos": [1], "kv": "some"},              # not a list, "all", digits or null
    {"rids": ["a"], "pos": [1], "kv": "2"},                 # digits other than 0/1
    {"rids": ["a"], "pos": "AQAA", "kv": None},             # packed, but 3 bytes: not whole int32s
    {"rids": ["a"], "pos": "not base64!", "kv": None},      # neither a list nor base64
    {"rids": ["a"], "pos": [1]},                            # kv missing
    [1, 2],                                                 # not an object
])
def test_a_malformed_compact_form_is_an_evidence_error(rows: object) -> None:
    with pytest.raises(EvidenceError):
        parse_record(_line(rows=rows))


def test_packed_positions_and_digit_owners_read_as_the_list_form() -> None:
    packed = base64.b64encode(struct.pack("<3i", 9, 7, 8)).decode()
    step = parse_record(_line(v=2, rows={"rids": ["a", "b", "c"], "pos": packed, "kv": "101"}))
    listed = parse_record(_line(rows={"rids": ["a", "b", "c"], "pos": [9, 7, 8], "kv": [1, 0, 1]}))
    assert isinstance(step, Step) and step.model_copy(update={"v": 1}) == listed


def test_the_compact_form_cannot_be_mixed_with_the_full_fields() -> None:
    with pytest.raises(EvidenceError):
        parse_record(_line(rows={"rids": ["a"], "pos": [1], "kv": None}, seq_positions={"a": [[1, 2]]}))


def _block(**extra: object) -> dict[str, object]:
    pos = base64.b64encode(struct.pack("<4i", 9, 7, 10, 8)).decode()  # two steps of requests a, b
    return {"v": 3, "kind": "steps", "t": [0.5, 0.75], "rank": {"world": 1}, "rids": ["a", "b"],
            "step": [4, 5], "rows_in": [2, 2], "attn_rows": [None, None], "ffn_rows": [2, 2],
            "logits_rows": [2, 2], "cp_active": False, "pos": pos, "kv": "1001", **extra}


def test_a_steps_block_reads_back_as_one_step_per_step(tmp_path: Path) -> None:
    f = tmp_path / "rank1.jsonl"
    f.write_text(json.dumps(_block()) + "\n" + _line(v=3, rows={"rids": ["c"], "pos": [3], "kv": None},
                                                     batch_size=1, rows_in=1) + "\n")
    recs, dropped = read_records(f)
    assert dropped == 0 and [type(r) for r in recs] == [Step, Step, Step]
    first, second = recs[0], recs[1]
    assert isinstance(first, Step) and isinstance(second, Step)
    assert (first.step, first.t, second.step, second.t) == (4, 0.5, 5, 0.75)
    assert first.seq_positions == {"a": [(9, 10)], "b": [(7, 8)]}
    assert second.seq_positions == {"a": [(10, 11)], "b": [(8, 9)]}
    assert first.kv_written == {"a": [(9, 10)], "b": []} and second.kv_written == {"a": [], "b": [(8, 9)]}
    assert (first.batch_size, first.ffn_rows, first.cp_active) == (2, 2, False)
    # the same two steps written one line each read back equal
    single = parse_record(_line(v=3, t=0.5, batch_size=2, rows_in=2, ffn_rows=2, logits_rows=2,
                                cp_active=False, rows={"rids": ["a", "b"], "pos": [9, 7], "kv": "10"}))
    assert first == single


@pytest.mark.parametrize("bad", [
    {"step": [4]},                                   # per-step fields of different lengths
    {"rids": ["a", "a"]},                            # a request twice
    {"pos": base64.b64encode(struct.pack("<3i", 1, 2, 3)).decode()},  # not one position per row
    {"kv": "10"},                                    # owners for half the rows
    {"kv": "1002"},                                  # digits other than 0/1
])
def test_a_malformed_steps_block_is_an_evidence_error(bad: dict[str, object]) -> None:
    with pytest.raises(EvidenceError):
        parse_record(json.dumps(_block(**bad)))


def test_a_block_of_a_newer_schema_is_refused() -> None:
    with pytest.raises(EvidenceError, match="newer"):
        parse_record(json.dumps(_block(v=99)))


def test_a_v6_block_gives_each_step_its_mlp_output_rows_and_the_blocks_layers(tmp_path: Path) -> None:
    f = tmp_path / "rank1.jsonl"
    f.write_text(json.dumps(_block(v=6, ffn_out_rows=[2, 1], layers=32)) + "\n")
    first, second = read_records(f)[0]
    assert isinstance(first, Step) and isinstance(second, Step)
    assert (first.ffn_out_rows, second.ffn_out_rows, first.layers, second.layers) == (2, 1, 32, 32)


def test_a_block_of_mlp_output_rows_not_one_per_step_is_an_evidence_error() -> None:
    with pytest.raises(EvidenceError):
        parse_record(json.dumps(_block(v=6, ffn_out_rows=[2], layers=32)))


def test_a_step_without_the_v6_fields_is_written_as_before_and_with_them_reads_back_equal() -> None:
    old = parse_record(_line(v=5, rows={"rids": ["a"], "pos": [3], "kv": "all"}, batch_size=1, rows_in=1))
    assert isinstance(old, Step)
    v6 = {"layers", "kv_slots", "kv_read", "ffn_out_rows", "layer_rows", "ffn_seq_positions"}
    assert not v6 & json.loads(old.model_dump_json()).keys()
    new = old.model_copy(update={"v": 6, "layers": 4, "ffn_out_rows": 1, "layer_rows": {"ffn": [1, 1, 2, 1]},
                                 "kv_slots": {"a": [(3, 4, 17)]}, "kv_read": {"a": [(0, 18)]},
                                 "ffn_seq_positions": {"a": [(0, 4)]}})
    assert parse_record(new.model_dump_json()) == new
    assert slot_pairs(new.kv_slots["a"], new.kv_written["a"]) == [(3, 17)]


def test_ranges_minus_keeps_what_the_taken_ranges_leave() -> None:
    assert ranges_minus([(0, 10), (20, 30)], [(2, 4), (8, 22), (29, 40)]) == [(0, 2), (4, 8), (22, 29)]
    assert ranges_minus([(0, 5)], []) == [(0, 5)]
    assert ranges_minus([(0, 5)], [(0, 5)]) == []
