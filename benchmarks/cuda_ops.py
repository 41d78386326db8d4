"""Benchmark of the CUDA calls the probe makes, each on its own, per call (GPU machine).

`benchmarks/probe_step.py` says what a probed step costs the engine's thread in all; on the GPU
machine (under gVisor) its CUDA run costs twice its CPU run (results/_measure run5: 41.6 against
21.2 us a step, batch 64). This times each operation of the probe's device path alone, so that
the difference can be put where it belongs: the copy batch's `torch.cat`, the host copy with
`non_blocking=True`, an event's creation, record, query (done and still pending) and
synchronize, a tensor's `.device` compared, `.dim()`, and `.numpy()` of the host copy.

    python benchmarks/cuda_ops.py [--calls 2000] [--batch 64] [--steps 16]

Prints one line per operation: microseconds per call (median of 5 repeats).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def per_call_us(fn: Callable[[], Any], calls: int, repeats: int = 5) -> float:
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs)


def _enter_exit(ctx: Any) -> None:
    with ctx:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=16, help="tensors per copy batch")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    dev = torch.device("cuda", 0)
    pos = torch.arange(a.batch, device=dev)
    mask = pos % 2 == 0
    parts = [pos, mask] * a.steps
    flat = torch.cat(parts)
    stream = torch.cuda.current_stream(dev)
    done = torch.cuda.Event()
    done.record()
    torch.cuda.synchronize()
    host = flat.to("cpu", non_blocking=True)
    torch.cuda.synchronize()

    def pending_query() -> bool:
        torch.cuda._sleep(2000)  # the device busy: the event after it is not reached yet
        e = torch.cuda.Event()
        e.record()
        return e.query()

    sleep_only = per_call_us(lambda: torch.cuda._sleep(2000), a.calls)
    ops: list[tuple[str, Callable[[], Any]]] = [
        ("torch.cat of the batch's tensors", lambda: torch.cat(parts)),
        ("host copy, non_blocking (pinned)", lambda: flat.to("cpu", non_blocking=True)),
        ("cat + host copy + event + record", lambda: (torch.cat(parts).to("cpu", non_blocking=True),
                                                      torch.cuda.Event().record())),
        ("torch.cuda.Event()", torch.cuda.Event),
        ("event.record()", done.record),
        ("event.query(), done", done.query),
        ("event.synchronize(), done", done.synchronize),
        ("torch.cuda.current_stream(dev)", lambda: torch.cuda.current_stream(dev)),
        ("with torch.cuda.stream(s): pass", lambda: _enter_exit(torch.cuda.stream(stream))),
        ("tensor.device == device", lambda: pos.device == dev),
        ("tensor.is_cuda", lambda: pos.is_cuda),
        ("tensor.dim()", pos.dim),
        ("host.numpy()", host.numpy),
    ]
    print(f"CUDA calls of the probe, {a.steps} steps x (positions + mask) of {a.batch} per batch; "
          f"us per call (median of 5 x {a.calls})")
    for name, fn in ops:
        us = per_call_us(fn, a.calls)
        torch.cuda.synchronize()
        print(f"  {name:<36} {us:8.2f}")
    pq = per_call_us(pending_query, a.calls // 4) - sleep_only
    print(f"  {'event create+record+query, pending':<36} {pq:8.2f}  (a device sleep's launch subtracted)")


if __name__ == "__main__":
    main()
