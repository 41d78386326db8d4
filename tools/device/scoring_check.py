"""Teacher-forced scoring against a real SGLang server: do its answers have the shapes cptest assumes?

Run on the GPU machine against a running `--skip-tokenizer-init` server (measure.sh uses server p0):

    python3 tools/device/scoring_check.py SCENARIO --port 31000 --out DIR

1. The scenario's workload, free-running, through cptest's driver (greedy, top 5 per output token).
2. `/flush_cache`, then the same server scores every (prompt + its own output) with cptest's scorer
   (`cptest.run.scoring`), all at once (the workload's concurrency), and again one at a time.
3. Figures: every score `ok` (the scorer checks the returned token ids against the sequence);
   |teacher-forced logprob - the free-running logprob of the same token| (one server, same
   history: prefill vs decode numerics); |batched - one at a time| (one server, another batch
   composition: the floor D39 chose not to use, measured); top-1 of each scored position equal to
   the greedy token that followed it.
Writes DIR/scoring-check.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import httpx

from cptest.contracts.parity import nearest_rank, sig
from cptest.run.driver import WorkloadDriver
from cptest.run.evidence_writer import RecordWriter
from cptest.run.scoring import score, sequences_from

sys.path.insert(0, str(Path(__file__).parent))
from fidelity import planned_workload  # noqa: E402 - the tool folder is not a package


def spread(values: list[float]) -> dict[str, Any]:
    v = sorted(x for x in values if not math.isnan(x))
    if not v:
        return {"n": 0}
    return {
        "n": len(v),
        "p50": sig(nearest_rank(v, 0.5)),
        "p99": sig(nearest_rank(v, 0.99)),
        "max": sig(v[-1]),
        "zero": sum(x == 0 for x in v),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=64)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{a.port}"
    full = planned_workload(a.scenario)
    workload = full.model_copy(update={"top_logprobs": 5, "requests": full.requests[: a.requests]})
    writer = RecordWriter(a.out / "scoring-check.jsonl")
    try:
        summary = WorkloadDriver(base, workload, role="baseline", writer=writer).run()
        seqs = sequences_from(summary.results, workload)
        flush = httpx.post(base + "/flush_cache", timeout=30)
        batched = score(
            base,
            seqs,
            top_k=5,
            role="baseline",
            writer=writer,
            concurrency=workload.concurrency or 8,
            timeout_s=120,
        )
        httpx.post(base + "/flush_cache", timeout=30)
        alone = score(base, seqs, top_k=5, role="control", writer=writer, concurrency=1, timeout_s=120)
    finally:
        writer.close()
    free = {r.index: r for r in summary.results if r.status == "ok"}
    by_alone = {s.index: s for s in alone}
    vs_free: list[float] = []
    vs_alone: list[float] = []
    top1_is_greedy = positions = 0
    for s in batched:
        if s.status != "ok":
            continue
        r = free[s.index]
        for j, lp in enumerate(s.token_logprobs):
            positions += 1
            if j < len(r.output_logprobs):
                vs_free.append(abs(lp - r.output_logprobs[j]))
            if j < len(s.top) and s.top[j] and s.top[j][0][0] == r.output_ids[j]:
                top1_is_greedy += 1
        o = by_alone.get(s.index)
        if o is not None and o.status == "ok":
            vs_alone += [abs(x - y) for x, y in zip(s.token_logprobs, o.token_logprobs, strict=False)]
    errors = [s.error for s in batched + alone if s.status != "ok"]
    report = {
        "server": base,
        "requests": len(workload.requests),
        "answered_ok": summary.completed,
        "flush_cache": {"status": flush.status_code, "text": flush.text.strip()[:120]},
        "scored_ok": {
            "batched": sum(s.status == "ok" for s in batched),
            "alone": sum(s.status == "ok" for s in alone),
            "of": len(seqs),
        },
        "errors": errors[:5],
        "positions": positions,
        "teacher_forced_vs_free_running": spread(vs_free),
        "batched_vs_one_at_a_time": spread(vs_alone),
        "top1_equals_greedy_token": top1_is_greedy,
    }
    (a.out / "scoring-check.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
