"""cptest/evidence.py: the compact decode form of Step, as the probe writes it and readers see it."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from cptest.errors import EvidenceError
from cptest.evidence import Step, parse_record

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
