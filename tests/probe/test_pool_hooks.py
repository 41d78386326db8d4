"""cptest/probe/pool_hooks.py: which scheduler iterations become pool samples, and what the SGLang
hook reads from a scheduler shaped like 0.5.17's (plain objects with the attributes it reads)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cptest.evidence import PoolSample, ProbeNote, RankId, read_records
from cptest.probe import pool_hooks, runtime
from cptest.probe.pool_hooks import PoolSampler
from cptest.probe.runtime import Probe

R = RankId(world=0)


def _offer(s: PoolSampler, step: int, free: int, running: int, waiting: int = 0) -> PoolSample | None:
    return s.offer(rank=R, t=0.0, step=step, total=100, free=free, evictable=None, protected=None,
                   running=running, waiting=waiting, scheduler_total=100)


def test_unchanged_figures_are_not_written_again() -> None:
    s = PoolSampler(every=1)
    assert _offer(s, 0, 100, 0) is not None
    assert _offer(s, 0, 100, 0) is None  # an idle loop spinning writes nothing


def test_busy_samples_are_at_least_every_steps_apart() -> None:
    s = PoolSampler(every=4)
    written = [step for step in range(12) if _offer(s, step, 100 - step, 1) is not None]
    assert written == [0, 4, 8]


def test_the_drained_sample_is_never_held_back() -> None:
    s = PoolSampler(every=4)
    assert _offer(s, 0, 50, 2) is not None
    rec = _offer(s, 1, 100, 0)  # one step later, but the scheduler drained
    assert rec is not None and rec.idle and rec.used == 0


def test_used_excludes_free_and_evictable_tokens() -> None:
    rec = PoolSample(rank=R, step=3, total=100, free=60, evictable=30, running=0, waiting=0)
    assert rec.used == 10


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Probe]:
    p = Probe(tmp_path)
    runtime.set_probe(p)
    p.set_rank(R)
    monkeypatch.setattr(pool_hooks, "_SAMPLER", PoolSampler(every=1))
    yield p
    p.close()
    runtime.set_probe(None)


class _Alloc:
    """The allocator's two figures the hook reads (mem_cache/allocator/base.py)."""

    def __init__(self, size: int, free: int) -> None:
        self.size, self.free = size, free

    def available_size(self) -> int:
        return self.free


def _scheduler(*, free: int, running: int, waiting: int, new: int = 0, tree: Any = None) -> tuple[Any, Any]:
    running_batch = SimpleNamespace(reqs=[object()] * running)
    plan = SimpleNamespace(running_batch=running_batch,
                           batch_to_run=SimpleNamespace(reqs=[object()] * new) if new else running_batch)
    sched = SimpleNamespace(token_to_kv_pool_allocator=_Alloc(1024, free), waiting_queue=[object()] * waiting,
                            forward_ct=7, pool_stats_observer=SimpleNamespace(max_total_num_tokens=1024))
    if tree is not None:
        sched.tree_cache = tree
    return plan, sched


def _samples(probe: Probe) -> list[Any]:
    assert probe.flush()
    recs, _ = read_records(probe.out_dir / "rank0.jsonl")
    return recs


def test_hook_counts_a_new_prefill_batch_as_running_and_reads_the_radix_sizes(probe: Probe) -> None:
    tree = SimpleNamespace(evictable_size=lambda: 64, protected_size=lambda: (128, 0))
    plan, sched = _scheduler(free=512, running=2, waiting=3, new=1, tree=tree)
    pool_hooks.after_get_next_batch_to_run(plan, sched, running_batch=None, last_batch=None)
    (rec,) = _samples(probe)
    assert isinstance(rec, PoolSample)
    assert (rec.step, rec.total, rec.free, rec.running, rec.waiting) == (7, 1024, 512, 3, 3)
    assert (rec.evictable, rec.protected, rec.scheduler_total) == (64, 128, 1024)
    assert rec.used == 1024 - 512 - 64


def test_hook_without_an_allocator_notes_once_and_stops(probe: Probe) -> None:
    plan, sched = _scheduler(free=0, running=0, waiting=0)
    del sched.token_to_kv_pool_allocator
    for _ in range(3):
        pool_hooks.after_get_next_batch_to_run(plan, sched)
    recs = _samples(probe)
    assert len(recs) == 1 and isinstance(recs[0], ProbeNote)
    assert recs[0].level == "warning" and "token_to_kv_pool_allocator" in recs[0].message
