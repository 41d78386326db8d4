"""Specification of cptest/run/preflight.py: every cause that is not the engine's behaviour is found
before launch, named in one line with its remedy, and exits 3 with nothing launched or archived;
cptest's own crash during a run is an unknown with its traceback kept, never a FAIL."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cptest import pipeline
from cptest.outline import Logger, TerminalSink
from cptest.plan.model import ModelPin, NodeLaunch, Plan, ServerPlan
from cptest.run.models import model_tree_sha256
from cptest.run.preflight import RUNTIME_MIB, InfrastructureError, preflight, require
from cptest.run.process import ProcessLauncher

from conftest import fake_server, free_port, make_plan  # isort: skip

ROOT = Path(__file__).resolve().parents[2]


def checkpoint(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (d / "model.safetensors").write_bytes(b"\0" * 64)
    return d


def with_model(plan: Plan, model_dir: Path, sha256: str | None = None) -> Plan:
    node = plan.main.nodes[0].model_copy(update={"model_mount": str(model_dir)})
    main = plan.main.model_copy(update={"nodes": [node]})
    pin = ModelPin(kind="local", path=str(model_dir), sha256=sha256, architecture="LlamaForCausalLM")
    return plan.model_copy(update={"main": main, "pins": plan.pins.model_copy(update={"model": pin})})


def sglang_plan(gpu_ids: list[int]) -> Plan:
    node = NodeLaunch(node_rank=0, gpu_ids=gpu_ids, env={}, argv=["true"], port=free_port())
    main = ServerPlan(role="main", engine="sglang", release="0.5.17", nodes=[node],
                      base_url=f"http://127.0.0.1:{node.port}", world_size=len(gpu_ids),
                      topology={"tp": len(gpu_ids)}, geometry=[])
    return make_plan(main)


def codes(plan: Plan, tmp_path: Path, **kw: object) -> list[str]:
    return [c.code for c in preflight(plan, results=tmp_path / "results", **kw)]  # type: ignore[arg-type]


def test_a_machine_that_gives_the_plan_everything_finds_nothing(tmp_path: Path) -> None:
    plan = with_model(make_plan(fake_server("main", free_port())), checkpoint(tmp_path / "m"))
    assert codes(plan, tmp_path) == []
    require(plan, results=tmp_path / "results")  # does not raise


def test_a_missing_tiny_model_names_the_command_that_makes_it(tmp_path: Path) -> None:
    plan = with_model(make_plan(fake_server("main", free_port())), tmp_path / ".tiny-models" / "llama-kv1")
    (cause,) = preflight(plan, results=tmp_path)
    assert cause.code == "model_missing" and "does not exist" in cause.message
    made_by = f"cptest models make llama-kv1 --models {tmp_path / '.tiny-models'}"
    assert cause.remedy == f"make it: {made_by}"
    done = subprocess.run([sys.executable, "-m", "cptest", *made_by.split()[1:]], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert preflight(plan, results=tmp_path) == []  # the remedy is the whole remedy
    assert "\n" not in cause.line()


def test_a_model_directory_without_config_or_weights_is_missing_its_model(tmp_path: Path) -> None:
    no_config = tmp_path / "a"
    no_config.mkdir()
    no_weights = tmp_path / "b"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    base = make_plan(fake_server("main", free_port()))
    (a,) = preflight(with_model(base, no_config), results=tmp_path)
    (b,) = preflight(with_model(base, no_weights), results=tmp_path)
    assert (a.code, b.code) == ("model_missing", "model_missing")
    assert "config.json cannot be read" in a.message and "holds no weights" in b.message


def test_weights_that_are_not_the_pinned_ones_are_found(tmp_path: Path) -> None:
    d = checkpoint(tmp_path / "m")
    pinned = model_tree_sha256(d)
    base = make_plan(fake_server("main", free_port()))
    assert codes(with_model(base, d, pinned), tmp_path) == []
    (d / "model.safetensors").write_bytes(b"\1" * 64)  # one weight changed
    (cause,) = preflight(with_model(base, d, pinned), results=tmp_path)
    assert cause.code == "weights_mismatch" and pinned in cause.message
    (d / "model.safetensors").write_bytes(b"\0" * 64)
    (d / "cptest-weights.json").write_text("{}")  # cptest's own marker is not part of the checkpoint
    assert codes(with_model(base, d, pinned), tmp_path) == []


def test_a_port_another_process_listens_on_is_found_and_a_closed_one_is_not(tmp_path: Path) -> None:
    port = free_port()
    plan = make_plan(fake_server("main", port), baseline=fake_server("baseline", free_port()))
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))
        other.listen()
        (cause,) = preflight(plan, results=tmp_path)
        assert cause.code == "port_in_use" and f":{port}" in cause.message and "--ports" in cause.remedy
    assert codes(plan, tmp_path) == []


def test_gpus_the_machine_lacks_or_that_are_full_are_found(tmp_path: Path) -> None:
    plan = sglang_plan([0, 1])
    assert codes(plan, tmp_path, gpus=lambda: {"0": 140_000, "1": 140_000}) == []
    (gone,) = preflight(plan, results=tmp_path, gpus=lambda: {"0": 140_000})
    assert gone.code == "gpus_missing" and "[0, 1]" in gone.message and "[0]" in gone.message
    (busy,) = preflight(plan, results=tmp_path, gpus=lambda: {"0": 140_000, "1": RUNTIME_MIB - 1})
    assert busy.code == "gpu_memory_busy" and "GPU 1" in busy.message
    assert codes(plan, tmp_path, gpus=lambda: None) == []  # unreadable: `runnable` speaks for that
    # the reference engine uses no GPU: nothing to ask
    assert codes(make_plan(fake_server("main", free_port())), tmp_path, gpus=lambda: {}) == []


def test_too_little_disk_where_the_archive_goes_is_found(tmp_path: Path) -> None:
    plan = make_plan(fake_server("main", free_port()))
    (cause,) = preflight(plan, results=tmp_path / "not" / "yet", min_free_disk=1 << 62)
    assert cause.code == "disk_full" and str(tmp_path) in cause.message and "--results" in cause.remedy


def test_run_scenario_stops_before_anything_is_archived(tmp_path: Path) -> None:
    plan = with_model(make_plan(fake_server("main", free_port())), tmp_path / "nowhere")
    out = tmp_path / "results" / "x"
    with pytest.raises(InfrastructureError) as e:
        pipeline.run_scenario(plan, out, ProcessLauncher(), scenario_text="", log=Logger([]))
    assert e.value.exit_code == 3 and e.value.causes[0].code == "model_missing"
    assert not out.exists()


def test_a_crash_of_cptest_during_the_run_is_unknown_with_its_traceback_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import cptest.run.runner

    def broken(*_a: object, **_k: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cptest.run.runner, "run_plan", broken)
    out = tmp_path / "a"
    outcome = pipeline.run_scenario(make_plan(fake_server("main", free_port())), out, ProcessLauncher(),
                                    scenario_text="", log=Logger([TerminalSink(io.StringIO())]))
    assert outcome.exit_code == 3 and isinstance(outcome.error, pipeline.CptestCrash)
    assert "cptest_crash" in outcome.error.render() and "ZeroDivisionError: a bug" in outcome.error.render()
    assert "ZeroDivisionError" in (out / "logs" / "cptest-crash.txt").read_text()
    assert outcome.verdict.status == "unknown"  # never the engine's fail
    assert all(v.status != "fail" for v in outcome.verdict.verdicts)


def test_the_cli_says_it_in_one_line_exits_3_and_launches_nothing(tmp_path: Path) -> None:
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    # A scenario naming a local tiny model that is not there (its facts declared, so it parses).
    text = (ROOT / "scenarios" / "reference_stop_rank_dcp2.cps").read_text()
    synthetic = text[text.index("  model synthetic"):text.index("  }\n", text.index("  model synthetic")) + 4]
    local = ('  model local "../.tiny-models/llama-kv1"\n  facts { architecture "LlamaForCausalLM" layers 4 '
             'hidden 256 heads 8 kv_heads 1 head_dim 64 vocab 4096 }\n')
    text = text.replace("scenario reference_stop_rank_dcp2", "scenario lost").replace(synthetic, local)
    tiny = ROOT / "scenarios" / "defaults" / "tiny.cps"
    text = text.replace('extends "defaults/tiny.cps"', f'extends "{tiny}"')
    (scenarios / "lost.cps").write_text(text)
    cmd = [sys.executable, "-m", "cptest", "run", str(scenarios / "lost.cps"),
           "--results", str(tmp_path / "results"), "--engine", "reference", "--no-baseline-cache",
           # free ports: only the missing model may be the cause (another run may hold 30000)
           "--ports", f"{free_port()},{free_port()}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 3 and done.stdout == ""
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("unknown (model_missing): model directory")
    assert "cptest models make llama-kv1" in last
    assert not (tmp_path / "results").exists()
    as_json = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    got = json.loads(as_json.stdout)
    assert as_json.returncode == 3 and got["status"] == "unknown"
    assert [c["code"] for c in got["causes"]] == ["model_missing"]
