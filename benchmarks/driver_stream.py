"""Benchmark of the workload driver's own cost per streamed chunk, against a server that costs nothing.

cptest's client must not be what limits or delays what it measures (issue 10: within 3 % of
`sglang.bench_serving` on throughput and TTFT). On the GPU machine it read TTFT 13 ms late and
throughput 5 % low at 32 streams (results/_measure). This isolates the client: a local server
(aiohttp, its own process) answers every request with SGLang 0.5.17's stream shape (cumulative
`output_ids` and `output_token_logprobs`, `data: ...` events, `[DONE]`) as fast as it can, and
the real `WorkloadDriver` runs a closed loop against it.

Printed: chunks per second the driver consumed, its process CPU time per chunk, the mean time
from sending a request to seeing its first token (a free server answers at once, so that is the
client's own delay), and the event loop's time per request end: the result's making and the
record's writing, which happen as a request ends, when the next requests of a closed loop connect
(docs/decisions.md D70; `--writer sync` writes the record on the loop, as before D70).
`--compare` also runs a client shaped like `sglang.bench_serving`'s
(`async_request_sglang_generate` in sglang/benchmark/serving.py of 0.5.17: a new aiohttp session
per request, orjson, the first token stamped when a chunk has output) on the same server, in
alternating rounds, and prints its first-token delay beside the driver's.

    python benchmarks/driver_stream.py [--requests 256] [--concurrency 32] [--tokens 256]
        [--tokens-per-s 290] [--compare ROUNDS] [--writer background|sync]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import statistics
import tempfile
import time
from pathlib import Path

from cptest.plan.model import PlannedRequest, WorkloadPlan
from cptest.run.driver import WorkloadDriver
from cptest.run.evidence_writer import RecordWriter


def serve(port: int, tokens: int, per_s: float) -> None:
    import asyncio

    from aiohttp import web

    # Every answer is the same token sequence: its events are made once, so that the server's own
    # cost per chunk is a write and the client is what is measured.
    events = []
    ids: list[int] = []
    lps: list[list[object]] = []
    for i in range(tokens):
        ids.append(7 + i % 4000)
        lps.append([-0.123456789, ids[-1], None])
        meta = {"id": "x", "finish_reason": {"type": "length", "length": tokens} if i == tokens - 1 else None,
                "prompt_tokens": 64, "completion_tokens": i + 1, "output_token_logprobs": lps}
        events.append(b"data: " + json.dumps({"output_ids": ids, "meta_info": meta}).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")

    async def generate(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, event in enumerate(events):
            if per_s and i:
                await asyncio.sleep(1 / per_s)  # a decode step's pace; the first token at once
            await resp.write(event)
        return resp

    app = web.Application()
    app.router.add_post("/generate", generate)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


async def _bench_shaped(port: int, requests: int, concurrency: int, tokens: int) -> list[float]:
    """First-token delays of a bench_serving-shaped client (see the module docstring)."""
    import aiohttp
    import orjson

    sem = asyncio.Semaphore(concurrency)
    out: list[float] = []
    payload = {"input_ids": [1] * 64, "sampling_params": {"max_new_tokens": tokens}, "stream": True,
               "return_logprob": True}

    async def one() -> None:
        async with sem, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600),
                                              read_bufsize=10 * 1024**2) as session:
            st, ttft = time.perf_counter(), 0.0
            async with session.post(f"http://127.0.0.1:{port}/generate", json=payload) as resp:
                async for raw in resp.content:
                    raw = raw.strip()
                    if not raw:
                        continue
                    data = raw[6:] if raw.startswith(b"data: ") else raw
                    if data != b"[DONE]" and orjson.loads(data).get("output_ids") and ttft == 0.0:
                        ttft = time.perf_counter() - st
            out.append(ttft)

    await asyncio.gather(*(one() for _ in range(requests)))
    return out


def _driver_ttft(port: int, workload: WorkloadPlan, out: Path) -> float:
    writer = RecordWriter(out, background=True)
    try:
        driver = WorkloadDriver(f"http://127.0.0.1:{port}", workload, role="main", writer=writer)
        done = asyncio.run(driver.arun())
    finally:
        writer.close()
    return statistics.fmean(r.ttft_s for r in done.results if r.ttft_s)


class TimedDriver(WorkloadDriver):
    """The real driver, with the event loop's time in each request's end work added up."""

    result_s = 0.0
    record_s = 0.0
    ends = 0

    def _result(self, *a, **k):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return super()._result(*a, **k)
        finally:
            self.result_s += time.perf_counter() - t

    def _finish(self, result):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return super()._finish(result)
        finally:
            self.record_s += time.perf_counter() - t
            self.ends += 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--compare", type=int, default=0, metavar="ROUNDS",
                    help="also run a bench_serving-shaped client, ROUNDS rounds of each, alternating")
    ap.add_argument("--tokens-per-s", type=float, default=290.0,
                    help="per stream (0: as fast as possible); 290 is a 3.4 ms decode step, as on the GPU "
                         "machine (results/_measure run4)")
    ap.add_argument("--writer", choices=("background", "sync"), default="background",
                    help="the record writer's mode: background as the runner's (D70), sync as before")
    a = ap.parse_args()
    port = free_port()
    server = multiprocessing.Process(target=serve, args=(port, a.tokens, a.tokens_per_s), daemon=True)
    server.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    reqs = [PlannedRequest(index=i, input_ids=[1 + i % 100] * 64, max_new_tokens=a.tokens,
                           sampling={"temperature": 0.0}) for i in range(a.requests)]
    workload = WorkloadPlan(seed=1, concurrency=a.concurrency, rate_per_s=None, timeout_s=600, requests=reqs)
    compared: list[tuple[float, float]] = []
    try:
        with tempfile.TemporaryDirectory() as d:
            writer = RecordWriter(Path(d) / "r.jsonl", background=a.writer == "background")
            driver = TimedDriver(f"http://127.0.0.1:{port}", workload, role="main", writer=writer)
            cpu0, t0 = time.process_time(), time.perf_counter()
            summary = asyncio.run(driver.arun())
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            writer.close()
            for i in range(a.compare):  # ABAB...: a drift of the machine hits both clients alike
                pair: dict[str, float] = {}
                for who in (("shaped", "driver") if i % 2 == 0 else ("driver", "shaped")):
                    pair[who] = _driver_ttft(port, workload, Path(d) / f"r{i}.jsonl") if who == "driver" \
                        else statistics.fmean(asyncio.run(_bench_shaped(port, a.requests, a.concurrency,
                                                                        a.tokens)))
                compared.append((pair["driver"], pair["shaped"]))
    finally:
        server.terminate()
    ok = [r for r in summary.results if r.status == "ok"]
    chunks = sum(len(r.output_ids) for r in ok)
    print(f"driver on a free server: {len(ok)}/{a.requests} requests, concurrency {a.concurrency}, "
          f"{a.tokens} tokens each")
    print(f"  {chunks / wall:9.0f} chunks/s consumed, {1e6 * cpu / chunks:6.1f} us of client CPU per chunk")
    ttft = statistics.fmean(r.ttft_s for r in ok if r.ttft_s)
    print(f"  first token after {1000 * ttft:6.2f} ms on average (the server sends it at once: client delay)")
    n = max(driver.ends, 1)
    result_us, record_us = 1e6 * driver.result_s / n, 1e6 * driver.record_s / n
    print(f"  event loop per request end ({a.writer} writer): {result_us + record_us:6.1f} us "
          f"(result {result_us:.1f} us, record and summary {record_us:.1f} us)")
    for i, (ours, shaped) in enumerate(compared):
        print(f"  round {i + 1}: first token after {1000 * ours:6.2f} ms (driver), {1000 * shaped:6.2f} ms "
              f"(bench_serving-shaped client)")


if __name__ == "__main__":
    main()
