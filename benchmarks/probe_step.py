"""Benchmark of the probe's CPU cost per eager forward step, on the engine's thread and in total.

The real figure is the decode-throughput overhead on the GPU machine
(`tools/device/probe-overhead.sh`, target <= 3 %); this is its CPU-side part, measurable anywhere,
for finding where the time goes. One simulated SGLang step drives the same hook bodies SGLang's
wrappers call: `ModelRunner.forward` (AROUND), the KV write of every layer (AFTER, with a DCP
owner mask), every layer's attention and MLP module calls with the probe's row hooks on them (the
first layer's and the logits' registered with torch as SGLang's `--forward-hooks` does, then moved
into wrapped forwards as the probe does, the others wrapped; `--registered`: all left registered),
the logits one. With `--device cpu`
(default) the tensors are small CPU tensors and the figures are pure Python; with `--device cuda`
they live on the GPU and the figures include the probe's device copies and events.

Printed, per step of a `--batch`-request decode batch over `--layers` layers:
- engine thread: wall time of the hooked step minus the bare one: what SGLang's loop pays,
  including finishing and writing the previous step's record (the probe does that on the
  engine's thread, at the next step's start);
- CPU time: process CPU time of the hooked run minus the bare one, per step (all threads);
- paused: the hooked step with the probe switched off at run time (tools/device/probe_windows.py
  measures on against that state), minus the bare one;
- kept objects: objects the probe makes per step that live long enough for Python's collector to
  move them to its oldest generation, with a young collection after every step (SGLang's engine
  makes thousands of objects a step) and a middle one every tenth. Each such move brings the next
  full collection of the whole engine process closer, a pause of the engine's thread that grows
  with everything the engine holds.

- with `--pool`, each step also runs the pool-sample hook (`pool_hooks.after_get_next_batch_to_run`,
  which SGLang calls before the forward, once per scheduler iteration) on a scheduler whose free
  tokens change every step, as a decode's do; the unhooked step changes the same figures;
- parts: a second hooked run with the probe's `cost` timing on (`Probe.timing`, what the GPU
  machine's `cost` notes report): ready / begin / end / send per step, steps over steps.SLOW_NS,
  the pool hook's own time, the chores', and the CPU time of the engine's thread and of the others
  (the probe's watchdog, which acts only when the engine stalls: `watchdog_ns`).

- with `--graphs`, each step is a decode CUDA-graph replay as the probe sees one (D58): no KV
  write or forward hook fires, the output says `can_run_graph` and the runner the padded size;
  the probe records it with its positions like an eager decode step.
- with `--engine-us US`, each step (hooked or not) also does about US microseconds of the engine's
  own work, a fixed amount of it: Python holding the GIL, letting go of it for a C call every
  ~50 us (`engine_work`). The probe's code then runs as in SGLang, once a step after other work,
  and costs several times what it costs back to back (D69: 1.67 ms models a decode-graph step of
  the H200 measurements, 4.4 ms an eager one); and any other thread that takes the GIL (a probe
  thread with work, `--gil-thread`) lengthens the engine's steps instead of hiding in a spin that
  waits for a time.
- with `--gil-thread US`, a thread beside the engine's does US microseconds of Python every
  20 ms, as the probe's writer thread did before D114 (its rounds: sends, polls, finishing): what
  such a thread costs a GIL-bound engine, against the same work done on the engine's thread.
- `--blocks K` runs the unhooked and hooked steps in K alternating pairs of blocks and prints the
  engine thread's cost with a 95 % bootstrap interval over the pairs (this host's drift and
  noise are of the size of the probe's cost; one run of each says little); `--control` also runs
  the unhooked step against itself in as many pairs, the floor of the method on this host.

    python benchmarks/probe_step.py [--steps N] [--batch B] [--layers L] [--device cpu|cuda]
        [--pool] [--graphs] [--engine-us US [--engine-touch MIB]] [--gil-thread US]
        [--blocks K [--control]] [--reads CONTEXT] [--copy-every N] [--copy-within-s S]
        [--writer process|inline] [--no-mask] [--profile TOP]

`--copy-every` and `--copy-within-s` set the copy batches' bounds (`Probe.copy_every`,
`Probe.copy_within_s`), to compare batch sizes on one machine.

`--profile TOP` also prints the TOP functions by their own time in a profiled run of the hooked
steps (cProfile inflates Python calls, so read it for proportions, not for figures).
"""

