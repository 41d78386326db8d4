"""A SIGTERM that reaches `cptest run` while it starts up ends it as an interruption (exit 3, the
message, no process left, any archive begun finished with an unknown verdict), never as the default
death by signal that leaves a half-begun archive and no word (issue 32, concurrent runs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cptest.run.models import make_named
from cptest.suite.port_claims import BASE_ENV, CLAIMS_ENV

ROOT = Path(__file__).resolve().parents[2]

SCENARIO = """cptest 1
scenario startup_signal {
  description "stopped by SIGTERM while it starts"
  engine reference
  model synthetic llama {
    layers 4
    hidden 256
    heads 8
    kv_heads 1
    head_dim 64
    vocab 4096
    intermediate 512
    seed 7
  }
  topology {
    gpus 2
    tp 2
  }
  baseline none
  workload {
    requests 4
    concurrency 4
    seed 7
    prompt_tokens uniform(16, 32)
    output_tokens 4
    sampling greedy
  }
  expect {
    serving all_complete
  }
}
"""


@pytest.mark.parametrize("at", ["writing synthetic weights", "archive:", "launching main server"])
def test_sigterm_during_start_up_is_an_interruption_with_nothing_left_behind(tmp_path: Path, at: str) -> None:
    scenario = tmp_path / "startup_signal.cps"
    scenario.write_text(SCENARIO)
    models = tmp_path / "models"
    make_named("llama-kv1", models)
    results = tmp_path / "results"
    env = {**os.environ, CLAIMS_ENV: str(tmp_path / "claims"), BASE_ENV: "47000", "NO_COLOR": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "cptest", "run", str(scenario), "--results", str(results),
                             "--models", str(models), "--no-baseline-cache"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    assert proc.stderr is not None
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if at in line:
            proc.send_signal(signal.SIGTERM)
            break
    else:
        proc.kill()
    assert any(at in line for line in seen), "".join(seen)
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    rest = proc.stderr.read()
    proc.wait(timeout=120)
    err = "".join(seen) + rest
    assert proc.returncode == 3, err[-3000:]
    assert "interrupted" in err
    _, alive = psutil.wait_procs(family, timeout=30)
    assert alive == [], alive  # every process it had started is gone
    for archive in (p for p in results.glob("*/*") if (p / "manifest.json").exists()):
        verdict = json.loads((archive / "verdict.json").read_text())  # begun, so finished
        assert verdict["status"] == "unknown"
