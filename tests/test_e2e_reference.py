"""End to end on the CPU reference engine: `cptest run` on the scenario suite, the README command with
no GPU, and cptest itself killed at random points.

Every scenario in scenarios/ is either run here (`RUN`) or excluded with its reason (`EXCLUDED`,
also in docs/decisions.md); `test_every_scenario_is_run_or_excluded_with_a_reason` makes a new
scenario force that decision. Runs are sequential (the plan's ports are fixed) and take a few
minutes in all on 2 CPU cores.

They take minutes and are part of the README's test command (CI runs them). Never run two of them
at once on one host: plans use fixed ports, and the supervisor counts every `cptest-ref::` process
on the host as a possible orphan. The reference engine uses no GPU, so the `gpu_memory` part of
`shutdown` passes as "not applicable" (cptest/contracts/shutdown.py); every verdict must pass.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from cptest.store import existing_file
from cptest.testing.archives import archived_text
from tests.reference.conftest import ensure_tiny_models

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"

RUN = [
    "tp1_llama_kv1",
    "tp2_llama_kv1",
    "dcp2_llama_kv1",
    "pcp2_zigzag_qwen3_kv2",
    "fault_kill_rank_dcp2",
    "sigterm_shutdown",
    "reference_dcp2_dp2_llama",
    "reference_pcp2_interleave_qwen3",
    "reference_pcp2_zigzag_qwen3_dp2",
    "reference_stop_rank_dcp2",
]
"""Scenarios whose every contract the reference engine implements: each must pass."""

EXCLUDED = {
    "dcp2_llama_kv4": "expects SGLang 0.5.17's DCP head-sharding divergence (kv_heads > tp/dcp); the "
                      "reference replicates KV heads within the DCP group, so its generation agrees",
    "pcp2_zigzag_llama_kv2": "expects SGLang's Llama PCP divergence (attention sharded over full TP); the "
                             "reference shards attention over attention TP and agrees",
    "pcp_dcp_rejected": "an admission fact of SGLang 0.5.17 (PCP+DCP accepted); the reference refuses "
                        "PCP+DCP",
    "dcp2_mla": "MLA (DeepseekV3) is not implemented by the reference engine",
    "dcp4_mla_dsv3_geometry": "MLA (DeepseekV3) is not implemented by the reference engine",
    "tp8_dcp2_qwen3_30b_geometry": "8 ranks: more than the 4 CPU ranks CI runs",
    "tp4_llama8b_geometry": "Llama-3.1-8B geometry at 4 ranks: minutes on 2 CPU cores even under the CPU "
                            "profile; the README command already runs this geometry",
    "dcp2_tp4_llama8b_geometry": "expects SGLang 0.5.17's capacity report and DCP head-sharding divergence",
    "pcp2_dcp2_tp4_llama8b_geometry": "an admission fact of SGLang 0.5.17 (PCP+DCP accepted); the reference "
                                      "refuses PCP+DCP",
    "pcp4_zigzag_llama8b_geometry": "expects SGLang 0.5.17's Llama PCP crash; the reference implements PCP",
    "tp4_dcp2_two_nodes_sglang": "two nodes of 2 GPUs: the SGLang scenario the Kubernetes manifests are "
                                 "rendered from (tests/k8s); the reference's two-node path is "
                                 "reference_two_node_kill_rank under Slurm",
    "reference_two_node_kill_rank": "two nodes: run through the Slurm launcher on the test cluster by "
                                    "tests/run/test_slurm.py (CI starts it: .ci/slurm-cluster.sh)",
    "dcp4_llama": "the README command: run by test_readme_command_gives_a_verdict_without_a_gpu under the "
                  "reference CPU profile; it expects SGLang's kv_heads 8 > tp/dcp divergence",
}



def _cptest(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cptest", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def _verdict(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(
            f"no JSON verdict (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from None


def _tree_pids(archive: Path) -> set[int]:
    """Every pid the runner saw in the engine trees of this run (its ProcessSample records)."""
    pids: set[int] = set()
    for role in (archive / "evidence").iterdir():
        if not role.is_dir() or not existing_file(role / "runner.jsonl"):
            continue
        for line in archived_text(role / "runner.jsonl").splitlines():
            rec = json.loads(line) if line.strip().startswith("{") else {}
            if rec.get("kind") == "processes":
                pids |= {int(p["pid"]) for p in rec["procs"] if p.get("scope", "tree") == "tree"}
    return pids


def _alive(pids: set[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _assert_passes(v: dict[str, Any]) -> None:
    assert v["engine"] == "reference"
    for x in v["verdicts"]:
        assert x["status"] == "pass", f"{x['checker']}: {x['reason']}"


@pytest.fixture(scope="module", autouse=True)
def _models() -> None:
    ensure_tiny_models()


def test_every_scenario_is_run_or_excluded_with_a_reason() -> None:
    names = {p.stem for p in SCENARIOS.glob("*.cps")}
    assert names == set(RUN) | set(EXCLUDED), "decide for each new scenario: RUN or EXCLUDED (with why)"
    assert not set(RUN) & set(EXCLUDED)


@pytest.mark.parametrize("name", RUN)
def test_scenario_passes_on_the_reference_engine(name: str, tmp_path: Path) -> None:
    proc = _cptest("run", str(SCENARIOS / f"{name}.cps"), "--engine", "reference", "--results", str(tmp_path),
                   "--json")
    v = _verdict(proc)
    _assert_passes(v)
    archive = Path(v["archive"])
    assert (archive / "verdict.json").exists()
    assert json.loads((archive / "plan.json").read_text())["main"]["engine"] == "reference"
    left = _alive(_tree_pids(archive))
    assert not left, f"processes of the run still alive: {left}"


def test_a_second_run_reuses_the_kept_baseline_and_reaches_the_same_verdicts(tmp_path: Path) -> None:
    cache = tmp_path / "baselines"
    argv = ["run", str(SCENARIOS / "tp2_llama_kv1.cps"), "--engine", "reference", "--results",
            str(tmp_path / "results"), "--baseline-cache", str(cache), "--json"]
    runs = [_verdict(_cptest(*argv)) for _ in range(2)]
    first, second = (Path(v["archive"]) for v in runs)
    records = [[json.loads(line) for line in archived_text(a / "evidence/main/runner.jsonl").splitlines()]
               for a in (first, second)]
    events = [[r["event"] for r in rs if r.get("kind") == "lifecycle"] for rs in records]
    assert "baseline_cached" in events[0] and "baseline_reused" not in events[0]
    assert "baseline_reused" in events[1] and "baseline_cached" not in events[1]
    assert [(x["checker"], x["status"]) for x in runs[0]["verdicts"]] == \
        [(x["checker"], x["status"]) for x in runs[1]["verdicts"]]
    _assert_passes(runs[1])
    # The archive that reused a baseline holds that baseline's evidence and is re-checkable alone.
    assert archived_text(second / "evidence" / "baseline" / "runner.jsonl") == \
        archived_text(first / "evidence" / "baseline" / "runner.jsonl")
    check = _cptest("check", str(second), "--json")
    assert check.returncode == 0, check.stdout + check.stderr


def test_readme_command_gives_a_verdict_without_a_gpu(tmp_path: Path) -> None:
    env_path = ":".join(p for p in os.environ.get("PATH", "").split(":")
                        if not (Path(p) / "nvidia-smi").exists())
    proc = subprocess.run([sys.executable, "-m", "cptest", "run", "scenarios/dcp4_llama.cps", "--results",
                           str(tmp_path), "--json"], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PATH": env_path})
    notes = [line for line in proc.stderr.splitlines() if "no GPU here" in line]
    assert len(notes) == 1, proc.stderr
    v = _verdict(proc)
    # The scenario declares generation violated on SGLang 0.5.17 (its kv_heads 8 > tp/dcp defect);
    # the reference engine has no such defect, so there the contract is expected to hold: exit 0.
    assert proc.returncode == 0 and v["engine"] == "reference" and v["status"] == "pass", proc.stdout
    plan = json.loads((Path(v["archive"]) / "plan.json").read_text())
    assert "reference CPU profile" in plan["description"]
    assert plan["pins"]["model"]["synthetic"]["hidden"] == 512
    by = {x["checker"]: x for x in v["verdicts"]}
    assert all(x["status"] == "pass" for x in v["verdicts"]), [(x["checker"], x["reason"])
                                                               for x in v["verdicts"]]
    assert "declared violated on sglang 0.5.17 only" in by["generation"]["reason"]
    assert not by["generation"]["expect_violation"]
    assert not _alive(_tree_pids(Path(v["archive"])))


KILL_POINTS = 20
RUN_SPAN_S = 7.0
"""A run of the kill target lasts about this long after its archive appears (2 CPU cores)."""
KILL_SCENARIO = """\
cptest 1
scenario reference_kill_target {{
  extends "{defaults}"
  engine reference "builtin"
  model local "{model}"
  facts {{ architecture "LlamaForCausalLM" layers 4 hidden 256 heads 8 kv_heads 1 head_dim 64 vocab 4096 }}
  topology {{ gpus 2 tp 2 dcp 2 }}
  baseline {{ tp 2 }}
  workload {{ requests 6 concurrency 3 prompt_tokens uniform(16, 128) output_tokens 6 }}
  expect {{
    rows kv_owner position % 2
    capacity logical == 2 * physical
  }}
}}
"""


def _descendants(pid: int) -> set[int]:
    try:
        return {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def test_killing_cptest_at_random_points_leaves_no_process_and_an_unknown_verdict(tmp_path: Path) -> None:
    scenario = tmp_path / "reference_kill_target.cps"
    scenario.write_text(KILL_SCENARIO.format(defaults=SCENARIOS / "defaults" / "tiny.cps",
                                             model=ensure_tiny_models() / "llama-kv1"))
    rng = random.Random(20261130)
    results = tmp_path / "results"
    failures = []
    for i in range(KILL_POINTS):
        sig = signal.SIGKILL if i % 2 == 0 else signal.SIGTERM
        at = rng.uniform(0.0, RUN_SPAN_S)
        before = set((results / "reference_kill_target").glob("*")) if results.exists() else set()
        argv = [sys.executable, "-m", "cptest", "run", str(scenario), "--results", str(results),
                "--models", str(ensure_tiny_models())]  # the store that holds the scenario's local model
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seen: set[int] = set()
        # Points are timed from the archive's creation: before it, there is nothing to judge.
        while proc.poll() is None and not (set((results / "reference_kill_target").glob("*")) - before):
            time.sleep(0.02)
        t0 = time.monotonic()
        while time.monotonic() - t0 < at and proc.poll() is None:
            seen |= _descendants(proc.pid)
            time.sleep(0.05)
        finished_first = proc.poll() is not None
        proc.send_signal(sig)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 15
        while _alive(seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        where = f"point {i} ({sig.name} at {at:.2f} s)"
        if _alive(seen):
            failures.append(f"{where}: processes left {_alive(seen)}")
        new = sorted(set((results / "reference_kill_target").glob("*")) - before)
        if not new:
            failures.append(f"{where}: no archive")
            continue
        manifest = new[0] / "manifest.json"
        closed = manifest.is_file() and json.loads(manifest.read_text()).get("phase") == "finished"
        if finished_first or closed:
            continue  # the run had finished its archive before the signal: its own verdict stands
        check = _cptest("check", str(new[0]), "--json", timeout=60)
        v = _verdict(check)
        if v.get("status") != "unknown":
            failures.append(f"{where}: verdict {v.get('status')}, expected unknown: "
                            + "; ".join(f"{x['checker']} {x['status']}: {x['reason']}" for x in v["verdicts"]
                                        if x["status"] != "pass"))
        elif not any(x["status"] == "unknown" and x["reason"] for x in v["verdicts"]):
            failures.append(f"{where}: unknown without a reason")
    assert not failures, "\n".join(failures)