from __future__ import annotations

import argparse
import enum
import functools
import gc
import hashlib
import random
import statistics
import tempfile
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cptest.evidence import PoolSample, RankId, Step, read_records
from cptest.probe import hooks, pool_hooks, runtime
from cptest.probe.runtime import COST_FIELDS, Probe
from cptest.probe.steps import SLOW_NS


class ForwardMode(enum.IntEnum):
    """SGLang's forward modes are an IntEnum (model_executor/forward_batch_info.py:98): reading a
    member's `name` is a Python-level call, not an attribute of a plain object."""

    EXTEND = 1
    DECODE = 2


def engine_work(us: float) -> None:
    """About `us` microseconds of the engine's own work, as SGLang's thread does it: Python holding
    the GIL in stretches of about 40 us, each followed by a C call that lets go of it for about
    10 us (hashlib over 16 KiB here; a CUDA call or a torch op in SGLang). A fixed amount of work,
    not a time: a stretch spent waiting for the GIL makes the step longer, as in the engine.
    With `--engine-touch`, the work first reads an attribute of each of `_TOUCHED`'s objects."""
    total = 0
    for o in _TOUCHED:
        total += o.a
    n = _STRETCH[0] or _calibrate()
    for _ in range(max(round(us / 50), 1)):
        for _ in range(n):
            pass
        hashlib.sha256(_GIL_FREE)


def _calibrate() -> int:
    """Loop iterations of about 40 us on this machine (the fastest of a few tries)."""
    best = None
    for _ in range(20):
        t0 = time.perf_counter()
        for _ in range(10_000):
            pass
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    _STRETCH[0] = max(int(10_000 * 40e-6 / best), 1)
    return _STRETCH[0]


_STRETCH = [0]
_TOUCHED: list[Any] = []
"""Objects the engine's work reads every step (`--engine-touch`): SGLang's scheduler and model
runner touch megabytes of their own Python objects between two forwards, which leaves the
probe's objects and code out of the CPU's nearest caches when its hooks run. A spin alone keeps
them in, and its figures come out about half of a server's."""


def touch_objects(mib: float) -> None:
    """Fill `_TOUCHED` with objects of about `mib` MiB in all (an object with its dict and two
    values is about 200 bytes here)."""
    _TOUCHED[:] = [types.SimpleNamespace(a=i, b=str(i)) for i in range(int(mib * 2**20 / 200))]
_GIL_FREE = bytes(16384)


class _Pass(torch.nn.Module):
    """A layer's attention or MLP as torch calls it: the probe's row hooks ride on the module call.
    Attention carries its layer's id, as SGLang's RadixAttention does (the hook reads it)."""

    def __init__(self, layer_id: int | None = None) -> None:
        super().__init__()
        if layer_id is not None:
            self.layer_id = layer_id

    def forward(self, x: Any) -> Any:
        return x


def _same(hook: Any) -> Any:
    return hook


class _Logits(torch.nn.Module):
    def forward(self, _ids: Any, hidden: Any) -> Any:
        return hidden


def make_modules(layers: int, hooked: bool, registered: bool, wrap: Callable[[Any], Any] = _same,
                 later: list[tuple[Any, Any]] | None = None) -> tuple[list[tuple[Any, Any]], Any]:
    """Each layer's attention and MLP modules and the logits processor, hooked as in SGLang: the
    first layer's and the logits' by `register_forward_hook` (`--forward-hooks`) and then moved
    into their forwards (`hooks.unregister_into_forward`), the others' by `hooks.wrap_forward`
    (`hooks._hook_every_layer`), or every one left registered with `registered`.
    `wrap` is what the probe does to each inner hook when it is installed (`Probe.timed_inner`).
    `later`, when given, gets each wrapped module and its forward, as `Probe.layer_forwards` does."""
    mods = [(_Pass(i), _Pass()) for i in range(layers)]
    logits = _Logits()
    if hooked:
        attn_hook, mlp_hook = wrap(hooks.on_attn_input), wrap(hooks.on_mlp_input)
        for i, (attn, mlp) in enumerate(mods):
            if i == 0 or registered:
                attn.register_forward_hook(attn_hook)
                mlp.register_forward_hook(mlp_hook)
            else:
                for module, hook in ((attn, attn_hook), (mlp, mlp_hook)):
                    forward = hooks.wrap_forward(module, hook)
                    if later is not None:
                        later.append((module, forward))
        logits.register_forward_hook(wrap(hooks.on_logits_input))
        if not registered:
            for module in (*mods[0], logits):
                hooks.unregister_into_forward(module)
    return mods, logits


