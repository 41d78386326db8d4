"""Benchmark of the probe's reads of a sampled decode step (`cptest.probe.records.read_rows`), the
work its writer thread does under the GIL while the engine's thread may wait for it.

For a few batch shapes that fill the probe's cap on block-table values per sampled step
(`READ_CELLS_MAX`: a few long requests, many short ones), it prints the microseconds per call of:
- `read_rows` as the probe runs it (one request at a time up to `READ_ONE_AT_A_TIME`, else all at once);
- each way forced (`one at a time`, `all at once`), which is what chooses `READ_ONE_AT_A_TIME`;
- `np.unique` against the sort the probe uses instead (`_sorted_once`), on one request's share.

    python benchmarks/read_rows.py [--repeat N] [--dcp D]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from cptest.probe import records
from cptest.probe.runtime import READ_CELLS_MAX


def _per_call_us(fn: Callable[..., Any], *args: Any, repeat: int) -> float:
    fn(*args)
    t = time.perf_counter()
    for _ in range(repeat):
        fn(*args)
    return (time.perf_counter() - t) / repeat * 1e6


def _paged_rows(rng: Any, width: int, page: int = 64) -> Any:
    """One request's block-table row: pages of consecutive slots at random places, as a paged pool
    hands them out."""
    starts = rng.integers(0, 10**6, -(-width // page)) * page
    return np.concatenate([np.arange(p, p + page) for p in starts])[:width]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=300)
    ap.add_argument("--dcp", type=int, default=2)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"read_rows per sampled step, DCP {a.dcp} rank 1, cap {READ_CELLS_MAX} block-table values "
          f"(numpy {np.__version__}); us per call")
    for n in (1, 2, 4, 8, 16, 64):
        width = READ_CELLS_MAX // n
        table = np.concatenate([_paged_rows(rng, width) for _ in range(n)]).astype(np.int64)
        rows = table.reshape(n, width)
        args = (table, [width] * n, [f"r{k}" for k in range(n)], a.dcp, 1)
        want = records._read_each(np, rows, *args[1:])
        assert records.read_rows(*args) == want
        assert records._read_all(np, rows, *args[1:]) == want
        probe = _per_call_us(records.read_rows, *args, repeat=a.repeat)
        one = _per_call_us(records._read_each, np, rows, *args[1:], repeat=a.repeat)
        every = _per_call_us(records._read_all, np, rows, *args[1:], repeat=a.repeat)
        share = rows[0][1::a.dcp] // a.dcp
        unique = _per_call_us(np.unique, share, repeat=a.repeat)
        sort = _per_call_us(records._sorted_once, np, share, repeat=a.repeat)
        print(f"  {n:3d} request(s) of {width:6d} tokens: read_rows {probe:7.1f}  one at a time {one:7.1f}  "
              f"all at once {every:7.1f}   one share: np.unique {unique:6.1f}  sort {sort:5.1f}")


if __name__ == "__main__":
    main()
