"""Profiles the probe's copy-batch finishing inside an SGLang rank, for `measure.sh`'s
`P0_PRELOAD=tools/device/finish_profile` with `P0_ENV=CPTEST_FINPROF_OUT=<dir>`.

On the GPU machine a batch's finishing (`CopyBatch.run`) takes several times what
`benchmarks/probe_step.py` shows for the same batch, and the cost notes time it only by phase. This
module runs each `CopyBatch.run` under one cProfile profiler (enabled for the call alone), notes each
call's wall time, its items and steps, and the cyclic collector's passes that fell inside it, and
rewrites `<dir>/finprof-<pid>.pstats` and `.json` every few batches (a server is killed, not closed).

It is imported by every Python process that has this folder on its PYTHONPATH, and does nothing
unless CPTEST_FINPROF_OUT is set. It is a diagnostic: no evidence run loads it.
"""

from __future__ import annotations

import os

_OUT = os.environ.get("CPTEST_FINPROF_OUT", "")


def _install(out: str) -> None:
    import cProfile
    import gc
    import json
    import time

    from cptest.probe import copy_batches

    profiler = cProfile.Profile()
    batches: list[list[float]] = []
    state = {"inside": False, "gc_t0": 0, "gc_ns": 0, "gc_n": 0, "calls": 0}

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if not state["inside"]:
            return
        if phase == "start":
            state["gc_t0"] = time.perf_counter_ns()
        else:
            state["gc_ns"] += time.perf_counter_ns() - state["gc_t0"]
            state["gc_n"] += 1

    gc.callbacks.append(on_gc)
    original = copy_batches.CopyBatch.run

    def dump() -> None:
        os.makedirs(out, exist_ok=True)
        base = os.path.join(out, f"finprof-{os.getpid()}")
        profiler.dump_stats(base + ".pstats")
        with open(base + ".json", "w", encoding="utf-8") as f:
            json.dump({"fields": ["wall_ns", "items", "steps", "gc_passes", "gc_ns", "later"],
                       "batches": batches}, f)

    def run(self: copy_batches.CopyBatch) -> None:
        items, steps, later = len(self.items), self.steps, len(self.later)
        state["inside"], state["gc_ns"], state["gc_n"] = True, 0, 0
        t0 = time.perf_counter_ns()
        profiler.enable()
        try:
            original(self)
        finally:
            profiler.disable()
            wall = time.perf_counter_ns() - t0
            state["inside"] = False
            batches.append([wall, items, steps, state["gc_n"], state["gc_ns"], later])
            state["calls"] += 1
            if state["calls"] % 8 == 0:
                dump()

    copy_batches.CopyBatch.run = run  # type: ignore[method-assign]


if _OUT:
    try:
        _install(_OUT)
    except Exception as e:  # a diagnostic must never stop the server
        print(f"finish_profile: not installed: {e!r}", flush=True)
