"""Pool samples: each rank's KV pool and the scheduler's token accounting through a run.

`PoolSampler` decides which scheduler iterations become `PoolSample` records; the SGLang hook
(`after_get_next_batch_to_run`) and the reference engine's scheduler (`cptest.reference.rank`)
both feed it, so one rule says when a sample is written:

- only when a figure changed since the last sample written (an idle scheduler loops without end
  and writes nothing);
- while busy, at most once every `STEP_EVERY` forward batches while a request waits (the pool is
  at its limit, or filling towards it), and once every `QUIET_EVERY` while none does: a few records
  per second of decode, not one per step;
- always when the scheduler has just drained (nothing running or waiting), so the last sample of
  every rank is its drained state.

The rule reads only figures every rank of one server has alike (the forward count and the
scheduler's queues: SGLang's TP ranks each run the same scheduler on the same broadcast requests),
so the ranks of a DCP group write samples at the same steps and the checker compares them there.

Cost: a handful of attribute reads and `len()`s per iteration, and a record's line (no pydantic) when
one is due; it joins the copy batch being filled (`Probe.write`). `available_size()` is
`len(free_pages) * page_size` of a device tensor, whose length is host metadata (no CUDA sync,
mem_cache/allocator/base.py:57-58, token.py:51-53 in the pinned release's wheel).
"""

from __future__ import annotations

import time
from typing import Any

from cptest.evidence import PoolSample, RankId
from cptest.probe import runtime as _runtime
from cptest.probe.records import pool_sample_late
from cptest.probe.runtime import get_probe

STEP_EVERY = 4
"""While busy with a request waiting, forward batches between two samples at least (the drained
sample is never held back)."""
QUIET_EVERY = 16
"""While busy with no request waiting, forward batches between two samples at least. Reading the
pools is the hook's cost (about 16 us on a server, against 1 us for an iteration too soon); what
the capacity contracts judge at the pool's limit comes with requests waiting, sampled at
STEP_EVERY."""


class PoolSampler:
    """Which iterations become records; one per scheduler process."""

    __slots__ = ("every", "quiet_every", "last", "last_step", "off")

    def __init__(self, every: int = STEP_EVERY, quiet_every: int = QUIET_EVERY) -> None:
        self.every = every
        self.quiet_every = max(quiet_every, every)
        self.last: tuple[Any, ...] | None = None
        self.last_step: int | None = None
        self.off = False
        """True once the engine lacked something to read: the sampler stays silent (one note said why)."""

    def due(self, step: int, figures: tuple[Any, ...], idle: bool) -> bool:
        """Whether this iteration's `figures` (total, free, evictable, protected, running, waiting,
        scheduler_total) become a record; if so they are the last written from now on."""
        if figures == self.last or self.too_soon(step, idle, figures[5]):
            return False
        self.last, self.last_step = figures, step
        return True

    def too_soon(self, step: int, idle: bool, waiting: int) -> bool:
        """Busy, and fewer than `every` forward batches since the last sample (`quiet_every` while
        no request waits): no record, whatever the figures (the SGLang hook asks this first, before
        it reads the pools). Every rank of a server runs the same scheduler on the same requests,
        so the ranks of a group sample the same iterations."""
        if idle or self.last_step is None:
            return False
        gap = step - self.last_step
        return gap < self.every or (gap < self.quiet_every and not waiting)

    def offer(self, *, rank: RankId, t: float, step: int, total: int, free: int, evictable: int | None,
              protected: int | None, running: int, waiting: int,
              scheduler_total: int | None) -> PoolSample | None:
        """The record to write for this iteration, or None (nothing changed, or too soon)."""
        idle = running == 0 and waiting == 0
        if not self.due(step, (total, free, evictable, protected, running, waiting, scheduler_total), idle):
            return None
        return PoolSample(t=t, rank=rank, step=step, total=total, free=free, evictable=evictable,
                          protected=protected, running=running, waiting=waiting,
                          scheduler_total=scheduler_total, idle=idle)


_SAMPLER = PoolSampler()


def _size(v: Any) -> int | None:
    """A cache size as an int: hybrid caches return (full, other) pairs; the full pool is the first."""
    if v is None:
        return None
    if isinstance(v, tuple):
        v = v[0]
    return int(v)


