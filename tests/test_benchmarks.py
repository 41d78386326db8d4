"""The benchmark scripts still run and judge their own synthetic runs (at a small size).

Their figures are not asserted here (targets are met in benchmarks, not in timed tests); this only
keeps a change elsewhere from silently breaking them, as the unfinished-run rule (D19) once did.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*argv: str) -> str:
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_checks_benchmark_passes_its_own_archives() -> None:
    out = _run("benchmarks/checks.py", "--rows", "20000", "--records", "2000")
    assert "rows path:" in out and "records path:" in out


def test_the_probe_step_benchmark_records_every_step_and_prints_kept_objects() -> None:
    pytest.importorskip("torch")
    out = _run("benchmarks/probe_step.py", "--steps", "300", "--layers", "2", "--batch", "8")
    # 300 timed steps, 300 more for kept objects: each one reads back as a Step
    assert "600 steps read back" in out
    assert re.search(r"kept objects : +-?\d+\.\d\d per step", out)


def test_the_read_rows_benchmark_reads_every_shape_alike_both_ways() -> None:
    pytest.importorskip("numpy")
    out = _run("benchmarks/read_rows.py", "--repeat", "1")
    assert len(re.findall(r"request\(s\) of +\d+ tokens: read_rows +\d", out)) == 6


def test_the_step_record_benchmark_makes_the_same_record_both_ways() -> None:
    out = _run("benchmarks/step_record.py", "--repeat", "1", "--requests", "8", "--tokens", "80")
    assert out.count("same record") == 3 and "DIFFER" not in out


def test_the_driver_stream_benchmark_has_every_request_answered() -> None:
    out = _run("benchmarks/driver_stream.py", "--requests", "16", "--concurrency", "4", "--tokens", "16",
               "--compare", "1")
    assert "16/16 requests" in out and "chunks/s consumed" in out
    assert re.search(r"round 1: first token after +[\d.]+ ms \(driver\), +[\d.]+ ms \(bench_serving-shaped",
                     out)


def test_the_check_memory_benchmark_refuses_every_hostile_archive_within_its_figure() -> None:
    out = _run("benchmarks/check_memory.py", "--huge", "32", "--fill", "1")
    assert "every figure within the stated bound" in out
    for refusal in ("rank0.jsonl is 32 MiB, larger than an evidence file may be",
                    "runner.jsonl.xz unpacks to more than an evidence file may be",
                    "a record longer than a line of an evidence file may be",
                    "plan.json is 32 MiB, larger than a plan may be",
                    "manifest.json is 32 MiB, larger than a manifest may be",
                    "main node 0 argv differs from what scenario.cps plans",
                    "the archive holds more than 4,096 files and folders"):
        assert refusal in out, refusal


def test_the_peer_death_benchmark_ends_every_trial_with_lifelines() -> None:
    pytest.importorskip("torch")
    out = _run("benchmarks/peer_death.py", "--trials", "3", "--lifelines")
    assert re.search(r"with lifelines: 3 trials .* hung 0 ", out), out
