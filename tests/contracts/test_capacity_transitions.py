"""Specifications of cptest/contracts/capacity_transitions.py, on hand-built evidence: a TP2/DCP2
server whose two ranks hold 1000 rows each (2000 logical tokens) and fill the pool to 95 % with a
request waiting, then drain."""

from __future__ import annotations

from typing import Any

from cptest.contracts.capacity_transitions import CapacityTransitionsParams, check
from cptest.evidence import (
    Evidence,
    KvPool,
    PoolSample,
    ProbeNote,
    RankEvidence,
    RequestResult,
    RoleEvidence,
    RunnerEvidence,
)
from cptest.testing.archives import rank_id
from cptest.topology import Degrees

P = CapacityTransitionsParams(group_size=2, peak=0.9)
ROWS, TOTAL = 1000, 2000
FILL = [  # (step, free, running, waiting): admissions and finishes throughout, the limit, the drain
    (0, 1500, 2, 0), (4, 600, 7, 0), (8, 100, 9, 1), (12, 100, 9, 1), (16, 900, 5, 0), (20, TOTAL, 0, 0),
]


def _samples(w: int, fill: list[tuple[int, int, int, int]], **over: Any) -> list[PoolSample]:
    return [PoolSample(rank=rank_id(w, dcp=2), step=step, total=TOTAL, free=free, running=run, waiting=wait,
                       scheduler_total=TOTAL, idle=run == 0 and wait == 0, **over)
            for step, free, run, wait in fill]


def _evidence(per_rank: dict[int, list[Any]], *, statuses: tuple[str, ...] = ("ok",) * 12,
              runner: bool = True) -> Evidence:
    ranks = {w: RankEvidence.of(w, [KvPool(rank=rank_id(w, dcp=2), rows=ROWS, allocator_size=TOTAL), *recs])
             for w, recs in per_rank.items()}
    reqs = [RequestResult(index=i, prompt_len=200, max_new_tokens=16, prompt_sha256="x", status=s,
                          error="engine crashed" if s == "error" else "")
            for i, s in enumerate(statuses)]
    role = RoleEvidence(role="main", world_size=2, degrees=Degrees(tp=2, dcp=2), engine="reference",
                        ranks=ranks, runner=RunnerEvidence.of(reqs) if runner else None)
    return Evidence(roles={"main": role}, requests=list(range(len(statuses))))


def _both(fill: list[tuple[int, int, int, int]] = FILL) -> dict[int, list[Any]]:
    return {0: _samples(0, fill), 1: _samples(1, fill)}


def test_a_pool_that_fills_past_the_peak_queues_and_drains_to_zero_passes() -> None:
    v = check(_evidence(_both()), P)
    assert v.status == "pass", v.reason
    assert v.figures["peak"] == 0.95
    assert v.figures["queued_at_limit"] == 4  # step 8 and 12 on both ranks
    assert v.figures["groups"] == [{"members": [0, 1], "common_samples": 6, "largest_spread": 0}]
    assert v.figures["per_rank"]["1"]["last_used"] == 0


def test_tokens_in_use_after_drain_are_leaked_rows_and_fail() -> None:
    leaky = [*FILL[:-1], (20, TOTAL - 32, 0, 0)]
    v = check(_evidence(_both(leaky)), P)
    assert v.status == "fail"
    assert v.reason.startswith("rank 0: 32 tokens still in use after drain")


def test_evictable_prefix_cache_tokens_after_drain_are_not_a_leak() -> None:
    cached = [*FILL[:-1], (20, TOTAL - 32, 0, 0)]
    ev = {w: [s.model_copy(update={"evictable": 32 if s.idle else 0}) for s in _samples(w, cached)]
          for w in (0, 1)}
    v = check(_evidence(ev), P)
    assert v.status == "pass", v.reason
    assert v.figures["per_rank"]["0"]["last_evictable"] == 32


def test_a_logical_total_that_is_not_group_times_rows_fails_at_every_sample() -> None:
    # sgl-project/sglang#32730's shape: a rank whose allocator counts its rows only.
    per_rank = _both()
    per_rank[1] = [s.model_copy(update={"total": ROWS, "scheduler_total": ROWS, "free": min(s.free, ROWS)})
                   for s in per_rank[1]]
    v = check(_evidence(per_rank), P)
    assert v.status == "fail"
    assert v.reason.startswith("rank 1 step 0: the allocator's total is 1000 tokens, expected 2 x 1000 rows")
    assert v.figures["violation_count"] >= len(FILL)


def test_a_scheduler_total_other_than_the_allocators_fails() -> None:
    per_rank = _both()
    per_rank[0] = [s.model_copy(update={"scheduler_total": ROWS}) for s in per_rank[0]]
    v = check(_evidence(per_rank), P)
    assert v.status == "fail"
    assert "the scheduler counts a logical total of 1000 tokens, the allocator 2000" in v.reason


def test_group_members_that_drift_apart_at_one_step_fail() -> None:
    drift = [(s, f - 64 if s == 12 else f, r, w) for s, f, r, w in FILL]
    v = check(_evidence({0: _samples(0, FILL), 1: _samples(1, drift)}), P)
    assert v.status == "fail"
    assert v.reason.startswith("DCP group [0, 1] at step 12: ranks hold [1900, 1964] tokens, 64 apart")


def test_a_declared_slack_allows_that_drift() -> None:
    drift = [(s, f - 64 if s == 12 else f, r, w) for s, f, r, w in FILL]
    v = check(_evidence({0: _samples(0, FILL), 1: _samples(1, drift)}), P.model_copy(update={"slack": 64}))
    assert v.status == "pass", v.reason


def test_a_request_that_errors_while_the_pool_fills_fails() -> None:
    v = check(_evidence(_both(), statuses=("ok",) * 11 + ("error",)), P)
    assert v.status == "fail"
    assert v.reason.startswith("request 11 failed while the pool filled: engine crashed")


def test_a_pool_that_never_reaches_the_peak_is_unknown() -> None:
    low = [(s, max(f, 800), r, 0) for s, f, r, _ in FILL]
    v = check(_evidence(_both(low)), P)
    assert v.status == "unknown"
    assert v.reason.startswith("the pool peaked at 0.600 of its logical total, below the declared 0.9")


def test_a_last_sample_that_is_not_drained_is_unknown() -> None:
    v = check(_evidence(_both(FILL[:-1])), P)
    assert v.status == "unknown"
    assert "the drain was not observed" in v.reason


def test_a_rank_without_samples_is_unknown_with_the_probes_note() -> None:
    note = ProbeNote(rank=rank_id(1, dcp=2), level="warning",
                     message="pool samples off: SGLang's scheduler lacks 'forward_ct'")
    v = check(_evidence({0: _samples(0, FILL), 1: [note]}), P)
    assert v.status == "unknown"
    assert v.reason == ("no pool_sample record from rank 1 of main (pool samples off: SGLang's scheduler "
                        "lacks 'forward_ct')")


def test_a_missing_rank_is_unknown_never_fail() -> None:
    v = check(_evidence({0: _samples(0, FILL)}), P)
    assert v.status == "unknown"
    assert v.reason == "no evidence from rank 1 of main"


def test_no_runner_records_is_unknown() -> None:
    v = check(_evidence(_both(), runner=False), P)
    assert v.status == "unknown"
    assert v.reason.startswith("no runner records of main")
