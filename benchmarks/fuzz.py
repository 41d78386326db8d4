"""Fuzz the language stage: every input through validate, fmt, lint and compile; count crashes and hangs.

Target (issue 14): >= 100,000 inputs, 0 crashes (an exception other than cptest's own error types,
i.e. a traceback and exit 1 instead of a message and exit 2), 0 hangs (an input that takes over
`--hang` seconds, 5 by default). Half the inputs are drawn by grammar-aware hypothesis strategies
(`cptest.testing.fuzz.scenarios`), half are byte mutations of the suite's own files
(`scenarios/*.cps` and their defaults, `mutate`). Each input is written into a scratch copy of
scenarios/ (so `extends "defaults/tiny.cps"` resolves) and run as the CLI would
(`cptest.testing.fuzz.run_stages`). Work is spread over `--workers` processes; a worker stops an
input that runs past `--kill-after` seconds with SIGALRM and counts it as a hang. Crashing and
hanging inputs are written to `--out` so that they can be replayed.

    python benchmarks/fuzz.py [--inputs 100000] [--workers N] [--seed 1] [--out /tmp/cptest-fuzz]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import tempfile
import time
import traceback
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class _Hang(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Hang()


def _corpus() -> list[bytes]:
    folder = ROOT / "scenarios"
    files = sorted(folder.glob("*.cps")) + sorted((folder / "defaults").glob("*.cps"))
    return [f.read_bytes() for f in files]


def _worker(job: tuple[str, int, int, float, float, str]) -> dict:
    mode, seed, count, hang_s, kill_s, out = job
    from hypothesis import HealthCheck, Phase, given, settings

    from cptest.testing.fuzz import mutate, run_stages, scenarios

    scratch = Path(tempfile.mkdtemp(prefix="cptest-fuzz-"))
    shutil.copytree(ROOT / "scenarios", scratch, dirs_exist_ok=True)
    target = scratch / "fuzz.cps"
    signal.signal(signal.SIGALRM, _alarm)
    stats: Counter[str] = Counter()
    slowest = 0.0
    crashes: list[str] = []

    def one(data: bytes) -> None:
        nonlocal slowest
        target.write_bytes(data)
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, kill_s)
        try:
            stats[run_stages(target)] += 1
        except _Hang:
            stats["hang"] += 1
            _keep(out, "hang", data)
        except Exception:  # noqa: BLE001 - any exception that is not cptest's own is the finding
            stats["crash"] += 1
            crashes.append(traceback.format_exc(limit=-3))
            _keep(out, "crash", data)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        took = time.perf_counter() - t0
        slowest = max(slowest, took)
        if took > hang_s:
            stats["slow"] += 1
            _keep(out, "slow", data)
        stats["inputs"] += 1

    # Warm up outside the count: the first input of a process pays for imports, Lark's parser table
    # and numpy (seconds on a loaded machine), which is no property of that input.
    run_stages(target, (ROOT / "scenarios" / "tp1_llama_kv1.cps").read_text())
    t0 = time.perf_counter()
    if mode == "mutate":
        rng = random.Random(seed)
        corpus = _corpus()
        for _ in range(count):
            one(mutate(rng.choice(corpus), rng, corpus))
    else:
        @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), derandomize=False)
        @given(scenarios())
        def drive(text: str) -> None:
            one(text.encode("utf-8", "surrogatepass"))

        random.seed(seed)
        drive()
    shutil.rmtree(scratch, ignore_errors=True)
    return {"stats": dict(stats), "slowest": slowest, "seconds": time.perf_counter() - t0,
            "crashes": crashes[:5]}


def _keep(out: str, kind: str, data: bytes) -> None:
    folder = Path(out) / kind
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{os.getpid()}-{time.monotonic_ns()}.cps").write_bytes(data)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hang", type=float, default=5.0, help="an input slower than this is a hang")
    ap.add_argument("--kill-after", type=float, default=30.0, help="stop an input after this long")
    ap.add_argument("--chunk", type=int, default=2000, help="inputs per job")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "cptest-fuzz"))
    a = ap.parse_args()
    jobs = []
    left, i = a.inputs, 0
    while left > 0:
        n = min(a.chunk, left)
        jobs.append(("mutate" if i % 2 else "grammar", a.seed * 100_003 + i, n, a.hang, a.kill_after, a.out))
        left -= n
        i += 1
    total: Counter[str] = Counter()
    slowest, crashes = 0.0, []
    t0 = time.perf_counter()
    by_mode: Counter[str] = Counter()
    with ProcessPoolExecutor(a.workers) as pool:
        for job, r in zip(jobs, pool.map(_worker, jobs), strict=True):
            total.update(r["stats"])
            by_mode[job[0]] += r["stats"].get("inputs", 0)
            slowest = max(slowest, r["slowest"])
            crashes += r["crashes"]
            done = total["inputs"]
            print(f"  {done:>7} inputs, {time.perf_counter() - t0:7.0f} s, crashes {total['crash']}, "
                  f"hangs {total['hang'] + total['slow']}", flush=True)
    elapsed = time.perf_counter() - t0
    hangs = total["hang"] + total["slow"]
    print(f"fuzzed {total['inputs']} inputs ({by_mode['grammar']} grammar-aware, {by_mode['mutate']} byte "
          f"mutations) through validate, fmt, lint and compile on {a.workers} worker(s) in {elapsed:.0f} s: "
          f"{total['inputs'] / elapsed:.0f} inputs/s")
    print(f"reached: syntax error {total['syntax']}, invalid {total['invalid']}, plan error {total['plan']}, "
          f"compiled {total['ok']}; slowest input {slowest:.2f} s")
    print(f"{total['crash']} crashes, {hangs} hangs over {a.hang:g} s (target: 0 and 0)")
    for c in crashes[:3]:
        print(c)
    if total["crash"] or hangs:
        print(f"inputs kept under {a.out}")
    return 1 if total["crash"] or hangs else 0


if __name__ == "__main__":
    raise SystemExit(main())