def after_get_next_batch_to_run(plan: Any, scheduler: Any, *_args: Any, **_kwargs: Any) -> None:
    """AFTER managers/scheduler.py:2925 `Scheduler.get_next_batch_to_run`: one pool sample, maybe.

    Called once per event-loop iteration (scheduler.py:1696 normal loop, 1737 overlap loop), after
    this iteration's admissions and decode allocations and after the previous batch's releases.
    `plan` is a `NextBatchPlan` (managers/schedule_batch.py:3283): `batch_to_run` is a new prefill
    batch (not yet in `running_batch`) or the running batch itself. Totals as the scheduler keeps
    them: the allocator's `size` (logical under DCP: rows x dcp, kv_cache_configurator.py:1563-1566)
    and the pool-stats observer's `max_total_num_tokens` (rows x dcp_size, scheduler.py:2005).
    """
    probe = _runtime._PROBE or get_probe()
    if probe is None:
        return
    sampler = _SAMPLER
    # Timed when the probe measures itself (runtime.ENV_SWITCH): SGLang calls this every scheduler
    # iteration on the engine's thread, outside the forward that steps._timed_forward times.
    # Only a busy iteration's time is counted: one that leads to a forward step. An idle scheduler
    # loops without end and reads the pools each time (idle is never too soon), but no step waits
    # for it, so counting those loops would charge the steps' cost notes with time no step spent.
    t0 = time.perf_counter_ns() if probe.timing else 0
    # The usual iteration of a decode first (no sample in 15 of 16 while none waits): a batch to
    # run with requests in it is busy, and a busy iteration too soon after the last sample reads
    # nothing more. The same rule as below (PoolSampler.too_soon), with fewer reads of SGLang's
    # objects. Nor does it do the chores: the step it leads to does them
    # (steps.around_model_runner_forward).
    # (`last_step` is set by a sample alone, which needs the rank, and cleared when samples go
    # off; a paused probe's step does the chores as well, and its iteration reads nothing)
    try:
        new = plan.batch_to_run
        last = sampler.last_step
        if new is not None and last is not None and new.reqs:
            gap = scheduler.forward_ct - last
            if gap < sampler.every or (gap < sampler.quiet_every and not scheduler.waiting_queue):
                if t0 and not probe.paused:
                    _count(probe.cost, t0, read=False)
                return
    except AttributeError:
        pass  # said below, where each figure is read again
    # The probe's chores (runtime.Probe.chores) ride on this call too: SGLang makes it on every
    # loop iteration, idle ones included, where no step runs to do them.
    now = probe.clock()
    if now >= probe.next_chores:
        probe.chores(now)
    if probe.rank_json is None or sampler.off or probe.paused:
        return
    t0 = time.perf_counter_ns() if probe.timing else 0  # after the chores, which time themselves
    busy = read = False
    try:
        try:
            new = plan.batch_to_run
            running_batch = plan.running_batch
            running = len(running_batch.reqs) if running_batch is not None else 0
            if new is not None and new is not running_batch:
                running += len(new.reqs)
            waiting = len(scheduler.waiting_queue)
            step = int(scheduler.forward_ct)
            idle = running == 0 and waiting == 0
            busy = not idle
            if sampler.too_soon(step, idle, waiting):
                return  # too soon, whatever the pools say
            read = True
            alloc = scheduler.token_to_kv_pool_allocator
            total, free = int(alloc.size), int(alloc.available_size())
        except AttributeError as e:
            sampler.off = True
            sampler.last_step = None
            probe.warn_once("pool_sample", f"pool samples off: SGLang's scheduler lacks {e}; "
                                           "no pool_sample evidence (capacity transitions is unknown)")
            return
        tree = getattr(scheduler, "tree_cache", None)
        size = getattr(tree, "evictable_size", None)
        evictable = _size(size()) if size is not None else None
        size = getattr(tree, "protected_size", None)
        protected = _size(size()) if size is not None else None
        observer = getattr(scheduler, "pool_stats_observer", None)
        sched_total = getattr(observer, "max_total_num_tokens", None)
        if sched_total is not None:
            sched_total = int(sched_total)
        figures = (total, free, evictable, protected, running, waiting, sched_total)
        if figures != sampler.last:  # PoolSampler.due, inline: not too soon (it returned above if so)
            sampler.last, sampler.last_step = figures, step
            # The record's figures and the clock; its JSON line is made without pydantic (as a step's
            # is, records.py) when it is written, with the copy batch it joins: it reads back as the
            # PoolSample that `PoolSampler.offer` would have made. Into the batch being
            # filled directly when there is one, or after the last closed batch not yet written
            # (`copy_batches.attach_record`); otherwise `Probe.write` decides.
            record = pool_sample_late(probe.rank_json, probe.clock(), step, total, free, evictable,
                                      protected, running, waiting, sched_total, idle)
            batches = probe.batches
            if batches is None or not batches.attach(probe, record):
                probe.write(record)
    finally:
        if busy and t0:
            _count(probe.cost, t0, read)


def _count(cost: list[Any], t0: int, read: bool) -> None:
    """A busy iteration's time in the `cost` notes (the pool hook's fields)."""
    dt = time.perf_counter_ns() - t0
    cost[11] += dt
    cost[12] += 1
    if read:  # the iterations that read the pools, apart from the early returns
        cost[13] += dt
        cost[14] += 1
