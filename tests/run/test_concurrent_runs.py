"""Four runs of one scenario at once on one host, reference engine (issue 14, "Mix concurrent runs"):
each is judged on its own server's evidence, all pass, on distinct ports, into distinct archives.

Each run is a `cptest run` of its own: once with `--ports` (as the suite starts them, D26), once
without, each claiming a port slot host-wide (cptest/suite/port_claims.py). What makes each
verdict its own: readiness counted only the listener of the run's own tree (`ready` names it, and
it is the pid the run launched), and the shutdown contract's `no_orphans` counted only processes of
the run's own sessions: the other runs' engines, alive beside it, are `foreign` in its samples.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cptest.evidence import Lifecycle, ProcessSample, read_records
from cptest.run.models import make_named
from cptest.suite.machine import SLOT_STRIDE
from cptest.suite.port_claims import BASE_ENV, CLAIMS_ENV
from cptest.testing.ports import free_slots

from conftest import free_port  # isort: skip

ROOT = Path(__file__).resolve().parents[2]
RUNS = 4

SCENARIO = """cptest 1
scenario concurrent_tiny {
  description "four of these run at once on one host, each judged on its own server"
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
    requests 8
    concurrency 8
    seed 7
    prompt_tokens uniform(64, 128)
    output_tokens 8
    sampling greedy
    timeout 120s
  }
  expect {
    launch accepted
    serving all_complete
    shutdown within 60s no_orphans
    log absent "Traceback"
  }
}
"""




@pytest.mark.parametrize("ports", ["given", "claimed"])
def test_four_concurrent_runs_of_one_scenario_each_pass_on_their_own_server(tmp_path: Path,
                                                                           ports: str) -> None:
    scenario = tmp_path / "concurrent_tiny.cps"
    scenario.write_text(SCENARIO)
    models = tmp_path / "models"
    make_named("llama-kv1", models)  # once, before the runs: they share the store
    env = dict(os.environ)
    chosen: list[int] = []
    if ports == "given":
        while len(chosen) < 2 * RUNS:
            p = free_port()
            if p not in chosen:
                chosen.append(p)
    else:  # no --ports: each run claims a slot in a claims folder of this test's own
        base = free_slots(RUNS)
        env.update({CLAIMS_ENV: str(tmp_path / "claims"), BASE_ENV: str(base)})
    runs = []
    t0 = time.monotonic()
    for k in range(RUNS):
        given = ["--ports", f"{chosen[2 * k]},{chosen[2 * k + 1]}"] if chosen else []
        argv = [sys.executable, "-m", "cptest", "run", str(scenario), *given, "--results",
                str(tmp_path / "results"), "--models", str(models), "--no-baseline-cache", "--json"]
        runs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=ROOT, env=env))
    outs = []
    for r in runs:
        out, err = r.communicate(timeout=175)
        bad = [v for v in json.loads(out).get("verdicts", []) if v["status"] != "pass"] if out else out
        assert r.returncode == 0, f"exit {r.returncode}: {bad}\n{err[-2000:]}"
        outs.append(json.loads(out))
    wall = time.monotonic() - t0
    assert wall < 180
    assert [o["status"] for o in outs] == ["pass"] * RUNS
    archives = [Path(o["archive"]) for o in outs]
    assert len(set(archives)) == RUNS
    served: list[tuple[int, int]] = []
    for archive in archives:
        plan = json.loads((archive / "plan.json").read_text())
        port = plan["main"]["nodes"][0]["port"]
        records = read_records(archive / "evidence" / "main" / "runner.jsonl")[0]
        events = {r.event: r for r in records if isinstance(r, Lifecycle)}
        launched, ready = events["launched"], events["ready"]
        # Judged on its own server: the listener that made it ready is the process it launched.
        assert ready.detail["identity"] == "tree" and ready.detail["port"] == port
        assert launched.detail["pid"] in ready.detail["listener_pids"]
        served.append((port, launched.detail["pid"]))
        # No orphan of its own; any other run's engine seen is foreign, never counted.
        final = [s for s in records if isinstance(s, ProcessSample) and s.phase == "after"][-1]
        assert [p for p in final.procs if p.get("scope") == "host"] == []
    assert len({port for port, _ in served}) == RUNS and len({pid for _, pid in served}) == RUNS
    if ports == "claimed":  # each on a slot of its own from the base up, every claim let go at the end
        mains = sorted(port for port, _ in served)
        assert all(p >= base and (p - base) % SLOT_STRIDE == 0 for p in mains), mains
        for p in mains:
            fd = os.open(tmp_path / "claims" / f"slot-{p}.lock", os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if a run still held it
            finally:
                os.close(fd)
