"""End to end on the CPU reference engine: `graph parity vs eager` (D60) through `cptest run`, four
servers (baseline, control, eager twin, main) and the verdict, on the qualification scenario with a
smaller workload (a minute or two on 2 CPU cores instead of six).

The reference engine has no CUDA graphs: main and its eager twin run the same code, so the contract
passes with Δ = 0 and says why, and the scenario's `graph decode captured` is its declared violation
there. Never run at once with tests/test_e2e_reference.py on one host: the plans use fixed ports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reference.conftest import ensure_tiny_models

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "qualification" / "graph_parity_dcp2_llama_kv1.cps"
SMALL = """  workload {
    requests 8
    prompt_tokens uniform(64, 128)
    output_tokens 8
  }
  expect {"""


def test_graph_parity_runs_four_servers_and_passes_on_the_reference_engine(tmp_path: Path) -> None:
    ensure_tiny_models()
    text = SCENARIO.read_text().replace('extends "../defaults/tiny.cps"',
                                        f'extends "{REPO / "scenarios" / "defaults" / "tiny.cps"}"')
    scenario = tmp_path / SCENARIO.name
    scenario.write_text(text.replace("  expect {", SMALL, 1))
    proc = subprocess.run([sys.executable, "-m", "cptest", "run", str(scenario), "--engine", "reference",
                           "--results", str(tmp_path / "results"), "--no-baseline-cache", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    try:
        v = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"no JSON verdict (exit {proc.returncode}):\n{proc.stdout}\n"
                             f"{proc.stderr}") from None
    statuses = {x["checker"]: (x["status"], x["reason"]) for x in v["verdicts"]}
    assert all(s == "pass" for s, _ in statuses.values()), statuses
    assert "the reference engine has no CUDA graphs" in statuses["graph_parity"][1]
    archive = Path(v["archive"])
    assert sorted(p.name for p in (archive / "evidence").iterdir() if p.is_dir()) == \
        ["baseline", "control", "eager", "main"]
    plan = json.loads((archive / "plan.json").read_text())
    assert plan["eager"]["eager"] is True and plan["main"]["eager"] is False
    verdict = json.loads((archive / "verdict.json").read_text())
    gp = next(x for x in verdict["verdicts"] if x["checker"] == "graph_parity")
    # Every bound judged on both measures, each with its floor; 8 requests answered on both servers.
    assert {(r["bound"], r["measure"]) for r in gp["figures"]["bounds"]} == {
        (b, m) for b in ("logprob p99 <= 4 * control", "logprob max <= 8 * control")
        for m in ("teacher_forced", "decode")}
    assert all(r["floor"] is not None for r in gp["figures"]["bounds"])
    assert gp["figures"]["teacher_forced"]["main"]["requests"] == 8
    assert gp["figures"]["free_running"]["pairs"] == 8
