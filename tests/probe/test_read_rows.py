"""cptest/probe/records.py `read_rows`: every request's reads at once, against the rule written out
one position at a time (the rank's share is the positions p % dcp == dcp rank, each at pool row
`req_to_token[p] // dcp`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

np = pytest.importorskip("numpy")

from cptest.evidence import ranges_from  # noqa: E402
from cptest.probe.records import read_rows  # noqa: E402


def _one_at_a_time(rows: list[list[int]], lens: list[int], rids: list[str], dcp: int,
                   rank: int) -> dict[str, list[tuple[int, int]]]:
    out = {}
    for rid, row, length in zip(rids, rows, lens, strict=True):
        share = [row[p] // dcp if dcp > 1 else row[p] for p in range(length) if dcp == 1 or p % dcp == rank]
        if share:
            out[rid] = ranges_from(share)
    return out


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[list[int]], list[int], int, int]:
    n = draw(st.integers(1, 12))  # both ways: one at a time up to READ_ONE_AT_A_TIME, then all at once
    width = draw(st.integers(1, 40))
    dcp = draw(st.sampled_from((1, 2, 4, 8)))
    rank = draw(st.integers(0, dcp - 1))
    lens = draw(st.lists(st.integers(0, width), min_size=n, max_size=n))
    # pool rows: runs of consecutive slots (what a paged allocator hands out) and strays
    rows = []
    for _ in range(n):
        row: list[int] = []
        while len(row) < width:
            start, run = draw(st.integers(0, 500)), draw(st.integers(1, 12))
            row.extend(range(start, start + run))
        rows.append(row[:width])
    return rows, lens, dcp, rank


@settings(max_examples=300, deadline=None, derandomize=True)
@given(case=tables())
def test_every_request_at_once_reads_what_the_rule_gives_one_position_at_a_time(case) -> None:
    rows, lens, dcp, rank = case
    rids = [f"r{k}" for k in range(len(rows))]
    table = np.asarray(rows, dtype=np.int64).reshape(-1)
    assert read_rows(table, lens, rids, dcp, rank) == _one_at_a_time(rows, lens, rids, dcp, rank)


def test_a_negative_pool_row_is_read_exactly_too() -> None:
    rows = [[-3, 5, 6, 7], [9, 10, -1, 11]]
    table = np.asarray(rows, dtype=np.int64).reshape(-1)
    assert read_rows(table, [4, 3], ["a", "b"], 1, 0) == {"a": [(-3, -2), (5, 8)], "b": [(-1, 0), (9, 11)]}
    many = rows + [[20 + 4 * k, 21 + 4 * k, 22 + 4 * k, 23 + 4 * k] for k in range(10)]  # read all at once
    rids, lens = [f"r{k}" for k in range(len(many))], [4, 3] + [4] * 10
    table = np.asarray(many, dtype=np.int64).reshape(-1)
    assert read_rows(table, lens, rids, 2, 0) == _one_at_a_time(many, lens, rids, 2, 0)  # rows -2, -1


def test_rows_that_do_not_fit_the_lengths_are_noted_and_read_nothing() -> None:
    notes: list[str] = []
    assert read_rows(np.arange(10), [3, 4, 5], ["a", "b", "c"], 2, 0, notes.append) is None
    assert notes and "10 block-table values for 3 requests" in notes[0]
