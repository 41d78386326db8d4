"""End to end on the CPU reference engine, co-located: every rank its own local node process.

The reference engine's ranks run on CPU whatever the placement, so these runs exercise what
co-location changes in cptest itself: one node process per rank, each on its own port, a rank fault
acting on its node's tree, the shutdown signal to the head node only, the archive labelled and
re-checked with the placement it ran under. SGLang's co-located runs are the GPU machine's
(docs/placement.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cptest.testing.archives import archived_text
from cptest.testing.ports import free_block
from tests.reference.conftest import ensure_tiny_models

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"


def free_port_block() -> int:
    """A main port whose node ports (+0, +1), rendezvous (+50) and baseline block (+100..) are free."""
    return free_block((0, 1, 50, 100, 101, 150))


def run_colocated(name: str, tmp_path: Path) -> tuple[dict[str, Any], Path]:
    base = free_port_block()
    proc = subprocess.run([sys.executable, "-m", "cptest", "run", str(SCENARIOS / f"{name}.cps"), "--engine",
                           "reference", "--placement", "colocated", "--ports", f"{base},{base + 100}",
                           "--results", str(tmp_path), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    try:
        verdict = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"no JSON verdict (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") \
            from None
    assert proc.stderr.startswith("cptest: co-located placement (--placement colocated)"), proc.stderr[:300]
    return verdict, Path(verdict["archive"])


def runner_events(archive: Path, event: str) -> list[dict[str, Any]]:
    out = []
    for line in archived_text(archive / "evidence" / "main" / "runner.jsonl").splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "lifecycle" and rec.get("event") == event:
            out.append(rec["detail"])
    return out


@pytest.fixture(scope="module", autouse=True)
def _models() -> None:
    ensure_tiny_models()


def test_a_killed_colocated_rank_is_its_own_node_and_the_archive_rechecks(tmp_path: Path) -> None:
    verdict, archive = run_colocated("fault_kill_rank_dcp2", tmp_path)
    assert verdict["status"] == "pass", verdict
    plan = json.loads((archive / "plan.json").read_text())
    assert [n["node_rank"] for n in plan["main"]["nodes"]] == [0, 1]
    assert plan["main"]["colocation"]["rank_gpus"] == [0, 0]
    assert {p.name for p in (archive / "logs").glob("main-node*.log")} == {"main-node0.log", "main-node1.log"}
    (fault,) = runner_events(archive, "fault")
    assert fault["node"] == 1 and fault["pid"] is not None and "error" not in fault
    check = subprocess.run([sys.executable, "-m", "cptest", "check", str(archive)], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_colocated_server_is_stopped_through_its_head_node(tmp_path: Path) -> None:
    verdict, archive = run_colocated("reference_stop_rank_dcp2", tmp_path)
    assert verdict["status"] == "pass", verdict
    mains = {e["node"]: e["pid"] for e in runner_events(archive, "launched")}
    terms = [s["pid"] for s in runner_events(archive, "signal") if s["sig"] == "SIGTERM"]
    assert terms == [mains[0]], (terms, mains)
    # Node 1 ended by itself, from its head's shutdown: nothing was left for the teardown to kill.
    assert {e["node"] for e in runner_events(archive, "exited")} == {0, 1}
    assert all(not t["killed"] for t in runner_events(archive, "teardown"))
