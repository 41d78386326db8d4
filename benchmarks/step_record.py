"""Benchmark of an eager step's record as the probe finishes it on the engine's thread
(`cptest.probe.records.finish_step_line`): a prefill of many requests, with the pool rows its KV
writes went to, and a decode step that recorded its reads.

For each shape it prints the milliseconds per record as the probe makes it, and with the per-value
loops forced (`record_base.ARRAY_FROM` out of reach: what a prefill's ranges and slot runs cost
before they were found in one pass). The record is the same either way.

    python benchmarks/step_record.py [--repeat N] [--requests B] [--tokens L]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from cptest import record_base
from cptest.evidence import RankId
from cptest.probe.records import StepDraft, finish_step_line, read_rows

RANK = RankId(world=0)
RANK_JSON = RANK.model_dump_json()


def prefill(b: int, tokens: int, paged: bool) -> Callable[[], str]:
    """`b` requests of `tokens` new tokens from position 0, their pool rows one block each (as a
    fresh pool hands them out) or pages of 64 rows at scattered places."""
    rng = np.random.default_rng(0)
    positions = np.tile(np.arange(tokens), b)
    if paged:
        starts = rng.permutation(b * tokens // 64 + 1)[: -(-b * tokens // 64)] * 64
        slots = np.concatenate([np.arange(s, s + 64) for s in starts])[: b * tokens]
    else:
        slots = np.arange(1000, 1000 + b * tokens)
    rids = [f"{k:032x}" for k in range(b)]

    def one() -> str:
        d = StepDraft(step=1, mode="extend", batch_size=b, rows_in=b * tokens, rids=list(rids),
                      extend_lens=[tokens] * b, prefix_lens=[0] * b)
        d.kv_rows = b * tokens
        d.kv_slots = slots.copy()
        return finish_step_line(d, rank=RANK, rank_json=RANK_JSON, t=1.0, positions=positions.copy())

    return one


def decode_with_reads(b: int, length: int) -> Callable[[], str]:
    """A decode step of `b` requests `length` long that recorded the reads of the first three."""
    rng = np.random.default_rng(1)
    positions = np.full(b, length - 1)
    slots = rng.integers(0, 500_000, b)
    rids = [f"{k:032x}" for k in range(b)]
    starts = rng.integers(0, 10**4, 3 * -(-length // 64)) * 64
    table = np.concatenate([np.arange(s, s + 64) for s in starts])[: 3 * length]

    def one() -> str:
        d = StepDraft(step=1, mode="decode", batch_size=b, rows_in=b, rids=list(rids))
        d.kv_rows, d.kv_slots = b, slots.copy()
        d.kv_read = read_rows(table, [length] * 3, rids[:3], 1, 0) or {}
        return finish_step_line(d, rank=RANK, rank_json=RANK_JSON, t=1.0, positions=positions.copy())

    return one


def _per_call_ms(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    b, n = args.requests, args.tokens
    shapes = [(f"prefill {b} x {n}, one block each", prefill(b, n, paged=False)),
              (f"prefill {b} x {n}, pages of 64", prefill(b, n, paged=True)),
              (f"decode {b} x {n * 32} with 3 requests' reads", decode_with_reads(b, n * 32))]
    print(f"an eager step's record on the engine's thread (numpy {np.__version__}); ms per record")
    for name, fn in shapes:
        now = _per_call_ms(fn, args.repeat)
        kept = record_base.ARRAY_FROM
        record_base.ARRAY_FROM = 1 << 62  # the per-value loops alone
        try:
            line = fn()
            looped = _per_call_ms(fn, args.repeat)
        finally:
            record_base.ARRAY_FROM = kept
        same = "same record" if line == fn() else "RECORDS DIFFER"
        print(f"  {name:45s} {now:7.2f}   per-value loops {looped:7.2f}   {same}")


if __name__ == "__main__":
    main()
