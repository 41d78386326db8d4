"""CI's slice of the fuzz benchmark (benchmarks/fuzz.py): grammar-aware and byte-mutated inputs through
validate, fmt, lint and compile, 0 crashes and 0 hangs; under a minute."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_slice_of_the_fuzz_benchmark_finds_no_crash_and_no_hang(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/fuzz.py", "--inputs", "240", "--workers", "1", "--chunk", "120",
         "--seed", "7", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "fuzzed 240 inputs (120 grammar-aware, 120 byte mutations)" in done.stdout
    assert "0 crashes, 0 hangs over 5 s" in done.stdout
