"""Workload fidelity: cptest's client and SGLang's own `sglang.bench_serving` on one request set.

    python3 tools/device/fidelity.py SCENARIO --port P --out DIR [--rounds 8]

Runs on the GPU machine against one running SGLang server that has a tokenizer (bench_serving
reads streamed text; tools/device/tiny_tokenizer.py gives a tiny model one). The request set is
the scenario's planned workload (cptest's own planner: token ids, output lengths, concurrency),
with `ignore_eos` so that every request produces exactly its planned tokens, and the same
`return_logprob` body cptest always sends; bench_serving is given exactly these requests (its
`get_dataset` is replaced by the plan's rows, nothing else of it) and the same concurrency, at an
unlimited request rate. One warm-up pass of each client, then `rounds` rounds of one run of each,
in ABBA order (bench, cptest, cptest, bench, ...), so that a drift of the machine hits both alike.

Compared per round, as the ratio cptest / bench_serving of the round's two runs: output throughput
(output tokens / wall time from the first request sent to the last finished; bench_serving's
`output_throughput` is the same) and mean and median TTFT. Printed: the median of the rounds'
ratios and the mean with a 95 % bootstrap interval (10000 resamples of the rounds), and each
client's median over its rounds. (results/_measure run4 compared the clients' medians over three
rounds: TTFT fell over the rounds by more than the clients differed, so the ratio read the
order of the rounds.) Writes DIR/fidelity.json (every run of both).

`--paired` (docs/decisions.md D65): both clients at once, each in its own process on its own CPUs,
each sending half of the request set (even and odd indices) at half the concurrency, so that the
server sees the same total load and both clients measure the same moments of it: a drift of the
machine (run15: output throughput fell from 5,700 to 4,200 tok/s over five minutes, rounds spread
+-20 %) hits both within the round instead of between runs. Each client waits at a barrier placed
just before its timed span (cptest's: after the driver's collection, before its first request;
bench_serving's: its one-second pause after the warm-up request); the halves swap every round, so
that over a pair of rounds each client has sent the whole request set. Compared per pair of
rounds: output throughput (tokens / seconds of both runs) and the median and mean TTFT over the
pair's requests, per-request TTFTs from both (bench_serving's `--output-details`). Each client's
event-loop lag (a 5 ms sleep's overshoot, sampled in its own loop) is recorded per run.
Writes DIR/fidelity-paired.json.

    python3 tools/device/fidelity.py --pool A/fidelity-paired.json B/fidelity-paired.json --out F.json

pools the pairs of several paired calls into one summary (`pool_paired`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import multiprocessing
import os
import random
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

import aiohttp

from cptest import pipeline
from cptest.plan.model import WorkloadPlan
from cptest.run.driver import WorkloadDriver
from cptest.run.evidence_writer import RecordWriter

LOGPROB_BODY = {"return_logprob": True, "logprob_start_len": -1}
"""What cptest's driver sends besides the sampling parameters (`driver.build_payload`)."""


def planned_workload(scenario: Path) -> WorkloadPlan:
    prepared = pipeline.prepare(scenario, engine="sglang", gpu_present=True)
    w = prepared.plan.workload
    reqs = [r.model_copy(update={"sampling": r.sampling.model_copy(update={"ignore_eos": True}),
                                 "return_logprob": True}) for r in w.requests]
    return w.model_copy(update={"requests": reqs})


class LagMonitor:
    """The event loop's lag: how late a 5 ms sleep wakes, sampled in the client's own loop once
    `arm()` was called (the timed span), as a client busy on its loop reads every later chunk late."""

    PERIOD_S = 0.005

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.armed = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def arm(self) -> None:
        self.armed = True

    async def _run(self) -> None:
        clock = time.perf_counter
        while True:
            t = clock()
            await asyncio.sleep(self.PERIOD_S)
            if self.armed:
                self.samples.append(clock() - t - self.PERIOD_S)

    def stop(self) -> dict[str, Any]:
        if self._task is not None:
            self._task.cancel()
        return lag_summary(self.samples)


def lag_summary(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"samples": 0}
    ordered = sorted(samples)
    at = lambda q: 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"samples": len(ordered), "p50_ms": round(at(0.5), 3), "p99_ms": round(at(0.99), 3),
            "max_ms": round(1000 * ordered[-1], 3), "over_1ms": sum(x > 0.001 for x in ordered)}


