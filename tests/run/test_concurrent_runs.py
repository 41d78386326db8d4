"""Four runs of one scenario at once on one host, reference engine (issue 14, "Mix concurrent runs"):
each is judged on its own server's evidence, all pass, on distinct ports, into distinct archives.

Each run is a `cptest run --ports` of its own (as the suite starts them, D26). What makes each
verdict its own: readiness counted only the listener of the run's own tree (`ready` names it, and
it is the pid the run launched), and the shutdown contract's `no_orphans` counted only processes of
the run's own sessions: the other runs' engines, alive beside it, are `foreign` in its samples.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from cptest.evidence import Lifecycle, ProcessSample, read_records
from cptest.run.models import make_named

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


def test_four_concurrent_runs_of_one_scenario_each_pass_on_their_own_server(tmp_path: Path) -> None:
    scenario = tmp_path / "concurrent_tiny.cps"
    scenario.write_text(SCENARIO)
    models = tmp_path / "models"
    make_named("llama-kv1", models)  # once, before the runs: they share the store
    ports = []
    while len(ports) < 2 * RUNS:
        p = free_port()
        if p not in ports:
            ports.append(p)
    runs = []
    t0 = time.monotonic()
    for k in range(RUNS):
        argv = [sys.executable, "-m", "cptest", "run", str(scenario), "--ports",
                f"{ports[2 * k]},{ports[2 * k + 1]}", "--results", str(tmp_path / "results"),
                "--models", str(models), "--no-baseline-cache", "--json"]
        runs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=ROOT))
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
