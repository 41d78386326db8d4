"""A fixed sequence of engine steps through the probe's hooks, for comparing the files it writes.

`run(out_dir, watchdog=...)` drives the probe as SGLang 0.5.17 would (the pool-sample hook before
each forward, `ModelRunner.forward` with the inner hooks an eager forward fires, CUDA-graph
replays, records written while a copy batch fills) over every kind of step the probe writes a
line for, on a clock that only the scenario moves, and returns the bytes of the rank's file. The
file depends only on the sequence: the engine's thread sends, polls and finishes the copies, and
the probe's watchdog thread (`watchdog=True`) does nothing while the engine's thread comes by, so
both give the same bytes.

`tests/probe/data/steps_scenario.jsonl` holds the bytes of the engine's thread alone as the probe wrote them
at 3bfa576, before D69 reworked how steps are gathered and written: the reference of its records.
`tests/probe/data/steps_scenario_d72.jsonl` holds the bytes it writes since D72 (pool samples after
their run's steps), which must read as the same evidence as the reference (test_steps_scenario.py).
Regenerate the latter only for an intended change of how lines are made:
`python -m tests.probe.steps_scenario > tests/probe/data/steps_scenario_d72.jsonl`.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Literal

import torch

from cptest.evidence import RankId
from cptest.probe import hooks, pool_hooks, runtime
from cptest.probe.pool_hooks import PoolSampler
from cptest.probe.runtime import Probe

RANK = RankId(world=1, tp=1, dcp=1, attn_tp=1, pid=4242)
HEX = [f"{i * 7919:032x}" for i in range(64)]


class Clock:
    """The probe's clock; only the scenario moves it (by uneven amounts, so `t` needs rounding)."""

    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now

    def tick(self, s: float = 0.000731) -> None:
        self.now += s


class Scheduler:
    """What the pool-sample hook reads from 0.5.17's scheduler (pool_hooks.after_get_next_batch_to_run)."""

    def __init__(self) -> None:
        self.size = 4096
        self.free = 4096
        self.token_to_kv_pool_allocator = self
        self.waiting_queue: list[Any] = []
        self.forward_ct = 0
        self.tree_cache = types.SimpleNamespace(evictable_size=lambda: 17, protected_size=lambda: (5, 0))
        self.pool_stats_observer = types.SimpleNamespace(max_total_num_tokens=4096)

    def available_size(self) -> int:
        return self.free

    def iteration(self, running: int, waiting: int = 0) -> None:
        reqs = types.SimpleNamespace(reqs=[object()] * running) if running else None
        self.waiting_queue = [object()] * waiting
        self.free = max(self.free - running, 0)
        plan = types.SimpleNamespace(running_batch=reqs, batch_to_run=reqs)
        pool_hooks.after_get_next_batch_to_run(plan, self)
        self.forward_ct += 1


def _batch(mode: str, rids: list[str], positions: Any, extend: list[int] | None = None,
           prefix: list[int] | None = None, rows: int | None = None) -> Any:
    n = rows if rows is not None else (int(positions.shape[-1]) if positions is not None else len(rids))
    return types.SimpleNamespace(
        forward_mode=types.SimpleNamespace(name=mode), input_ids=torch.arange(n), positions=positions,
        rids=list(rids), batch_size=len(rids), extend_seq_lens_cpu=extend, extend_prefix_lens_cpu=prefix)


def _eager(kv: str = "mask", rows_delta: int = 0, hooks_rows: bool = True) -> Any:
    """An eager forward: the KV write of every layer (with the DCP owner mask, without one, or
    none), and the attention / MLP / logits forward hooks."""

    def forward(_runner: Any, fb: Any) -> Any:
        pos = fb.positions if fb.positions is None or fb.positions.ndim == 1 else fb.positions[0]
        n = int(fb.input_ids.shape[0])
        if kv != "none":
            k = torch.zeros(n + rows_delta, 1, 4)
            extra = {"dcp_kv_mask": pos % 2 == 1} if kv == "mask" and pos is not None else {}
            for _ in range(3):
                hooks.after_set_kv_buffer(None, None, None, None, k, k, **extra)
        if hooks_rows:
            hidden = torch.zeros(n, 8)
            hooks.on_attn_input(None, (hidden,), None)
            hooks.on_mlp_input(None, (hidden,), None)
            hooks.on_logits_input(None, (None, hidden[: len(fb.rids)]), None)
        return types.SimpleNamespace(can_run_graph=False)

    return forward


