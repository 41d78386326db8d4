"""Benchmark of `cptest.checks`: load + check of synthetic archives, rows per second.

What a *row* is: one token row of one request in one forward step on one rank, i.e. the rows a
Step record covers (`rows_in`), summed over every Step record of every rank. Two archives share
the row budget (`--rows`, default 10^6): a DCP run (world 4, dcp 4: one extend step of every prompt,
then decode steps; K/V written by rank p % 4) and a PCP run (world 4, attn_cp 4, zigzag extend
steps). Both are checked with `rows`, `capacity`, `serving` and `generation`-free plans, so the
time is dominated by reading and judging Step records. Target: whole check <= 5 s on 2 cores.

Second measurement (`--records`, default 10^5, 0 to skip): the per-record path, 10^5 JSON lines of
small decode Step records (4 ranks x 25k steps, 21 MB: 10^6 would be over the evidence one check
reads, cptest/bounds.py), checked with `rows dcp_owner`: the loader's cost
per record rather than per row.

    python benchmarks/checks.py [--rows N] [--records N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from cptest.checks import check
from cptest.contracts import CapacityParams, RowsParams, ServingParams
from cptest.evidence import Capacity, KvPool, Lifecycle, RequestResult, ServerInfo
from cptest.testing.archives import (
    PINNED_LOG_PATTERNS,
    dcp_steps,
    make_plan,
    rank_id,
    rid,
    server_plan,
    write_archive,
    zigzag_steps,
)

WORLD = 4
FINISHED = Lifecycle(event="shutdown_done", detail={"all_exited": True})
"""The runner's record of a run that ended: without it a check says the run is unknown (D19)."""


def _capacity(world: int, mult: int) -> list:
    return [
        KvPool(rank=rank_id(world, dcp=mult), rows=100_000, allocator_size=100_000 * mult),
        Capacity(rank=rank_id(world, dcp=mult), max_total_num_tokens=100_000 * mult),
    ]