def sample_layers_of(probe: Probe, forward: Any) -> None:
    """Make the later layers of `forward`'s model (`make_step`) the ones the probe takes away and
    gives back between samples (`Probe.hook_layers`); the model sampled until now keeps its hooks."""
    probe.hook_layers(True)
    probe.layer_forwards = list(getattr(forward, "layer_forwards", ()))


def make_step(layers: int, batch: int, hooked: bool = True, device: str = "cpu",
              graphs: bool = False, engine_us: float = 0.0, registered: bool = False,
              wrap: Callable[[Any], Any] = _same, dcp_mask: bool = True) -> tuple[Any, Any]:
    """A forward function and a decode batch shaped like SGLang 0.5.17's, for `batch` requests.
    Each layer's K/V write carries a DCP owner mask unless `dcp_mask` is False (TP1, as the eager
    server of `tools/device/measure.sh`).

    Unhooked, the forward does the same loop without calling the probe, as an SGLang without the
    probe's hooks registered does. With `graphs` the forward is a decode CUDA-graph replay: no
    inner hook fires (the KV write and the layers run inside the graph) and the output says
    `can_run_graph`, so the probe records the step as a replay (D58)."""
    positions = torch.arange(batch, device=device) * 7 + 100
    fb = types.SimpleNamespace(
        forward_mode=ForwardMode.DECODE, input_ids=torch.arange(batch, device=device),
        positions=positions, rids=[f"{i:032x}" for i in range(batch)], batch_size=batch,
        extend_seq_lens_cpu=None, extend_prefix_lens_cpu=None, num_token_non_padded_cpu=batch,
    )
    k = torch.zeros(batch, 1, 4, device=device)
    mask = positions % 2 == 0 if dcp_mask else None
    hidden = torch.zeros(batch, 8, device=device)
    out = types.SimpleNamespace(can_run_graph=graphs)

    def replay(_runner: Any, _fb: Any) -> Any:
        if engine_us:
            engine_work(engine_us)
        return out

    if graphs:
        return replay, fb

    later: list[tuple[Any, Any]] = []
    mods, logits = make_modules(layers, hooked, registered, wrap, later)
    pool = _kv_pool(wrap(hooks.after_set_kv_buffer))

    def forward(_runner: Any, _fb: Any) -> Any:
        if engine_us:
            engine_work(engine_us)
        # each layer's KV write, attention and MLP, as SGLang calls them
        for layer, (attn, mlp) in enumerate(mods):
            pool.set_kv_buffer(layer, None, k, k, dcp_kv_mask=mask)
            attn(hidden)
            mlp(hidden)
        logits(None, hidden)
        return out

    forward.layer_forwards = later  # type: ignore[attr-defined]  # the probe's to take away (`hook_layers`)

    bare_pool = _KVPool()

    def bare(_runner: Any, _fb: Any) -> Any:
        if engine_us:
            engine_work(engine_us)
        for layer, (attn, mlp) in enumerate(mods):
            bare_pool.set_kv_buffer(layer, None, k, k, dcp_kv_mask=mask)
            attn(hidden)
            mlp(hidden)
        logits(None, hidden)
        return out

    return (forward if hooked else bare), fb


class _KVPool:
    """SGLang's MHA K/V pool as its attention calls it (`set_kv_buffer`, once a layer)."""

    def set_kv_buffer(self, layer: Any, loc: Any, cache_k: Any, cache_v: Any, *args: Any,
                      **kwargs: Any) -> None:
        return None


def _kv_pool(hook: Any) -> Any:
    """A K/V pool whose class's `set_kv_buffer` is wrapped as SGLang's HookRegistry wraps it for an
    AFTER hook (plugins/hook_registry.py:375-383, `__wrapped__` kept): the probe's hook then finds
    the pool's own method and skips the later layers' writes, as on a server."""
    original = _KVPool.set_kv_buffer

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        modified = hook(result, *args, **kwargs)
        return modified if modified is not None else result

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return type("_HookedKVPool", (_KVPool,), {"set_kv_buffer": wrapper})()


