"""The position ranges and slot runs that records carry: from ARRAY_FROM values a run of consecutive
positions is found at once and slot runs are cut with numpy (a prefill's thousands of positions),
and both must equal what the per-value loop makes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cptest import record_base
from cptest.record_base import ARRAY_FROM, ranges_from, slot_runs_from, slot_runs_of

INT64 = st.integers(min_value=-(2**62), max_value=2**62)
SMALL = st.integers(min_value=-3, max_value=40)


def _loop_ranges(values: list[int]) -> list[tuple[int, int]]:
    """`ranges_from` with ARRAY_FROM out of reach: the loop over each value alone."""
    kept = record_base.ARRAY_FROM
    record_base.ARRAY_FROM = 1 << 62
    try:
        return ranges_from(values)
    finally:
        record_base.ARRAY_FROM = kept


@st.composite
def _nearly_consecutive(draw: Any) -> list[int]:
    """A run of consecutive values, as a prefill's positions are, often broken in one place: a
    value repeated, dropped, replaced or moved (each keeps or changes the first and last)."""
    start = draw(st.one_of(SMALL, INT64))
    values = list(range(start, start + draw(st.integers(ARRAY_FROM - 2, 3 * ARRAY_FROM))))
    i = draw(st.integers(0, len(values) - 1))
    change = draw(st.sampled_from(["none", "repeat", "drop", "replace", "move"]))
    if change == "repeat":
        values.insert(i, values[i])
    elif change == "drop":
        del values[i]
    elif change == "replace":
        values[i] = draw(st.one_of(SMALL, INT64))
    elif change == "move":
        values.insert(draw(st.integers(0, len(values) - 1)), values.pop(i))
    return values


@settings(max_examples=400)
@given(st.one_of(st.lists(st.one_of(SMALL, INT64), max_size=3 * ARRAY_FROM), _nearly_consecutive()))
def test_ranges_from_equals_the_loop_whatever_the_values(values: list[int]) -> None:
    expected = _loop_ranges(values)
    assert ranges_from(values) == expected
    assert ranges_from(iter(values)) == expected  # an iterator is taken whole first
    assert ranges_from(tuple(values)) == expected


@settings(max_examples=300)
@given(st.lists(st.tuples(SMALL, SMALL), min_size=0, max_size=3 * ARRAY_FROM))
def test_slot_runs_of_equals_the_pairs_loop_whatever_the_rows(pairs: list[tuple[int, int]]) -> None:
    """Negative positions are rows not written here; repeated pairs count once; a repeated position
    with another row is kept, sorted as tuples sort."""
    positions = [p for p, _ in pairs]
    slots = [s for _, s in pairs]
    expected = slot_runs_from((p, s) for p, s in pairs if p >= 0)
    assert slot_runs_of(positions, slots) == expected
    assert slot_runs_of(np.asarray(positions), np.asarray(slots)) == expected
    assert record_base._slot_runs_array(positions, slots) == expected  # whatever the count


@settings(max_examples=300)
@given(_nearly_consecutive(), _nearly_consecutive())
def test_slot_runs_of_equals_the_pairs_loop_for_nearly_one_allocation(positions: list[int],
                                                                      slots: list[int]) -> None:
    """A prefill's positions and pool rows, each one run or broken in one place."""
    n = min(len(positions), len(slots))
    positions, slots = positions[:n], slots[:n]
    assert slot_runs_of(positions, slots) == slot_runs_from(
        (p, s) for p, s in zip(positions, slots, strict=True) if p >= 0)


def test_a_prefill_of_contiguous_rows_is_one_run_and_one_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """From ARRAY_FROM values, neither takes each value in turn: the sort below is never asked."""
    n = 4 * ARRAY_FROM
    positions = list(range(17, 17 + n))
    monkeypatch.setattr(record_base, "sorted", _no_sort, raising=False)
    assert ranges_from(positions) == [(17, 17 + n)]
    assert slot_runs_of(positions, list(range(900, 900 + n))) == [(17, 17 + n, 900)]
    # a DCP rank's share: every other position, in consecutive rows of its pool, is still one run
    mine = [p if p % 2 == 0 else -1 for p in positions]
    assert slot_runs_of(mine, [900 + i // 2 for i in range(n)]) == [(18, 17 + n, 900)]
    with pytest.raises(AssertionError, match="per value"):
        ranges_from(positions[:ARRAY_FROM - 1])  # below it, the loop
    with pytest.raises(AssertionError, match="per value"):
        slot_runs_of(positions[:ARRAY_FROM - 1], positions[:ARRAY_FROM - 1])


def _no_sort(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("sorted per value")


def test_values_beyond_int64_are_cut_exactly_too() -> None:
    """numpy cannot hold them: slot runs go by the loop, ranges by the one-run check."""
    big = [2**70 + 2 * i for i in range(ARRAY_FROM)]
    assert slot_runs_of(big, big) == slot_runs_from(zip(big, big, strict=True))
    assert ranges_from([2**70 + i for i in range(ARRAY_FROM)]) == [(2**70, 2**70 + ARRAY_FROM)]
