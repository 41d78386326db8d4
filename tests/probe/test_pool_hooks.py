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
from cptest.probe.records import late_line, pool_sample_late, pool_sample_line
from cptest.probe.runtime import Probe

R = RankId(world=0)


def _offer(s: PoolSampler, step: int, free: int, running: int, waiting: int = 0) -> PoolSample | None:
    return s.offer(rank=R, t=0.0, step=step, total=100, free=free, evictable=None, protected=None,
                   running=running, waiting=waiting, scheduler_total=100)


def test_unchanged_figures_are_not_written_again() -> None:
    s = PoolSampler(every=1, quiet_every=1)
    assert _offer(s, 0, 100, 0) is not None
    assert _offer(s, 0, 100, 0) is None  # an idle loop spinning writes nothing


def test_busy_samples_are_at_least_every_steps_apart() -> None:
    s = PoolSampler(every=4, quiet_every=4)
    written = [step for step in range(12) if _offer(s, step, 100 - step, 1) is not None]
    assert written == [0, 4, 8]


def test_busy_samples_are_quiet_every_apart_and_every_apart_while_a_request_waits() -> None:
    """A request waiting is the pool at (or filling towards) its limit: sampled every `every`
    forward batches; a busy scheduler with none waiting every `quiet_every`."""
    s = PoolSampler(every=4, quiet_every=16)
    written = [step for step in range(41)
               if _offer(s, step, 1000 - step, 3, waiting=2 if 20 <= step < 30 else 0) is not None]
    assert written == [0, 16, 20, 24, 28]
    assert PoolSampler(every=8, quiet_every=2).quiet_every == 8  # never sooner than `every`


def test_the_drained_sample_is_never_held_back() -> None:
    s = PoolSampler(every=4, quiet_every=4)
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
    monkeypatch.setattr(pool_hooks, "_SAMPLER", PoolSampler(every=1, quiet_every=1))
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


def test_the_hooks_time_counts_in_the_cost_only_while_the_probe_times_itself(probe: Probe) -> None:
    """D73: the hook runs on the engine's thread outside the forward; measuring (`Probe.timing`)
    adds a busy iteration's time to `cost[11]`, whichever way it returns (a sample, too soon, or
    none due), and not an idle one's (no forward step follows it)."""
    plan, sched = _scheduler(free=512, running=2, waiting=0)
    pool_hooks.after_get_next_batch_to_run(plan, sched)
    assert probe.cost[11] == 0  # not measuring: nothing added
    probe.timing = True
    pool_hooks.after_get_next_batch_to_run(plan, sched)  # the figures did not change: no sample
    after_one = probe.cost[11]
    assert after_one > 0
    sched.token_to_kv_pool_allocator.free = 256
    sched.forward_ct = 8
    pool_hooks.after_get_next_batch_to_run(plan, sched)  # a sample
    assert probe.cost[11] > after_one
    assert (probe.cost[12], probe.cost[14]) == (2, 1)  # two busy iterations, one read the pools
    assert 0 < probe.cost[13] < probe.cost[11]  # the reading one's time, within the whole
    busy = probe.cost[11]
    idle_plan, idle_sched = _scheduler(free=1024, running=0, waiting=0)
    for _ in range(3):  # an idle scheduler's loop: the drained sample once, then nothing new; none counted
        pool_hooks.after_get_next_batch_to_run(idle_plan, idle_sched)
    assert probe.cost[11] == busy  # no forward step waits for an idle iteration
    samples = [r for r in _samples(probe) if isinstance(r, PoolSample)]
    assert [(r.free, r.idle) for r in samples] == [(512, False), (256, False), (1024, True)]


@pytest.mark.parametrize("t", [0.0, 0.000123, 1.5, 12345.678901])
@pytest.mark.parametrize("figures", [
    dict(evictable=None, protected=None, scheduler_total=None, running=0, waiting=0, idle=True),
    dict(evictable=64, protected=0, scheduler_total=2048, running=64, waiting=3, idle=False),
])
def test_the_hooks_line_is_the_records_json_and_reads_back_as_it(tmp_path: Path, t: float,
                                                                 figures: dict[str, Any]) -> None:
    """The hook writes a PoolSample's line without pydantic (D67): the same text as the record's
    `model_dump_json()`, and the same record through the evidence reader."""
    rank = RankId(world=3, tp=1, dcp=1, pid=4242)
    rec = PoolSample(t=t, rank=rank, step=9, total=2048, free=100, **figures)
    line = pool_sample_line(rank_json=rank.model_dump_json(), t=t, step=9, total=2048, free=100, **figures)
    assert line == rec.model_dump_json()
    (tmp_path / "rank3.jsonl").write_text(line + "\n")
    assert read_records(tmp_path / "rank3.jsonl") == ([rec], 0)