class _Alloc:
    """The allocator's figures the pool hook reads (mem_cache/allocator/base.py)."""

    def __init__(self, size: int) -> None:
        self.size = self.free = size

    def available_size(self) -> int:
        return self.free


def make_scheduler(batch: int, hooked: bool) -> tuple[Any, Any]:
    """A scheduler iteration shaped like SGLang 0.5.17's for a steady decode of `batch` requests:
    each call takes one token per request from the pool (released back once the pool runs low)
    and counts one forward; hooked, it then runs the pool-sample hook, as SGLang's
    `get_next_batch_to_run` wrapper does before the forward."""
    alloc = _Alloc(1_000_000)
    running = types.SimpleNamespace(reqs=[object()] * batch)
    plan = types.SimpleNamespace(running_batch=running, batch_to_run=running)
    sched = types.SimpleNamespace(
        token_to_kv_pool_allocator=alloc, waiting_queue=[], forward_ct=0,
        tree_cache=types.SimpleNamespace(evictable_size=lambda: 0, protected_size=lambda: 0),
        pool_stats_observer=types.SimpleNamespace(max_total_num_tokens=alloc.size),
    )
    hook = pool_hooks.after_get_next_batch_to_run

    def iteration() -> None:
        alloc.free = alloc.free - batch if alloc.free > batch else alloc.size
        sched.forward_ct += 1
        if hooked:
            hook(plan, sched)

    return iteration, sched


def per_step_us(fn: Any, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t0) / steps * 1e6


def kept_per_step(fn: Any, fb: Any, steps: int) -> float:
    """Objects moved to the collector's oldest generation per step (see the module's docstring)."""
    moved = 0
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        for i in range(steps):
            fb.rids = list(fb.rids)  # SGLang builds a fresh list for every forward batch
            fn()
            gc.collect(0)
            if i % 10 == 9:
                moved += len(gc.get_objects(generation=1))  # all of them move on
                gc.collect(1)
    finally:
        if was_enabled:
            gc.enable()
    return moved / steps


