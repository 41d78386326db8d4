"""tools/device/family_parity.py on the CPU: a TP1 archive of the reference engine (float32, exact)
agrees with transformers' float32 forward to float32 noise, an archive whose logprobs were shifted
shows the shift, and bad input exits 2. The script itself scores SGLang's archives on the GPU
machine."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cptest.run.models import TINY
from cptest.store import existing_file
from cptest.testing.archives import archived_text
from tests.reference.conftest import ensure_tiny_models

ROOT = Path(__file__).resolve().parents[1]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

def _model_block(name: str) -> str:
    """The `model synthetic` block of the tiny model `name`, from its geometry."""
    g = TINY[name].model_dump()
    items = "".join(f"    {k} {v}\n" for k, v in g.items() if k != "architecture" and v is not None)
    return f"  model synthetic {g['architecture']} {{\n{items}  }}\n"


SCENARIO = ("cptest 1\nscenario tp1_ref_llama {\n"
            '  description "TP1 tiny Llama on the reference engine: an archive for family_parity"\n'
            "  engine reference\n" + _model_block("llama-kv1") +
            "  topology {\n    gpus 1\n    tp 1\n  }\n  baseline none\n"
            "  workload {\n    requests 3\n    concurrency 3\n"
            "    prompt_tokens 24\n    output_tokens 6\n  }\n"
            "  expect {\n    serving all_complete\n  }\n}\n")


def _load() -> ModuleType:
    path = ROOT / "tools" / "device" / "family_parity.py"
    spec = importlib.util.spec_from_file_location("family_parity", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["family_parity"] = module
    spec.loader.exec_module(module)
    return module


fp = _load()


@pytest.fixture(scope="module")
def store() -> Path:
    return ensure_tiny_models()


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory, store: Path) -> Path:
    """One TP1 run of the reference engine (about 5 s): 3 requests, 6 output tokens each."""
    tmp = tmp_path_factory.mktemp("family-parity")
    (tmp / "tp1_ref_llama.cps").write_text(SCENARIO)
    proc = subprocess.run([sys.executable, "-m", "cptest", "run", str(tmp / "tp1_ref_llama.cps"), "--engine",
                           "reference", "--results", str(tmp / "results"), "--models", str(store), "--json"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return Path(json.loads(proc.stdout)["archive"])


def _shifted(archive: Path, into: Path, by: float) -> Path:
    """A copy of `archive` whose main server's output logprobs are all `by` lower."""
    copy = into / "results" / archive.parent.name / archive.name
    shutil.copytree(archive, copy)
    runner = copy / "evidence" / "main" / "runner.jsonl"
    assert existing_file(runner)  # unpacked: the runner records of 3 requests are small
    lines = []
    for line in archived_text(runner).splitlines():
        r = json.loads(line)
        if r.get("kind") == "request":
            r["output_logprobs"] = [x - by for x in r["output_logprobs"]]
        lines.append(json.dumps(r))
    runner.write_text("\n".join(lines) + "\n")
    return copy


def test_the_exact_reference_engine_agrees_with_transformers_float32(archive: Path, store: Path) -> None:
    code, rows = fp.run(archive.parent, models=store, device="cpu", max_ratio=1.0)
    assert code == 0
    (row,) = rows
    assert row["requests"] == 3 and row["positions"] == 18 and row["nonfinite"] == 0
    assert row["server_vs_fp32"]["max"] <= 1e-4
    assert row["top1_agree"] == 1.0
    # The bf16 forward is far noisier than the float32 reference engine: the ratio is small.
    assert row["floor"]["p99"] >= row["bf16_rounding"] > 0
    assert row["ratio"]["p99"] < 0.05


def test_shifted_logprobs_show_the_shift_and_fail_the_ratio(archive: Path, store: Path,
                                                            tmp_path: Path) -> None:
    copy = _shifted(archive, tmp_path, by=0.5)
    code, rows = fp.run(copy, models=store, device="cpu", max_ratio=4.0)
    (row,) = rows
    assert code == 1
    assert row["server_vs_fp32"]["p50"] == pytest.approx(0.5, abs=1e-3)
    assert row["ratio"]["p99"] > 4.0
    assert row["top1_agree"] == 1.0  # the tokens are the same: only their logprobs moved


def test_the_command_prints_json_and_exits_2_on_bad_input(archive: Path, store: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert fp.main([str(archive), "--models", str(store), "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["exit"] == 0 and out["archives"][0]["scenario"] == "tp1_ref_llama"
    assert fp.main([str(tmp_path)]) == 2
    assert "no archive under" in capsys.readouterr().err
    # A prompt that is not the plan's: the recorded length no longer matches.
    copy = tmp_path / "bad" / archive.name
    shutil.copytree(archive, copy)
    runner = copy / "evidence" / "main" / "runner.jsonl"
    records = [json.loads(line) for line in runner.read_text().splitlines()]
    next(r for r in records if r.get("kind") == "request")["prompt_len"] += 1
    runner.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert fp.main([str(copy), "--models", str(store), "--device", "cpu"]) == 2
    assert "is not the plan's" in capsys.readouterr().err


@pytest.mark.parametrize("x", [1.5, 0.3, 9.0, -2.25])
def test_bf16_spacing_is_one_bfloat16_step_at_x(x: float) -> None:
    x = float(torch.tensor(x).bfloat16())  # a bfloat16 number: its neighbour is one step away
    step = fp.bf16_spacing(x)
    assert float(torch.tensor(x + step).bfloat16()) == x + step
    assert float(torch.tensor(x + step / 4).bfloat16()) == x


@pytest.mark.parametrize("name", ["llama-kv1", "qwen3-kv1", "qwen3-moe-kv1", "deepseek-mla-512"])
def test_transformers_loads_every_family_checkpoint_whole(name: str, store: Path) -> None:
    # The baselines' four families (scenarios/baselines/): a weight transformers left unset would make
    # the reference another model, so the oracle refuses it.
    from cptest.run.models import ensure_synthetic

    directory = store / TINY[name].store_name()
    ensure_synthetic(TINY[name].model_dump(), directory)
    oracle = fp.Oracle(directory, "cpu")
    ids = list(range(3, 30))
    lp, argmax, _ = oracle.score(oracle.f32, ids, 5)
    assert len(lp) == len(argmax) == 5 and all(v < 0 for v in lp)


def test_a_checkpoint_missing_a_weight_is_refused(store: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    source = store / TINY["llama-kv1"].store_name()
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(source / "config.json", broken / "config.json")
    tensors = load_file(source / "model.safetensors")
    del tensors["model.layers.0.mlp.down_proj.weight"]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(fp.BadInput, match="does not load"):
        fp.Oracle(broken, "cpu")