def test_the_hook_writes_the_samples_offer_makes_over_a_decode(probe: Probe,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook asks `too_soon` before it reads the pools, then `due`: the samples it writes over a
    decode that drains are the ones `PoolSampler.offer` makes from the same figures."""
    monkeypatch.setattr(pool_hooks, "_SAMPLER", PoolSampler())
    tree = SimpleNamespace(evictable_size=lambda: 0, protected_size=lambda: 0)
    reference = PoolSampler()
    want = []
    for step in range(47):
        running = 4 if step < 44 else 0
        waiting = 2 if 20 <= step < 30 else 0  # the pool at its limit for a while
        plan, sched = _scheduler(free=1024 - 4 * running * (step + 1), running=running, waiting=waiting,
                                 tree=tree)
        sched.forward_ct = step
        pool_hooks.after_get_next_batch_to_run(plan, sched)
        free = sched.token_to_kv_pool_allocator.free
        rec = reference.offer(rank=R, t=0.0, step=step, total=1024, free=free, evictable=0, protected=0,
                              running=running, waiting=waiting, scheduler_total=1024)
        if rec is not None:
            want.append(rec)
    got = [s for s in _samples(probe) if isinstance(s, PoolSample)]
    assert [s.model_copy(update={"t": 0.0}) for s in got] == want
    assert [s.step for s in got] == [0, 16, 20, 24, 28, 44] and got[-1].idle


@pytest.mark.parametrize("clock", [1000.0, 1000.000123, 1001.5, 13345.678901])
def test_a_sample_made_into_its_line_when_written_is_the_line_the_hook_made_before(clock: float) -> None:
    """The hook keeps the clock and the figures (`records.pool_sample_late`, D69); its line, made
    with its copy batch's, is the one made in the hook with `Probe.now` (D67)."""
    rank = RankId(world=3, tp=1, dcp=1, pid=4242)
    figures = dict(step=9, total=2048, free=100, evictable=64, protected=None, running=64, waiting=3,
                   scheduler_total=2048, idle=False)
    late = pool_sample_late(rank.model_dump_json(), clock, *figures.values())  # type: ignore[arg-type]
    assert late_line(late, 1000.0) == pool_sample_line(rank_json=rank.model_dump_json(),
                                                       t=round(clock - 1000.0, 6), **figures)  # type: ignore[arg-type]
    import gc

    gc.collect()
    assert not gc.is_tracked(late)  # plain values: the collector lets it go, no matter how long it waits


def test_a_busy_iteration_too_soon_leaves_the_chores_to_its_step_and_an_idle_one_does_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Most busy iterations of a decode read nothing (too soon after the last sample) and return
    without reading the clock: the forward step they lead to does the probe's chores
    (steps.around_model_runner_forward). An idle iteration, which no step follows, does them, and
    so does a busy one that samples."""
    now = [100.0]
    p = Probe(tmp_path, clock=lambda: now[0])
    runtime.set_probe(p)
    p.set_rank(R)
    monkeypatch.setattr(pool_hooks, "_SAMPLER", PoolSampler(every=4, quiet_every=4))
    rounds: list[float] = []
    monkeypatch.setattr(p, "chores", lambda t: (rounds.append(t), setattr(p, "next_chores", t + 1.0)))
    try:
        plan, sched = _scheduler(free=512, running=2, waiting=0)
        pool_hooks.after_get_next_batch_to_run(plan, sched)  # the first sample: never too soon
        assert rounds == [100.0]
        for k in range(1, 4):  # too soon: no chores, however late they are
            now[0] = 101.0 + k
            sched.forward_ct += 1
            pool_hooks.after_get_next_batch_to_run(plan, sched)
        assert rounds == [100.0]
        sched.forward_ct += 1  # four forward batches on: a sample, and the chores with it
        pool_hooks.after_get_next_batch_to_run(plan, sched)
        assert rounds == [100.0, 104.0]
        now[0] = 106.0
        idle_plan, idle_sched = _scheduler(free=1024, running=0, waiting=0)
        pool_hooks.after_get_next_batch_to_run(idle_plan, idle_sched)
        assert rounds == [100.0, 104.0, 106.0]
    finally:
        runtime.set_probe(None)
        p.close()
