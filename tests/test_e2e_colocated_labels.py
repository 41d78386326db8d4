"""End to end on the CPU reference engine: a co-located run is labelled co-located in everything it
writes and prints, and `cptest check` re-derives its verdict.json byte for byte.

One run of `reference_stop_rank_dcp2` with `--placement colocated` (each rank its own local node
process; about 30 s on 2 CPU cores). Its ports come from the free-port helper: node k of a
co-located server listens on the server's port + k, and node 0 hosts the rendezvous at port + 50.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cptest.engines.protocol import RENDEZVOUS_PORT_OFFSET
from cptest.testing.ports import free_block, free_port
from tests.reference.conftest import ensure_tiny_models

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "reference_stop_rank_dcp2.cps"
RANKS = 2


def _cptest(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cptest", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The co-located run: its output and its archive."""
    ensure_tiny_models()
    results = tmp_path_factory.mktemp("colocated")
    done = _cptest("run", "--placement", "colocated", SCENARIO, "--results", results,
                   "--ports", f"{free_block([*range(RANKS), RENDEZVOUS_PORT_OFFSET])},{free_port()}")
    assert done.returncode == 0, done.stdout + done.stderr
    archive = next((results / "reference_stop_rank_dcp2").iterdir())
    return done, archive


def test_a_colocated_run_says_so_first_and_on_its_verdict_line(run) -> None:
    done, _ = run
    assert done.stderr.splitlines()[0].startswith("cptest: co-located placement (--placement colocated)")
    assert done.stdout.splitlines()[0] == "reference_stop_rank_dcp2: PASS (engine reference, co-located)"


def test_every_file_a_colocated_run_writes_is_labelled_co_located(run) -> None:
    _, archive = run
    assert json.loads((archive / "verdict.json").read_text())["placement"] == "colocated"
    md = (archive / "report.md").read_text()
    assert "| placement | co-located (see Placement) |" in md
    assert md.index("## Placement: co-located") < md.index("## Verdicts")
    assert "| rank → GPU | rank 0: GPU 0; rank 1: GPU 0 |" in md
    html = (archive / "report.html").read_text()
    assert 'id="colocated"' in html and "these figures are not speed measurements" in html
    props = ET.fromstring((archive / "junit.xml").read_text()).findall("./testsuite/properties/property")
    assert {p.get("name"): p.get("value") for p in props}["placement"] == "colocated"


def test_check_rederives_a_colocated_verdict_byte_for_byte(run) -> None:
    _, archive = run
    done = _cptest("check", archive)
    assert done.returncode == 0 and "differs" not in done.stderr, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == "reference_stop_rank_dcp2: PASS (engine reference, co-located)"
