"""cptest/reference/scheduler.py: continuous batching and capacity accounting."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cptest.reference.scheduler import Request, Scheduler


def test_capacity_is_blocks_times_block_tokens() -> None:
    assert Scheduler(total_blocks=100, block_tokens=4).capacity == 400


def test_a_request_that_can_never_fit_is_refused_at_submission() -> None:
    s = Scheduler(total_blocks=4, block_tokens=2)
    why = s.submit(Request("a", [1] * 8, max_new_tokens=4))
    assert why is not None and "capacity 8" in why
    assert s.idle()


def test_new_requests_are_extended_while_running_ones_wait_then_decode_together() -> None:
    s = Scheduler(total_blocks=100, block_tokens=1)
    s.submit(Request("a", [1, 2], 3))
    b = s.next_batch()
    assert b is not None and b.extend and [r.rid for r in b.requests] == ["a"]
    s.submit(Request("b", [1], 3))
    b = s.next_batch()
    assert b is not None and b.extend and [r.rid for r in b.requests] == ["b"]
    b = s.next_batch()
    assert b is not None and not b.extend and [r.rid for r in b.requests] == ["a", "b"]


def test_admission_waits_for_free_blocks() -> None:
    s = Scheduler(total_blocks=4, block_tokens=2)
    a, b = Request("a", [1] * 4, 2), Request("b", [1] * 4, 2)
    s.submit(a)
    s.submit(b)
    assert [r.rid for r in s.next_batch().requests] == ["a"]  # type: ignore[union-attr]
    assert not s.next_batch().extend  # type: ignore[union-attr]
    s.finish(a)
    assert [r.rid for r in s.next_batch().requests] == ["b"]  # type: ignore[union-attr]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20), st.integers(1, 6), st.booleans()), min_size=1, max_size=12))
def test_no_block_leaks_whatever_finishes_or_aborts(reqs: list[tuple[int, int, bool]]) -> None:
    s = Scheduler(total_blocks=30, block_tokens=2, max_running=4)
    for i, (n, m, _) in enumerate(reqs):
        s.submit(Request(str(i), [1] * n, m))
    aborted = {str(i) for i, (_, _, ab) in enumerate(reqs) if ab}
    for _ in range(500):
        b = s.next_batch()
        if b is None:
            break
        for r in b.requests:
            if r.rid in aborted:
                s.abort(r.rid)
                continue
            r.output_ids.append(0)
            if len(r.output_ids) >= r.max_new_tokens:
                s.finish(r)
        assert s.leak_free()
    assert s.idle()
    assert len(s.free) == s.total_blocks
