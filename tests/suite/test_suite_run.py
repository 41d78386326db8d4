"""`cptest suite` for real: concurrent reference-engine runs, an exclusive one alone, bad input.

Each scenario is a real `cptest run` child with real engine processes (the CPU reference engine:
CI has no GPU). The packing itself is specified in test_schedule.py; here the question is whether
what the scheduler decided is what happened: runs overlapped in time, got their own ports and
cores (the archived process samples show each server's CPU affinity), the exclusive one ran alone,
every verdict passed, and the suite record says so.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cptest.errors import ScenarioError
from cptest.evidence import ProcessSample, read_records
from cptest.outline import Logger, TerminalSink
from cptest.suite.machine import SLOT_STRIDE, Machine
from cptest.suite.runner import run_suite, scenario_files
from tests.reference.conftest import ensure_tiny_models

pytest.importorskip("torch")
REPO = Path(__file__).resolve().parents[2]
PORT_BASE = 23000
"""Far from a lone run's 30000/30100, which another run on this machine may hold (its preflight
would then refuse the suite's children: port_in_use), and below Linux's ephemeral range
(32768-60999), where any process's outgoing connection may take a port as its source port at any
moment: a rendezvous port taken so made a scenario unknown."""

SCENARIO = """cptest 1
scenario {name} {{
  {exclusive}
  extends "{defaults}"
  engine reference "builtin"
  model local "{model}"
  facts {{
    architecture "LlamaForCausalLM"
    layers 4
    hidden 256
    heads 8
    kv_heads 1
    head_dim 64
    vocab 4096
  }}
  topology {{
    gpus 2
    tp 2
  }}
  baseline none
  workload {{
    requests 8
    concurrency 4
    output_tokens 8
    prompt_tokens uniform(16, 64)
  }}
  expect {{
    serving all_complete
  }}
}}
"""


def assert_own_slots(*entries: Any) -> None:
    """Each scenario got its own port slot of the suite's grid (SLOT_STRIDE ports a slot from PORT_BASE).
    Which slots depends on what other cptest processes on this host claim (another copy of this
    test suite, a run), so the test asks for distinct slots of the grid, not for the first ones."""
    ports = [e.granted.placement.main_port for e in entries]
    assert len(set(ports)) == len(ports), ports
    assert all(p >= PORT_BASE and (p - PORT_BASE) % SLOT_STRIDE == 0 for p in ports), ports


def write(folder: Path, name: str, exclusive: str = "") -> Path:
    f = folder / f"{name}.cps"
    f.write_text(SCENARIO.format(name=name, exclusive=exclusive, model=ensure_tiny_models() / "llama-kv1",
                                 defaults=REPO / "scenarios/defaults/tiny.cps"))
    return f


def test_two_scenarios_share_the_machine_and_an_exclusive_one_runs_alone(tmp_path: Path) -> None:
    files = [write(tmp_path, "a"), write(tmp_path, "b"), write(tmp_path, "x", 'exclusive "times its steps"')]
    results = tmp_path / "results"
    done = run_suite(files, Machine({}, (0, 1), port_base=PORT_BASE), results=results, log=Logger([]),
                     gpu_present=False, models=ensure_tiny_models())
    by = {e.name: e for e in done.entries}
    assert done.exit_code == 0, [(e.name, e.status, e.not_run) for e in done.entries]
    assert {e.status for e in done.entries} == {"pass"}
    a, b, x = by["a"], by["b"], by["x"]
    assert a.started < b.ended and b.started < a.ended, "a and b did not run at the same time"
    assert x.started >= max(a.ended, b.ended), "the exclusive scenario started beside others"
    assert_own_slots(a, b)
    assert {a.granted.cpus, b.granted.cpus} == {(0,), (1,)}
    for e in (a, b, x):
        archive = Path(e.archive)
        assert archive.parent.parent == results
        node = json.loads((archive / "plan.json").read_text())["main"]["nodes"][0]
        assert node["cpus"] == list(e.granted.cpus) and node["port"] == e.granted.placement.main_port
        records, _ = read_records(archive / "evidence" / "main" / "runner.jsonl")
        running = [s for s in records if isinstance(s, ProcessSample) and s.phase == "running"]
        tree = [p for s in running for p in s.procs if p.get("scope") == "tree"]
        assert tree and all(p["cpus"] == list(e.granted.cpus) for p in tree), tree
    record = json.loads((done.folder / "suite.json").read_text())
    assert record["counts"] == {"pass": 3, "fail": 0, "unknown": 0}
    assert [s["scenario"] for s in record["scenarios"]] == ["a", "b", "x"]
    assert (done.folder / "summary.md").read_text().count("| PASS |") == 3
    index = (done.folder / "index.html").read_text()  # every run's report.html, linked relatively
    assert all(f'href="../../{e.name}/{Path(e.archive).name}/report.html"' in index for e in (a, b, x))
    assert all((Path(e.archive) / "report.html").is_file() for e in (a, b, x))


def test_two_colocated_scenarios_run_at_once_each_node_on_its_own_port(tmp_path: Path) -> None:
    files = [write(tmp_path, "c1"), write(tmp_path, "c2")]
    results, console = tmp_path / "results", io.StringIO()
    done = run_suite(files, Machine({}, (0, 1), port_base=PORT_BASE), results=results,
                     log=Logger([TerminalSink(console, color=False)]), gpu_present=False,
                     models=ensure_tiny_models(), placement_mode="colocated")
    assert done.exit_code == 0, [(e.name, e.status, e.not_run) for e in done.entries]
    assert console.getvalue().startswith("cptest: co-located placement for 2 of 2 scenario(s) "
                                         "(--placement colocated): c1, c2;")
    c1, c2 = done.entries
    assert c1.started < c2.ended and c2.started < c1.ended, "c1 and c2 did not run at the same time"
    assert_own_slots(c1, c2)
    for e in (c1, c2):
        port = e.granted.placement.main_port
        assert e.status == "pass" and Path(e.archive).parent.parent == results
        main = json.loads((Path(e.archive) / "plan.json").read_text())["main"]
        assert main["colocation"]["rank_gpus"] == [0, 0]  # the reference engine's ranks: on CPU
        assert [n["port"] for n in main["nodes"]] == [port, port + 1]
        assert all(f"127.0.0.1:{port + 50}" in n["argv"] for n in main["nodes"])  # node 0's rendezvous
        assert all(n["cpus"] == list(e.granted.cpus) for n in main["nodes"])
    record = json.loads((done.folder / "suite.json").read_text())
    assert [(s["demand"]["placement"], s["placement"]["mode"]) for s in record["scenarios"]] == \
        [("colocated", "colocated")] * 2
    summary = (done.folder / "summary.md").read_text()
    for e in (c1, c2):
        cpu, port = e.granted.cpus[0], e.granted.placement.main_port
        assert f"| co-located, no GPU, CPUs {cpu}, ports {port}/{port + 100} |" in summary


def test_a_scenario_without_its_weights_is_unknown_with_the_cause_and_the_others_run(tmp_path: Path) -> None:
    good = write(tmp_path, "good")
    lost = tmp_path / "lost.cps"
    lost.write_text(SCENARIO.format(name="lost", exclusive="", model=tmp_path / "no-such-model",
                                    defaults=REPO / "scenarios/defaults/tiny.cps"))
    (tmp_path / "no-such-model").mkdir()  # its config.json (the plan reads it) but no weights
    (tmp_path / "no-such-model" / "config.json").write_text(
        (ensure_tiny_models() / "llama-kv1" / "config.json").read_text())
    files = [good, lost]
    results = tmp_path / "results"
    done = run_suite(files, Machine({}, (0, 1), port_base=PORT_BASE), results=results, log=Logger([]),
                     gpu_present=False, models=ensure_tiny_models())
    by = {e.name: e for e in done.entries}
    assert by["good"].status == "pass"
    assert by["lost"].status == "unknown" and by["lost"].archive is None
    assert "holds no weights" in (by["lost"].not_run or "") and "model local" in (by["lost"].not_run or "")
    assert done.exit_code == 3


def test_a_bad_file_stops_the_suite_before_anything_runs(tmp_path: Path) -> None:
    good = write(tmp_path, "good")
    bad = tmp_path / "bad.cps"
    bad.write_text("cptest 1\nscenario bad {\n  topology { tp two }\n}\n")
    out = subprocess.run([sys.executable, "-m", "cptest", "suite", str(good), str(bad), "--results",
                          str(tmp_path / "r")], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 2
    assert f"{bad}:3:" in out.stderr
    assert not (tmp_path / "r").exists()  # nothing launched, nothing archived


def test_folders_expand_to_their_scenarios_and_missing_paths_are_bad_input(tmp_path: Path) -> None:
    (tmp_path / "defaults").mkdir()
    (tmp_path / "defaults" / "d.cps").write_text("")
    for n in ("b", "a"):
        (tmp_path / f"{n}.cps").write_text("")
    assert [f.name for f in scenario_files([tmp_path, tmp_path / "a.cps"])] == ["a.cps", "b.cps"]
    with pytest.raises(ScenarioError, match="no such scenario file or folder"):
        scenario_files([tmp_path / "nope"])


def test_run_placement_options_reach_the_plan_and_bad_ones_are_exit_2(tmp_path: Path) -> None:
    f = write(tmp_path, "p")
    bad = subprocess.run([sys.executable, "-m", "cptest", "run", str(f), "--ports", "30000"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 2 and "--ports '30000': expected two port numbers" in bad.stderr
    from cptest.cli import parse_placement

    p = parse_placement("1", "4-5", "31000,31001")
    assert (p.gpus, p.cpus, p.main_port, p.baseline_port) == ([1], [4, 5], 31000, 31001)