def dcp_archive(root: Path, rows: int) -> tuple[Path, int, int]:
    """DCP4 run with 64 requests of 512 prompt tokens; decode steps fill the row budget."""
    n_req, plen = 64, 512
    per_rank = rows // WORLD
    decode = max((per_rank - n_req * plen) // n_req, 1)
    prompts = {rid(i): plen for i in range(n_req)}
    expects = [
        RowsParams(mode="dcp_owner", dcp=WORLD),
        CapacityParams(multiplier=WORLD, log_patterns=PINNED_LOG_PATTERNS),
        ServingParams(completed_min=n_req),
    ]
    plan = make_plan(
        server_plan(world=WORLD, dcp=WORLD),
        expects,
        requests=n_req,
        prompt_len=plen,
        max_new_tokens=decode + 1,
        scenario="bench_dcp",
    )
    ranks = {w: [*_capacity(w, WORLD), *dcp_steps(w, WORLD, prompts, decode)] for w in range(WORLD)}
    n_rows = sum(s.rows_in for recs in ranks.values() for s in recs if getattr(s, "kind", "") == "step")
    n_recs = sum(len(r) for r in ranks.values())
    runner = [ServerInfo(info={"max_total_num_tokens": 100_000 * WORLD}), FINISHED] + [
        RequestResult(
            index=i,
            prompt_len=plen,
            max_new_tokens=decode + 1,
            prompt_sha256="x",
            status="ok",
            output_ids=[7] * (decode + 1),
        )
        for i in range(n_req)
    ]
    return write_archive(root / "dcp", plan, ranks={"main": ranks}, runner={"main": runner}), n_rows, n_recs


def pcp_archive(root: Path, rows: int) -> tuple[Path, int, int]:
    """PCP4 zigzag run: extend steps of 8 requests x 128 tokens (each rank's rows_in is the batch)."""
    batch, plen = 8, 128
    steps = max(rows // (WORLD * batch * plen), 1)
    expects = [
        RowsParams(mode="pcp_split", cp=WORLD, strategy="zigzag", ffn="local"),
        CapacityParams(multiplier=1, log_patterns=PINNED_LOG_PATTERNS),
    ]
    plan = make_plan(
        server_plan(world=WORLD, attn_cp=WORLD, cp_strategy="zigzag"),
        expects,
        requests=1,
        scenario="bench_pcp",
    )
    ranks = {w: [*_capacity(w, 1)] for w in range(WORLD)}
    for s in range(steps):
        prompts = {rid(s * batch + i): plen for i in range(batch)}
        for w in range(WORLD):
            ranks[w].append(zigzag_steps(w, WORLD, prompts, step=s))
    n_rows = steps * batch * plen * WORLD
    runner = [ServerInfo(info={"max_total_num_tokens": 100_000}), FINISHED]
    return (
        write_archive(root / "pcp", plan, ranks={"main": ranks}, runner={"main": runner}),
        n_rows,
        sum(len(r) for r in ranks.values()),
    )


def records_archive(root: Path, records: int) -> Path:
    """`records` small decode Step lines over 4 ranks (4 requests each), written as raw JSON lines."""
    steps = records // WORLD
    n_req, plen = 4, 16
    expects = [RowsParams(mode="dcp_owner", dcp=WORLD)]
    plan = make_plan(server_plan(world=WORLD, dcp=WORLD), expects, requests=n_req, scenario="bench_records")
    d = write_archive(root / "records", plan, ranks={"main": {}}, runner={"main": [FINISHED]})
    for w in range(WORLD):
        extend = next(dcp_steps(w, WORLD, {rid(i): plen for i in range(n_req)}, 0))
        out = d / "evidence" / "main" / f"rank{w}.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        head = json.dumps(
            {
                "v": 1,
                "t": 0.0,
                "kind": "step",
                "rank": {"world": w, "tp": w, "dcp": w},
                "mode": "decode",
                "batch_size": n_req,
                "rows_in": n_req,
                "attn_rows": n_req,
            }
        )[:-1]
        with out.open("w") as f:
            f.write(extend.model_dump_json() + "\n")
            for k in range(steps - 1):
                pos = plen + k
                kv = (
                    ", ".join(f'"{rid(i)}": [[{pos}, {pos + 1}]]' for i in range(n_req))
                    if pos % WORLD == w
                    else ""
                )
                f.write(f'{head}, "step": {k + 1}, "kv_written": {{{kv}}}}}\n')
    return d


def check_gathered(d: Path):
    """Check as the run finishing an archive does (no manifest phase yet): these archives are
    synthetic evidence, never finished by a cptest run; the runner's FINISHED record says it ended."""
    return check(d, require_finished=False)


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--keep", type=Path, default=None, help="write archives here and keep them")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="cptest-bench-"))
    try:
        (dcp, dcp_rows, dcp_recs), gen1 = timed(dcp_archive, root, args.rows // 2)
        (pcp, pcp_rows, pcp_recs), gen2 = timed(pcp_archive, root, args.rows - args.rows // 2)
        print(f"generated {dcp_rows + pcp_rows} rows in {dcp_recs + pcp_recs} records ({gen1 + gen2:.2f} s)")
        total = 0.0
        for name, d, rows, recs in (("dcp", dcp, dcp_rows, dcp_recs), ("pcp", pcp, pcp_rows, pcp_recs)):
            verdict, secs = timed(check_gathered, d)
            total += secs
            assert verdict.status == "pass", [(v.checker, v.status, v.reason) for v in verdict.verdicts]
            print(f"  {name}: {rows} rows, {recs} records, check {secs:.2f} s, {rows / secs:,.0f} rows/s")
        rows = dcp_rows + pcp_rows
        print(
            f"rows path: {rows} rows checked in {total:.2f} s = {rows / total:,.0f} rows/s "
            f"(target <= 5 s: {'met' if total <= 5 else 'MISSED'})"
        )
        if args.records:
            d, gen3 = timed(records_archive, root, args.records)
            verdict, secs = timed(check_gathered, d)
            assert verdict.status == "pass", [(v.checker, v.status, v.reason) for v in verdict.verdicts]
            print(
                f"records path: {args.records} JSON-line records generated in {gen3:.1f} s, checked in "
                f"{secs:.2f} s = {args.records / secs:,.0f} records/s"
            )
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
