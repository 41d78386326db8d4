"""End to end on the CPU reference engine: the capacity-transitions qualification scenario (D59) run
through `cptest run`, its pool samples read back from the archive.

The scenario is SGLang's (scenarios/qualification/, TP2/DCP2); `--engine reference` runs it on the
reference engine, whose `fill_drain` sizing reads max_total_tokens as the logical capacity (4096
tokens, 16 requests of 256 held, a 17th waiting). About a minute on 2 CPU cores. Never run beside
another end-to-end test on one host (fixed ports; tests/test_e2e_reference.py says why).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cptest.checks import load_archive
from tests.reference.conftest import ensure_tiny_models

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "qualification" / "capacity_transitions_dcp2_llama_kv1.cps"


def test_the_pool_fills_past_90_percent_and_drains_to_zero_on_every_rank(tmp_path: Path) -> None:
    ensure_tiny_models()
    proc = subprocess.run([sys.executable, "-m", "cptest", "run", str(SCENARIO), "--engine", "reference",
                           "--results", str(tmp_path), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    try:
        verdict = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"no JSON verdict (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
                             ) from None
    statuses = {v["checker"]: (v["status"], v["reason"]) for v in verdict["verdicts"]}
    assert statuses["capacity_transitions"][0] == "pass", statuses["capacity_transitions"]
    assert all(s == "pass" for s, _ in statuses.values()), statuses

    archive = load_archive(verdict["archive"])
    assert archive.plan.workload.concurrency == 17  # fill_drain: 16 requests of 256 tokens held, one waiting
    main = archive.evidence.role("main")
    assert sorted(main.ranks) == [0, 1]
    for w, rank in main.ranks.items():
        samples = rank.pool_samples
        assert len(samples) >= 4, f"rank {w}: {len(samples)} pool samples"
        assert all(s.total == 2 * rank.kv_pools[-1].rows == 4096 for s in samples)
        assert max(s.used / s.total for s in samples) >= 0.9, f"rank {w} never passed 90 %"
        assert any(s.waiting > 0 and s.used / s.total >= 0.9 for s in samples), f"rank {w}: none queued"
        assert [s.step for s in samples] == sorted(s.step for s in samples)
        last = samples[-1]
        assert last.idle and last.used == 0 and last.free == last.total, f"rank {w} did not drain: {last}"
    # both DCP ranks sampled the same iterations, with the same figures (their own block counts)
    key = [[(s.step, s.used, s.running, s.waiting) for s in main.ranks[w].pool_samples] for w in (0, 1)]
    assert key[0] == key[1]