def _replay(_runner: Any, _fb: Any) -> Any:
    return types.SimpleNamespace(can_run_graph=True)


def _raises(_runner: Any, _fb: Any) -> Any:
    raise RuntimeError("CUDA error: an illegal memory access")


def _steps(probe: Probe, clock: Clock, sched: Scheduler, pause: Any) -> None:
    runner = types.SimpleNamespace(is_draft_worker=False, decode_cuda_graph_runner=None)
    graphed = types.SimpleNamespace(
        is_draft_worker=False, decode_cuda_graph_runner=types.SimpleNamespace(bs=4, captured_req_width=1))
    fwd = hooks.around_model_runner_forward
    pos = {"a": 0, "b": 0, "c": 0}

    def decode(rids: list[str], forward: Any, run: Any = runner, pool: bool = True) -> None:
        if pool:
            sched.iteration(len(rids))
        clock.tick(0.0000123)
        for r in rids:
            pos[r] = pos.get(r, 40) + 1
        fwd(forward, run, _batch("DECODE", rids, torch.tensor([pos[r] for r in rids])))
        clock.tick()
        if probe.step_index % 16 == 5:
            pause()

    sched.iteration(0)  # idle before any request: a sample
    clock.tick()
    sched.iteration(2, waiting=1)
    fwd(_eager(), runner, _batch("EXTEND", ["a", "b"], torch.tensor([0, 1, 2, 0, 1]), [3, 2], [0, 0]))
    pos.update(a=2, b=1)
    clock.tick()
    for i in range(22):  # crosses a copy batch; pool samples every 4 (after their run since D72)
        decode(["a", "b"], _eager())
        if i == 6:
            probe.note("a note written while a copy batch fills")
        if i == 9:
            hooks.after_scheduler_init_info(None, types.SimpleNamespace(
                max_total_num_tokens=4096, max_running_requests=48, model_config=None))
    for _ in range(3):  # a request joins; the KV write takes every row (no DCP mask)
        decode(["a", "b", "c"], _eager(kv="all"))
    probe.cp_configured = False
    for _ in range(10):  # decode graphs: no inner hook fires
        decode(["a", "b", "c"], _replay, graphed)
    graphed.decode_cuda_graph_runner = types.SimpleNamespace(bs=8, captured_req_width=1)
    for _ in range(3):  # another captured size: another block
        decode(["a", "b", "c"], _replay, graphed)
    for _ in range(2):  # no KV write seen: one note for both
        decode(["a", "b", "c"], _eager(kv="none"))
    for _ in range(2):  # a KV write that does not fit the batch
        decode(["a", "b", "c"], _eager(kv="all", rows_delta=1))
    decode(["a", "b", "c"], _eager(rows_delta=1))  # ... but its mask does: the mask decides
    decode(['q"x', "y"], _eager())  # an id that needs escaping: the general path
    decode(["d", "d"], _eager())  # a repeated id: the general path
    sched.iteration(2)
    fwd(_eager(), runner, _batch("MIXED", ["a", "b"], torch.tensor([7, 8, 42]), [2, 1], [5, 41]))
    clock.tick()
    fwd(_eager(), runner, _batch("DECODE", ["a", "b"], None, rows=2))  # no positions
    clock.tick()
    mrope = torch.stack([torch.tensor([60, 61]), torch.tensor([0, 0]), torch.tensor([1, 1])])
    fwd(_eager(), runner, _batch("DECODE", ["a", "b"], mrope))  # M-RoPE: the first row
    clock.tick()
    fwd(_eager(), runner, _batch("IDLE", [], torch.zeros(0, dtype=torch.int64)))
    clock.tick()
    fwd(_replay, runner, _batch("DECODE", ["a", "b"], torch.tensor([70, 71])))  # no padded size
    clock.tick()
    with contextlib.suppress(RuntimeError):
        fwd(_raises, runner, _batch("DECODE", ["a", "b"], torch.tensor([72, 73])))
    clock.tick()
    graphed.decode_cuda_graph_runner = types.SimpleNamespace(bs=64, captured_req_width=1)
    for i in range(40):  # a 64-request decode, eager and replayed in turns
        decode(HEX, _eager() if (i // 7) % 2 else _replay, graphed)
    probe.cp_configured = True
    _zigzag(probe)
    clock.tick()
    sched.iteration(0)  # drained


def _zigzag(probe: Probe) -> None:
    """One PCP zigzag prefill (as tests/probe/test_hooks.py's): this rank's blocks of one request."""
    meta = types.SimpleNamespace(split_list=[3, 3, 2, 2], zigzag_index=[1, 2], per_rank_actual_token=[6, 6],
                                 per_rank_logical_token=[5, 5])
    loaded = types.SimpleNamespace(attn_cp_metadata=meta, positions=torch.arange(10))

    def forward(_r: Any, _b: Any) -> Any:
        hooks.after_prepare_cp_forward(None, loaded)
        hooks.after_zigzag_shard_positions(torch.tensor([3, 4, 5, 6, 7, 0]),
                                           types.SimpleNamespace(cp_rank=1), loaded.positions, loaded)
        k = torch.zeros(10, 1, 4)
        hooks.after_set_kv_buffer(None, None, None, None, k, k)
        return types.SimpleNamespace(can_run_graph=False)

    hooks.around_model_runner_forward(forward, types.SimpleNamespace(is_draft_worker=False),
                                      _batch("EXTEND", ["z"], torch.arange(10), [10], [0]))


GOLDEN_BOUNDS = (16, 0.1)
"""The copy batches' bounds the golden files were written with (`Probe.copy_every`,
`Probe.copy_within_s`): they decide which steps share a `steps` line, not what the records say."""


def run(out_dir: Path, *, watchdog: bool, bounds: tuple[int, float] = GOLDEN_BOUNDS,
        writer: Literal["process", "inline"] = "inline") -> bytes:
    """The rank file the probe writes for the scenario (with or without its watchdog thread), its
    steps in copy batches of the given bounds (steps, seconds), written by the probe itself or by
    its writer process."""
    clock = Clock()
    probe = Probe(out_dir, clock=clock, graph_flush_s=1e9, copy_within_s=bounds[1], copy_every=bounds[0],
                  writer=writer)
    if not watchdog:
        probe._start_watchdog = lambda: None  # type: ignore[method-assign]
    # every busy iteration at 4 forward batches, waiting or not: the rule the golden files were written with
    sampler, pool_hooks._SAMPLER = pool_hooks._SAMPLER, PoolSampler(every=4, quiet_every=4)
    runtime.set_probe(probe)
    try:
        probe.note("before the rank is known")
        probe.set_rank(RANK)
        assert (probe._watchdog is not None) is watchdog
        # With the watchdog, pause now and then for longer than it sleeps: it wakes meanwhile, and
        # must leave alone an engine whose clock says it came by just now.
        _steps(probe, clock, Scheduler(), (lambda: time.sleep(1.2 * runtime.WATCH_S)) if watchdog
               else (lambda: None))
        assert probe.flush(timeout=30)
        probe.close()
    finally:
        runtime.set_probe(None)
        pool_hooks._SAMPLER = sampler
    return (out_dir / f"rank{RANK.world}.jsonl").read_bytes()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        sys.stdout.buffer.write(run(Path(d), watchdog=False))
