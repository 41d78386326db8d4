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
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import random
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

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


def run_cptest(workload: WorkloadPlan, port: int, out: Path, keepalive: bool = False,
               gc_off: bool = False) -> dict[str, Any]:
    """One run of cptest's client; `gc_off`: Python's cyclic collector disabled for the run (a
    hypothesis under test: collections of older generations pausing the event loop)."""
    if gc_off:
        gc.collect()
        gc.disable()
    try:
        out_run = _run_cptest(workload, port, out, keepalive)
    finally:
        gc.enable()
    out_run["gc_off"] = gc_off
    if gc_off:
        out_run["client"] = "cptest-nogc"
    return out_run


def _run_cptest(workload: WorkloadPlan, port: int, out: Path, keepalive: bool) -> dict[str, Any]:
    writer = RecordWriter(out)
    try:
        driver = WorkloadDriver(f"http://127.0.0.1:{port}", workload, role="main", writer=writer,
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
            "keepalive": keepalive}


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


def run_bench_serving(workload: WorkloadPlan, port: int, out: Path) -> dict[str, Any]:
    _without_hf_datasets()
    from sglang.benchmark import serving
    from sglang.benchmark.datasets import DatasetRow

    rows = [DatasetRow(prompt=list(r.input_ids), prompt_len=len(r.input_ids), output_len=r.max_new_tokens)
            for r in workload.requests]
    serving.get_dataset = lambda *_a, **_k: rows  # the plan's requests instead of a generated set
    temperature = workload.requests[0].sampling.temperature or 0.0
    sys.argv = ["bench_serving", "--backend", "sglang", "--host", "127.0.0.1", "--port", str(port),
                "--dataset-name", "random-ids", "--tokenize-prompt", "--num-prompts", str(len(rows)),
                "--max-concurrency", str(workload.concurrency), "--request-rate", "inf",
                "--temperature", str(temperature), "--extra-request-body", json.dumps(LOGPROB_BODY),
                "--disable-tqdm", "--output-file", str(out), "--warmup-requests", "1"]
    serving.cli_main()
    r = json.loads(out.read_text().splitlines()[-1])
    return {"client": "bench_serving", "completed": r["completed"], "duration_s": r["duration"],
            "output_tokens": r["total_output_tokens"], "output_throughput": r["output_throughput"],
            "mean_ttft_ms": r["mean_ttft_ms"], "median_ttft_ms": r["median_ttft_ms"]}


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


def main() -> None:
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
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    workload = planned_workload(a.scenario)
    if not workload.concurrency:
        raise SystemExit("fidelity compares closed-loop runs: the scenario's workload needs a concurrency")
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


if __name__ == "__main__":
    main()