class PhaseTrace:
    """Where each request's time to its first answer goes, as aiohttp sees it (`--trace`): installed
    into every aiohttp session of the process, so cptest's client and bench_serving are timed by
    the same callbacks. Per request: request start -> connection made -> request headers sent ->
    body sent -> response headers -> first body bytes. Each callback costs both clients alike."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.armed = False
        tc = aiohttp.TraceConfig()
        clock = time.perf_counter

        async def start(_s: Any, ctx: Any, _p: Any) -> None:
            ctx.t = {"start": clock()}

        async def mark(name: str, ctx: Any) -> None:
            t = getattr(ctx, "t", None)
            if t is not None and name not in t:
                t[name] = clock()

        async def conn(_s: Any, ctx: Any, _p: Any) -> None:
            await mark("conn", ctx)

        async def headers_sent(_s: Any, ctx: Any, _p: Any) -> None:
            await mark("headers_sent", ctx)

        async def body_sent(_s: Any, ctx: Any, _p: Any) -> None:
            t = getattr(ctx, "t", None)
            if t is not None:
                t["body_sent"] = clock()  # the last chunk's time

        async def response(_s: Any, ctx: Any, params: Any) -> None:
            t = getattr(ctx, "t", None)
            if t is not None:
                t["response"] = clock()
                if self.armed:
                    # the reader stays referenced until `take`, so its id names it alone
                    self.rows.append(t | {"reader": params.response.content})

        tc.on_request_start.append(start)
        tc.on_connection_create_end.append(conn)
        tc.on_connection_reuseconn.append(conn)
        tc.on_request_headers_sent.append(headers_sent)
        tc.on_request_chunk_sent.append(body_sent)
        tc.on_request_end.append(response)
        self.config = tc
        self.first_fed: dict[int, float] = {}
        """id(StreamReader) -> when its first body bytes arrived (aiohttp's on_response_chunk_received
        fires only for `read()`, not for a streamed `content`, so the reader's feed is timed)."""

    def install(self) -> None:
        """Every ClientSession made from now on in this process carries the trace."""
        original = aiohttp.ClientSession.__init__
        trace = self

        def init(session: Any, *a: Any, trace_configs: Any = None, **k: Any) -> None:
            original(session, *a, trace_configs=[*(trace_configs or []), trace.config], **k)

        aiohttp.ClientSession.__init__ = init  # type: ignore[method-assign]
        feed = aiohttp.streams.StreamReader.feed_data
        first_fed = self.first_fed

        def feed_data(reader: Any, data: bytes, *a: Any, **k: Any) -> Any:
            if data and not reader.total_bytes:
                first_fed[id(reader)] = time.perf_counter()
            return feed(reader, data, *a, **k)

        aiohttp.streams.StreamReader.feed_data = feed_data  # type: ignore[method-assign]

    def take(self) -> dict[str, Any]:
        rows, self.rows = self.rows, []
        for t in rows:
            first = self.first_fed.pop(id(t.pop("reader")), None)
            if first is not None:
                t["first"] = first
        self.first_fed.clear()
        return phase_summary(rows)


PHASES = (("connect", "start", "conn"), ("headers_sent", "conn", "headers_sent"),
          ("body_sent", "headers_sent", "body_sent"), ("server_headers", "body_sent", "response"),
          ("to_first_chunk", "response", "first"), ("start_to_first_chunk", "start", "first"))
"""(name, from, to) of each phase `PhaseTrace` reports, in milliseconds."""


def phase_summary(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Median and p90 of each phase over the requests that had both ends (ms)."""
    out: dict[str, Any] = {"requests": len(rows)}
    for name, a, b in PHASES:
        v = sorted(1000 * (r[b] - r[a]) for r in rows if a in r and b in r)
        if v:
            out[name] = {"p50": round(statistics.median(v), 3), "p90": round(v[int(0.9 * (len(v) - 1))], 3)}
    return out


def run_cptest(workload: WorkloadPlan, port: int, out: Path, keepalive: bool = False,
               gc_off: bool = False, barrier: Any = None) -> dict[str, Any]:
    """One run of cptest's client; `gc_off`: Python's cyclic collector disabled for the run (a
    hypothesis under test: collections of older generations pausing the event loop)."""
    if gc_off:
        gc.collect()
        gc.disable()
    try:
        out_run = _run_cptest(workload, port, out, keepalive, barrier)
    finally:
        gc.enable()
    out_run["gc_off"] = gc_off
    if gc_off:
        out_run["client"] = "cptest-nogc"
    return out_run


def _run_cptest(workload: WorkloadPlan, port: int, out: Path, keepalive: bool,
                barrier: Any = None) -> dict[str, Any]:
    writer = RecordWriter(out, background=True)  # as the runner's (D70)
    lag = LagMonitor()

    class Synced(WorkloadDriver):
        """The committed driver; the barrier and the lag monitor begin where its timed work begins
        (after `arun`'s collection, before the first request)."""

        async def _arun(self):  # type: ignore[no-untyped-def]
            lag.start()
            if barrier is not None:
                barrier.wait(timeout=600)
            lag.arm()
            return await super()._arun()

    try:
        driver = Synced(f"http://127.0.0.1:{port}", workload, role="main", writer=writer,
                        connection_per_request=not keepalive)
        summary = asyncio.run(driver.arun())
    finally:
        writer.close()
    ok = [r for r in summary.results if r.status == "ok"]
    start = min(r.sent_at for r in ok)
    end = max(r.sent_at + (r.e2e_s or 0.0) for r in ok)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    # The first chunk with a token id, where it came before the first text (bench_serving's event).
    by_token = [r.ttft_token_s if r.ttft_token_s is not None else r.ttft_s
                for r in ok if r.ttft_s is not None]
    return {"client": "cptest", "completed": len(ok), "failed": len(summary.results) - len(ok),
            "duration_s": end - start, "output_tokens": sum(len(r.output_ids) for r in ok),
            "output_throughput": sum(len(r.output_ids) for r in ok) / (end - start),
            "mean_ttft_ms": 1000 * statistics.fmean(ttfts), "median_ttft_ms": 1000 * statistics.median(ttfts),
            "median_ttft_token_ms": 1000 * statistics.median(by_token),
            "text_after_token": sum(r.ttft_token_s is not None and r.ttft_token_s < r.ttft_s for r in ok
                                    if r.ttft_s is not None),
            "keepalive": keepalive, "lag": lag.stop(),
            "ttfts_ms": [round(1000 * t, 3) for t in ttfts]}


def _without_hf_datasets() -> None:
    """bench_serving's dataset package imports Hugging Face `datasets` at the top for its MMMU and
    LongBench loaders, which the offline bundle lacks; a module whose `load_dataset` refuses stands
    in, so those loaders fail if ever used and nothing else of bench_serving changes."""
    if "datasets" in sys.modules or importlib.util.find_spec("datasets") is not None:
        return

    def load_dataset(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("Hugging Face datasets is not installed here")

    stand_in = types.ModuleType("datasets")
    stand_in.load_dataset = load_dataset  # type: ignore[attr-defined]
    sys.modules["datasets"] = stand_in


class _SyncedTime:
    """bench_serving's `time` module, except that the one-second pause between its warm-up and its
    timed span (serving.py:1451, `time.sleep(1.0)` inside `benchmark`) waits at the barrier
    instead (paired runs), while `armed` (set only inside `benchmark`; its server-wait loop also
    sleeps 1 s); the lag monitor is armed there, where the timed span begins."""

    def __init__(self, barrier: Any, lag: LagMonitor) -> None:
        self.barrier, self.lag, self.armed = barrier, lag, False

    def sleep(self, seconds: float) -> None:
        if self.armed and seconds == 1.0:
            self.armed = False
            if self.barrier is not None:
                self.barrier.wait(timeout=600)
            else:
                time.sleep(seconds)
            self.lag.arm()
        else:
            time.sleep(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def run_bench_serving(workload: WorkloadPlan, port: int, out: Path, barrier: Any = None) -> dict[str, Any]:
    _without_hf_datasets()
    from sglang.benchmark import serving
    from sglang.benchmark.datasets import DatasetRow

    lag = LagMonitor()
    original = getattr(serving, "_cptest_original_benchmark", serving.benchmark)
    serving._cptest_original_benchmark = original  # type: ignore[attr-defined]
    synced = _SyncedTime(barrier, lag)
    serving.time = synced  # type: ignore[assignment]

    async def benchmark(*a: Any, **k: Any) -> Any:
        lag.start()
        synced.armed = True
        try:
            return await original(*a, **k)
        finally:
            synced.armed = False

    serving.benchmark = benchmark

    rows = [DatasetRow(prompt=list(r.input_ids), prompt_len=len(r.input_ids), output_len=r.max_new_tokens)
            for r in workload.requests]
    serving.get_dataset = lambda *_a, **_k: rows  # the plan's requests instead of a generated set
    temperature = workload.requests[0].sampling.temperature or 0.0
    sys.argv = ["bench_serving", "--backend", "sglang", "--host", "127.0.0.1", "--port", str(port),
                "--dataset-name", "random-ids", "--tokenize-prompt", "--num-prompts", str(len(rows)),
                "--max-concurrency", str(workload.concurrency), "--request-rate", "inf",
                "--temperature", str(temperature), "--extra-request-body", json.dumps(LOGPROB_BODY),
                "--disable-tqdm", "--output-file", str(out), "--warmup-requests", "1", "--output-details"]
    try:
        serving.cli_main()
    finally:
        serving.time = time  # type: ignore[assignment]
    r = json.loads(out.read_text().splitlines()[-1])
    return {"client": "bench_serving", "completed": r["completed"], "duration_s": r["duration"],
            "output_tokens": r["total_output_tokens"], "output_throughput": r["output_throughput"],
            "mean_ttft_ms": r["mean_ttft_ms"], "median_ttft_ms": r["median_ttft_ms"], "lag": lag.stop(),
            "ttfts_ms": [round(1000 * t, 3) for t in r.get("ttfts", []) if t]}


def _pair(pair: list[dict[str, Any]], metric: str, theirs: str | None = None, mine: str = "cptest") -> float:
    by = {r["client"]: r for r in pair}
    return by[mine][metric] / by["bench_serving"][theirs or metric]


class GcWatch:
    """Collections of generations 1 and 2 while a client runs (both clients share this process)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []
        self._t = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        elif info.get("generation", 0) >= 1:
            self.seen.append((info["generation"], time.perf_counter() - self._t))

    def take(self) -> dict[str, Any]:
        seen, self.seen = self.seen, []
        return {"gen1": sum(g == 1 for g, _ in seen), "gen2": sum(g == 2 for g, _ in seen),
                "gen2_ms": round(1000 * sum(d for g, d in seen if g == 2), 3),
                "max_ms": round(1000 * max((d for _, d in seen), default=0.0), 3)}


def bootstrap(values: list[float], n: int = 10_000, seed: int = 1) -> tuple[float, float]:
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


def halves(workload: WorkloadPlan) -> list[WorkloadPlan]:
    """The request set split by index parity, each half at half the concurrency (at least 1)."""
    conc = max(1, (workload.concurrency or 2) // 2)
    return [workload.model_copy(update={"requests": workload.requests[k::2], "concurrency": conc})
            for k in (0, 1)]


def _paired_worker(client: str, parts: list[WorkloadPlan], port: int, out: Path,
                   barrier: Any, tasks: Any, results: Any, trace: bool = False) -> None:
    """One client's process: runs its half of each round when told, at the barrier, and reports.
    `client` "control": cptest's client again (an A/A run: the paired design's own floor).
    `trace`: each run also reports where its requests' time to the first chunk went (PhaseTrace)."""
    phases = PhaseTrace() if trace else None
    if phases is not None:
        phases.install()
        phases.armed = True
    while (task := tasks.get()) is not None:
        i, half, cpus = task
        if cpus:
            os.sched_setaffinity(0, cpus)
        try:
            if client == "bench":
                run = run_bench_serving(parts[half], port, out / f"paired-bench-{i}.jsonl", barrier)
            else:
                run = run_cptest(parts[half], port, out / f"paired-{client}-{i}.jsonl", barrier=barrier)
                run["client"] = "cptest" if client == "cptest" else OTHER[client]
            run.update(round=i, half=half)
            if phases is not None:
                run["phases_ms"] = phases.take()  # bench_serving's one warm-up request included
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which stops the rounds
            barrier.abort()
            run = {"client": client, "round": i, "error": f"{type(e).__name__}: {e}"}
        results.put(run)


OTHER = {"bench": "bench_serving", "control": "cptest-control"}
"""The second client of a paired run, by worker role: what its runs are labelled."""


def assignment(i: int) -> tuple[int, int]:
    """Round i's half and CPU set for cptest's client (the other client gets the other of each).
    The CPU sets alternate every round and the halves every round within a pair, in the order
    (0, A) (1, B), (1, A) (0, B), ...: each pair of rounds sends both halves through each client,
    and each client runs on both CPU sets, so neither the halves nor the sets favour a client."""
    return (i % 2) ^ ((i // 2) % 2), i % 2


def run_paired(workload: WorkloadPlan, port: int, out: Path, rounds: int, cpus: list[set[int] | None],
               deadline: float | None, other: str = "bench", trace: bool = False) -> list[dict[str, Any]]:
    """`rounds` rounds of cptest's client and `other` ("bench" or "control") at once; stops at the
    first even round count past `deadline` (time.time()) or at a client's error. Returns every run,
    in round order."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    parts = halves(workload)
    roles = ("cptest", other)
    queues = {c: (ctx.Queue(), ctx.Queue()) for c in roles}
    procs = [ctx.Process(target=_paired_worker, args=(c, parts, port, out, barrier, *queues[c], trace),
                         daemon=True) for c in roles]
    for pr in procs:
        pr.start()
    runs: list[dict[str, Any]] = []
    t0 = time.time()
    try:
        for i in range(rounds):
            if i % 2 == 0 and deadline is not None and time.time() > deadline:
                print(f"deadline: stopping after {i} rounds", flush=True)
                break
            half, mine = assignment(i)
            queues["cptest"][0].put((i, half, cpus[mine]))
            queues[other][0].put((i, 1 - half, cpus[1 - mine]))
            pair = [queues[c][1].get(timeout=900) for c in roles]
            for run in pair:
                run["at_s"] = round(time.time() - t0, 1)
                print(json.dumps({k: v for k, v in run.items() if k != "ttfts_ms"}), flush=True)
            runs += pair
            if any("error" in r for r in pair):
                print("a client failed: stopping the paired rounds", flush=True)
                break
    finally:
        for c in queues:
            queues[c][0].put(None)
        for pr in procs:
            pr.join(timeout=30)
    return runs


def paired_summary(runs: list[dict[str, Any]], theirs_name: str = "bench_serving") -> dict[str, Any]:
    """Per pair of rounds (the halves swapped, so each client sent the whole set once): cptest's
    figure over bench_serving's for output throughput and the median and mean TTFT over the pair's
    requests; the median and mean of the pairs' ratios, with a bootstrap interval over pairs. Also
    per round (both clients in one window, different halves) for comparison."""
    ok = [r for r in runs if "error" not in r]
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for r in ok:
        by_round.setdefault(r["round"], {})[r["client"]] = r
    complete = sorted(i for i, d in by_round.items() if {"cptest", theirs_name} <= d.keys())
    pairs = [(i, i + 1) for i in complete if i % 2 == 0 and i + 1 in complete]

    def pooled(rs: list[dict[str, Any]]) -> dict[str, float]:
        ttfts = [t for r in rs for t in r["ttfts_ms"]]
        return {"output_throughput": sum(r["output_tokens"] for r in rs) / sum(r["duration_s"] for r in rs),
                "median_ttft_ms": statistics.median(ttfts), "mean_ttft_ms": statistics.fmean(ttfts)}

    out: dict[str, Any] = {"pairs": len(pairs), "rounds": len(complete)}
    for unit, groups in (("pair", [list(p) for p in pairs]), ("round", [[i] for i in complete])):
        mine = [pooled([by_round[i]["cptest"] for i in g]) for g in groups]
        theirs = [pooled([by_round[i][theirs_name] for i in g]) for g in groups]
        for metric in ("output_throughput", "median_ttft_ms", "mean_ttft_ms"):
            ratios = [m[metric] / t[metric] for m, t in zip(mine, theirs, strict=True)]
            if not ratios:
                continue
            lo, hi = bootstrap(ratios)
            out[f"{unit}:{metric}"] = {"ratios": ratios, "ratio_median": statistics.median(ratios),
                                       "ratio_mean": statistics.fmean(ratios), "ratio_ci95": [lo, hi]}
    lags = {c: [r["lag"] for r in ok if r["client"] == c and r.get("lag", {}).get("samples")]
            for c in ("cptest", theirs_name)}
    out["lag_p99_ms_median"] = {c: statistics.median(x["p99_ms"] for x in v) for c, v in lags.items() if v}
    out["lag_max_ms_max"] = {c: max(x["max_ms"] for x in v) for c, v in lags.items() if v}
    return out


def pool_paired(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The pairs of several paired calls (fidelity-paired.json each, against one client) summarised
    as one design: rounds renumbered after each other, so that a pair never mixes two calls (each
    call's rounds start at an even number). A machine lends a call ten minutes; an interval of
    +-1.5 % wants about 30 pairs (D70)."""
    against = {r["against"] for r in results}
    if len(against) != 1:
        raise SystemExit(f"pooling paired calls against different clients: {sorted(against)}")
    runs: list[dict[str, Any]] = []
    offset = 0
    for r in results:
        mine = [dict(run) for run in r["runs"] if "round" in run]
        for run in mine:
            run["round"] += offset
        runs += mine
        last = max((run["round"] for run in mine), default=offset - 1)
        offset = last + 1 + (last + 1) % 2
    summary = paired_summary(runs, against.pop())
    summary["calls"] = len(results)
    return summary


def print_ratios(summary: dict[str, Any], label: str) -> None:
    """Each ratio of a paired summary (`paired_summary`, `pool_paired`): median, mean and interval."""
    for key, v in summary.items():
        if isinstance(v, dict) and "ratio_ci95" in v:
            lo, hi = v["ratio_ci95"]
            print(f"{key}: {label}median {v['ratio_median']:.4f}, mean {v['ratio_mean']:.4f} "
                  f"(95 % CI {lo:.4f} .. {hi:.4f}, n {len(v['ratios'])})", flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--pool"]:
        ap = argparse.ArgumentParser(description="pool the pairs of several paired calls")
        ap.add_argument("--pool", type=Path, nargs="+", required=True)
        ap.add_argument("--out", type=Path, required=True)
        a = ap.parse_args()
        summary = pool_paired([json.loads(f.read_text()) for f in a.pool])
        print_ratios(summary, "")
        pooled = {"pooled": [str(f) for f in a.pool], "summary": summary}
        a.out.write_text(json.dumps(pooled, indent=1) + "\n")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--keepalive", action="store_true",
                    help="cptest's client keeps connections alive (default: one per request, "
                    "as bench_serving)")
    ap.add_argument("--gc-variant", action="store_true",
                    help="a third client each round: cptest's with Python's cyclic collector disabled")
    ap.add_argument("--paired", action="store_true",
                    help="both clients at once, each on half the request set (D65); "
                    "--rounds is rounded up to even")
    ap.add_argument("--cpus", default="",
                    help="with --paired: the CPU sets of cptest's and bench_serving's processes, 'a,b|c,d'")
    ap.add_argument("--control", action="store_true",
                    help="with --paired: cptest's client against itself (A/A) instead of bench_serving")
    ap.add_argument("--trace", action="store_true",
                    help="with --paired: time each request's phases to its first chunk in both clients")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="with --paired: start no pair of rounds after this many seconds")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    workload = planned_workload(a.scenario)
    if not workload.concurrency:
        raise SystemExit("fidelity compares closed-loop runs: the scenario's workload needs a concurrency")
    if a.paired:
        main_paired(a, workload)
        return
    print(f"{len(workload.requests)} requests, concurrency {workload.concurrency}, "
          f"{sum(len(r.input_ids) for r in workload.requests)} prompt tokens, "
          f"{sum(r.max_new_tokens for r in workload.requests)} output tokens", flush=True)
    runs: list[dict[str, Any]] = []
    t0 = time.time()
    warm = [run_cptest(workload, a.port, a.out / "warmup.jsonl", a.keepalive),
            run_bench_serving(workload, a.port, a.out / "warmup-bench.jsonl")]
    print(f"warm-up: {warm}", flush=True)
    clients = ["bench", "cptest"] + (["cptest-nogc"] if a.gc_variant else [])
    k = len(clients)
    # Each round runs every client once; the order rotates (and reverses every other round) so
    # that a drift of the machine hits all alike.
    order = []
    for i in range(a.rounds):
        rot = clients[i % k:] + clients[:i % k]
        order += rot if i % 2 == 0 else rot[::-1]
    watch = GcWatch()
    for i, client in enumerate(order):
        watch.take()
        run = (run_bench_serving(workload, a.port, a.out / f"bench-{i}.jsonl") if client == "bench"
               else run_cptest(workload, a.port, a.out / f"{client}-{i}.jsonl", a.keepalive,
                               gc_off=client == "cptest-nogc"))
        run["gc"] = watch.take()
        run["at_s"] = round(time.time() - t0, 1)
        runs.append(run)
        print(json.dumps(run), flush=True)
    result: dict[str, Any] = {"scenario": str(a.scenario), "requests": len(workload.requests),
                              "concurrency": workload.concurrency, "rounds": a.rounds, "runs": runs,
                              "warmup": warm, "keepalive": a.keepalive, "order": order}
    for mine in ["cptest"] + (["cptest-nogc"] if a.gc_variant else []):
        for metric, theirs in (("output_throughput", "output_throughput"), ("mean_ttft_ms", "mean_ttft_ms"),
                               ("median_ttft_ms", "median_ttft_ms"),
                               ("median_ttft_token_ms", "median_ttft_ms")):
            theirs_runs = [r[theirs] for r in runs if r["client"] == "bench_serving"]
            med = {mine: statistics.median(r[metric] for r in runs if r["client"] == mine),
                   "bench_serving": statistics.median(theirs_runs)}
            ratios = [_pair(runs[k * i:k * i + k], metric, theirs, mine) for i in range(a.rounds)]
            lo, hi = bootstrap(ratios)
            key = metric if mine == "cptest" else f"{mine}:{metric}"
            result[key] = med | {"round_ratios": ratios, "ratio_median": statistics.median(ratios),
                                 "ratio_mean": statistics.fmean(ratios), "ratio_ci95": [lo, hi]}
            print(f"{metric}: {mine} / bench_serving per round: median {statistics.median(ratios):.4f}, "
                  f"mean {statistics.fmean(ratios):.4f} (95 % CI {lo:.4f} .. {hi:.4f}, "
                  f"{len(ratios)} rounds); "
                  f"medians {mine} {med[mine]:.2f}, bench_serving {med['bench_serving']:.2f}", flush=True)
    (a.out / "fidelity.json").write_text(json.dumps(result, indent=1) + "\n")


def main_paired(a: argparse.Namespace, workload: WorkloadPlan) -> None:
    t0 = time.time()
    sets = [set(map(int, x.split(","))) if x else None for x in (a.cpus.split("|") + ["", ""])[:2]]
    print(f"paired: {len(workload.requests)} requests in two halves at concurrency "
          f"{halves(workload)[0].concurrency} each; cpus {a.cpus or 'inherited'}", flush=True)
    # one warm-up round of both (not counted), then the rounds
    (a.out / "warm").mkdir(exist_ok=True)
    other = "control" if a.control else "bench"
    warm = run_paired(workload, a.port, a.out / "warm", 1, sets, None, other)
    print("warm-up done", flush=True)
    rounds = a.rounds + a.rounds % 2
    runs = run_paired(workload, a.port, a.out, rounds, sets,
                      None if a.deadline_s is None else t0 + a.deadline_s, other, a.trace)
    summary = paired_summary(runs, OTHER[other])
    if a.trace:
        for c in ("cptest", OTHER[other]):
            got = [r["phases_ms"] for r in runs if r.get("client") == c and "phases_ms" in r]
            summary[f"phases_ms:{c}"] = {
                name: round(statistics.median(g[name]["p50"] for g in got if name in g), 3)
                for name, _, _ in PHASES if any(name in g for g in got)}
            print(f"phases (median of the runs' medians, ms) {c}: {summary[f'phases_ms:{c}']}", flush=True)
    result = {"scenario": str(a.scenario), "requests": len(workload.requests),
              "concurrency": workload.concurrency, "design": "paired (D65)", "against": OTHER[other],
              "rounds_asked": rounds, "trace": a.trace,
              "cpus": a.cpus, "summary": summary, "runs": runs,
              "warmup": [{k: v for k, v in r.items() if k != "ttfts_ms"} for r in warm]}
    print_ratios(summary, f"cptest / {OTHER[other]} ")
    print(f"event-loop lag p99 (median over runs): {summary['lag_p99_ms_median']}, "
          f"max {summary['lag_max_ms_max']}", flush=True)
    name = "fidelity-control.json" if a.control else "fidelity-paired.json"
    (a.out / name).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