class GilThread:
    """A thread beside the engine's that does `us` microseconds of Python every 20 ms while `on`
    (`--gil-thread`): the shape of the probe's writer thread before D114."""

    def __init__(self, us: float) -> None:
        self.us, self.on, self.rounds = us, False, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        n = _STRETCH[0] or _calibrate()
        while not self._stop.wait(0.02):
            if self.on:
                self.rounds += 1
                for _ in range(max(round(self.us / 40), 1)):
                    for _ in range(n):
                        pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def paired_blocks(bare_step: Any, hooked_step: Any, pairs: int, steps: int, probe: Probe,
                  gil: GilThread | None) -> tuple[float, tuple[float, float], float]:
    """The hooked step's extra time over the unhooked one, from `pairs` pairs of blocks of `steps`
    steps each, in ABBA order pair by pair (a drift linear in time cancels): the mean over the pairs,
    its 95 % bootstrap interval, and the unhooked step's mean."""
    diffs, bases = [], []
    for i in range(pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {}
        for hooked in order:
            if gil is not None:
                gil.on = hooked
            got[hooked] = per_step_us(hooked_step if hooked else bare_step, steps)
            if gil is not None:
                gil.on = False
            if hooked:
                probe.flush(timeout=600)  # outside the timed block: the unhooked one finds nothing pending
        diffs.append(got[True] - got[False])
        bases.append(got[False])
    rng = random.Random(1)
    boot = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(10_000))
    return statistics.fmean(diffs), (boot[250], boot[9749]), statistics.fmean(bases)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--device", default="cpu", help="cuda: real device copies and events (GPU machine)")
    ap.add_argument("--profile", type=int, default=0, metavar="TOP")
    ap.add_argument("--pool", action="store_true", help="each step also runs the pool-sample hook")
    ap.add_argument("--graphs", action="store_true",
                    help="each step is a decode CUDA-graph replay (`cuda_graph_decode full`): no inner hook")
    ap.add_argument("--engine-us", type=float, default=0.0, metavar="US",
                    help="each step also does US us of the engine's own work (GIL held, let go now and then)")
    ap.add_argument("--engine-touch", type=float, default=0.0, metavar="MIB",
                    help="with --engine-us, the engine's work also reads MIB MiB of its own objects each "
                         "step (caches as cold as a server leaves them; 2 matched an H100's figures)")
    ap.add_argument("--gil-thread", type=float, default=0.0, metavar="US",
                    help="while hooked, a thread beside the engine's does US us of Python every 20 ms")
    ap.add_argument("--blocks", type=int, default=0, metavar="K",
                    help="also measure the engine thread's cost in K alternating pairs of blocks, with a CI")
    ap.add_argument("--registered", action="store_true",
                    help="every row hook left registered with torch, none wrapped")
    ap.add_argument("--control", action="store_true",
                    help="with --blocks, also the unhooked step against itself (the method's floor)")
    ap.add_argument("--reads", type=int, default=0, metavar="CONTEXT",
                    help="DCP 2 with SGLang's block table: every step also hands over its KV slots, and "
                         "every CPTEST_PROBE_READ_EVERY-th step reads the rows of requests of CONTEXT tokens")
    ap.add_argument("--scattered", action="store_true",
                    help="with --reads, each request's rows one pool row in every BATCH, as requests "
                         "decoded in turn leave them (one range per token); without it, one range each")
    ap.add_argument("--read-share", type=float, default=None, metavar="FRACTION",
                    help="the probe's read_share (default: runtime.READ_SHARE; 1: reads never skipped)")
    ap.add_argument("--every-layer", action="store_true",
                    help="every decode step hooks every layer (CPTEST_PROBE_LAYER_STEPS=all), "
                         "not the first step of each copy batch alone")
    ap.add_argument("--no-mask", action="store_true",
                    help="eager steps write K/V without a DCP owner mask (TP1, as measure.sh's eager server)")
    ap.add_argument("--writer", choices=("process", "inline"), default="process",
                    help="who makes and writes the rank file's lines: the probe's writer process (as on a "
                         "server, CPTEST_PROBE_WRITER) or the probe itself on the engine's thread")
    ap.add_argument("--copy-every", type=int, default=runtime.COPY_EVERY, metavar="N",
                    help="steps a copy batch holds at most (default: runtime.COPY_EVERY)")
    ap.add_argument("--copy-within-s", type=float, default=runtime.COPY_WITHIN_S, metavar="S",
                    help="seconds a copy batch stays open at most (default: runtime.COPY_WITHIN_S)")
    a = ap.parse_args()
    if a.engine_touch and not a.engine_us:
        ap.error("--engine-touch needs --engine-us (the touch is part of the engine's work)")
    touch_objects(a.engine_touch)
    shape = {"device": a.device, "graphs": a.graphs, "engine_us": a.engine_us, "dcp_mask": not a.no_mask}
    forward, fb = make_step(a.layers, a.batch, registered=a.registered, **shape)
    bare, _ = make_step(a.layers, a.batch, hooked=False, **shape)
    # What DecodeCudaGraphRunner.load_batch leaves for the probe to read after a replay: the batch
    # padded to a captured size (here the batch itself) and the tokens per request it was captured with.
    runner = types.SimpleNamespace(is_draft_worker=False, decode_cuda_graph_runner=types.SimpleNamespace(
        bs=a.batch, captured_req_width=1))
    if a.reads:
        # SGLang's forward batch and model runner as a DCP decode step reads them: each request's
        # slot, its row of the block table and its length.
        fb.out_cache_loc = torch.arange(a.batch, device=a.device) * 2
        fb.req_pool_indices = torch.arange(a.batch, device=a.device)
        fb.seq_lens_cpu = torch.full((a.batch,), a.reads)
        table = torch.arange(a.batch * a.reads, dtype=torch.int32, device=a.device)
        table = (table.reshape(a.reads, a.batch).T.contiguous() if a.scattered
                 else table.reshape(a.batch, a.reads))
        runner.req_to_token_pool = types.SimpleNamespace(req_to_token=table)
    sched_on, _ = make_scheduler(a.batch, hooked=a.pool)
    sched_off, _ = make_scheduler(a.batch, hooked=False)
    around = hooks.around_model_runner_forward

    def bare_step() -> None:
        sched_off()
        bare(runner, fb)

    def hooked_step() -> None:
        sched_on()
        forward_step()

    def forward_step() -> None:
        around(forward, runner, fb)

    runtime.set_probe(None)
    off = per_step_us(bare_step, a.steps)
    cpu0 = time.process_time()
    per_step_us(bare_step, a.steps)
    off_cpu = (time.process_time() - cpu0) / a.steps * 1e6
    gc_steps = min(a.steps, 2000)
    kept_off = kept_per_step(bare_step, fb, gc_steps)
    gil = GilThread(a.gil_thread) if a.gil_thread else None

    with tempfile.TemporaryDirectory() as d:
        probe = Probe(Path(d), graph_flush_s=1.0, copy_within_s=a.copy_within_s, copy_every=a.copy_every,
                      writer=a.writer)
        runtime.set_probe(probe)
        probe.set_rank(RankId(world=0))
        if a.reads:
            probe.dcp_size = 2
        if a.read_share is not None:
            probe.read_share = a.read_share
        probe.cp_configured = False
        probe.layers_sampled = not a.every_layer
        sample_layers_of(probe, forward)
        cpu0 = time.process_time()
        if gil is not None:
            gil.on = True
        on = per_step_us(hooked_step, a.steps)
        probe.flush(timeout=600)
        on_cpu = (time.process_time() - cpu0) / a.steps * 1e6
        if gil is not None:
            gil.on = False
        kept_on = kept_per_step(hooked_step, fb, gc_steps)
        probe.flush(timeout=600)
        lines = (Path(d) / "rank0.jsonl").read_text().count("\n")
        recs = read_records(Path(d) / "rank0.jsonl")[0]
        steps_read = sum(isinstance(r, Step) for r in recs)
        samples = sum(isinstance(r, PoolSample) for r in recs)
        blocks = (paired_blocks(bare_step, hooked_step, a.blocks, max(a.steps // a.blocks, 1), probe, gil)
                  if a.blocks else None)
        control = (paired_blocks(bare_step, bare_step, a.blocks, max(a.steps // a.blocks, 1), probe, None)
                   if a.blocks and a.control else None)
        # The inner hooks timed as a measuring server times them (`Probe.timed_inner`, installed
        # while `timing` is on): the same model built again with its hooks so wrapped.
        probe.timing = True
        timed_forward, _ = make_step(a.layers, a.batch, registered=a.registered, wrap=probe.timed_inner,
                                     **shape)
        sample_layers_of(probe, timed_forward)
        probe.timing = False
        parts = timed_parts(probe, sched_on, lambda: around(timed_forward, runner, fb), a.steps, off_cpu)
        sample_layers_of(probe, forward)  # the profile and the paused steps run the first model again
        # Paused (CPTEST_PROBE_SWITCH): what the run-time windows leave in both states, the hooks'
        # early returns; SGLang's own hook dispatch is not simulated here.
        if a.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.runcall(per_step_us, hooked_step, a.steps)
            probe.flush(timeout=600)
            pstats.Stats(prof).sort_stats("tottime").print_stats(a.profile)
        probe.paused = True
        paused = per_step_us(hooked_step, a.steps)
        probe.close()
        runtime.set_probe(None)
    if gil is not None:
        gil.stop()
    what = "decode-graph replays" if a.graphs else f"eager decode steps, {a.layers} layers"
    print(f"probe step cost on {a.device}, {what} of {a.batch} requests, {a.steps} steps "
          f"(+{gc_steps} for kept objects; {steps_read} steps read back from {lines} lines, "
          f"{samples} pool samples)"
          + (f"; engine work {a.engine_us:.0f} us a step" if a.engine_us else "")
          + (f", reading {a.engine_touch:g} MiB of objects" if a.engine_touch else "")
          + f"; lines made by {'a writer process' if a.writer == 'process' else 'the probe'}"
          + (f"; a thread of {a.gil_thread:.0f} us every 20 ms beside the engine's while hooked"
             if gil is not None else ""))
    print(f"  engine thread: {on - off:8.1f} us/step  (hooked {on:.1f}, unhooked {off:.1f})")
    if blocks is not None:
        mean, (lo, hi), base = blocks
        print(f"  paired blocks: {mean:8.1f} us/step (95 % CI {lo:.1f} .. {hi:.1f}) over {a.blocks} pairs of "
              f"{max(a.steps // a.blocks, 1)} steps: {100 * mean / base:.2f} % of the unhooked step "
              f"({100 * lo / base:.2f} .. {100 * hi / base:.2f})")
    if control is not None:
        mean, (lo, hi), base = control
        print(f"  control      : {mean:8.1f} us/step (95 % CI {lo:.1f} .. {hi:.1f}), the unhooked step "
              f"against itself in as many pairs: {100 * mean / base:.2f} % "
              f"({100 * lo / base:.2f} .. {100 * hi / base:.2f})")
    print(f"  CPU time     : {on_cpu - off_cpu:8.1f} us/step the probe adds, both threads")
    print(f"  paused       : {paused - off:8.1f} us/step left when switched off (hooks returning at once)")
    print(f"  kept objects : {kept_on - kept_off:8.2f} per step moved to the collector's oldest generation "
          f"by the probe ({kept_on:.2f} hooked, {kept_off:.2f} unhooked)")
    print(parts)
    if a.reads:
        print(f"  reads        : {probe.read_ns / 1e6:.1f} ms finishing the steps that recorded them, "
              f"{probe.read_ns / 1e7 / probe.now():.2f} % of the probe's {probe.now():.1f} s; "
              f"{probe.reads_skipped} sampled step(s) skipped, over its share of {probe.read_share:.2%}")


def timed_parts(probe: Probe, iteration: Any, step: Any, steps: int, off_cpu: float) -> str:
    """The probe's parts of a step as its `cost` notes count them (`Probe.timing`), the pool
    hook's and the chores' time apart, and the CPU time of the engine's thread and of the other
    threads."""
    probe.flush(timeout=600)
    probe.cost = [0] * COST_FIELDS
    probe._write_cost = lambda: None  # type: ignore[method-assign]  # keep the sums (no cost notes)
    probe.timing = True
    clock = time.perf_counter_ns
    pool_ns = 0
    cpu0, thread0 = time.process_time(), time.thread_time()
    for _ in range(steps):
        t0 = clock()
        iteration()
        pool_ns += clock() - t0
        step()
    probe.flush(timeout=600)
    cpu, thread = time.process_time() - cpu0, time.thread_time() - thread0
    probe.timing = False
    del probe._write_cost
    c, probe.cost = probe.cost, [0] * COST_FIELDS
    n = c[1] or 1
    us = [v / n / 1e3 for v in (c[0], c[4], c[5], c[6], c[7])]
    chores = c[18] if len(c) > 18 else 0  # (a probe before D114 has no chores)
    inner = c[19] if len(c) > 19 else 0
    whole = (c[0] + c[11] + chores + inner) / n / 1e3
    return (f"  parts (timed): {us[0]:.1f} us/step = ready {us[1]:.1f} / begin {us[2]:.1f} / end {us[3]:.1f} "
            f"(send {us[4]:.1f}); slow steps (> {SLOW_NS / 1e3:.0f} us) {c[8]} of {c[1]}, "
            f"{c[9] / max(c[8], 1) / 1e3:.0f} us each, {c[9] / n / 1e3:.1f} us per step of all\n"
            + (f"  finishing    : lines {c[21] / n / 1e3:.1f} / write {c[22] / n / 1e3:.1f} / give back "
               f"{c[23] / n / 1e3:.1f} us/step (the copy batches', by phase)\n" if len(c) > 23 else "")
            + f"  pool hook    : {pool_ns / steps / 1e3:8.1f} us/step on the engine thread (with the "
            f"scheduler's own figures and the chores; outside the parts), {c[11] / n / 1e3:.1f} of it the "
            f"hook's own (the cost notes' pool_ns)\n"
            f"  chores       : {chores / n / 1e3:8.1f} us/step; inner hooks {inner / n / 1e3:.1f} us/step "
            f"(timed as a measuring server times them); the probe's whole time on the engine thread "
            f"(the cost notes' engine share): {whole:.1f} us/step\n"
            f"  CPU by thread: engine {thread / steps * 1e6 - off_cpu:.1f} us/step over unhooked, "
            f"other threads {(cpu - thread) / steps * 1e6:.1f} us/step, of which the watchdog's rounds "
            f"{c[10] / n / 1e3:.1f} (sends {c[15] / n / 1e3:.1f}, finishing {c[16] / n / 1e3:.1f}, "
            f"lines {c[17] / n / 1e3:.1f})")


if __name__ == "__main__":
    main()
