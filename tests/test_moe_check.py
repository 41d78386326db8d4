"""tools/device/moe_check.py, the Python side of moe_check.sh (D64), on the CPU: its comparison tells a
bfloat16 forward of the tiny Qwen3-MoE from one that lost its experts, and its startup split reads
SGLang's log lines as `cptest startup` does. The script itself runs only on the GPU machine."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cptest.run.models import TINY, ensure_synthetic

ROOT = Path(__file__).resolve().parents[1]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("moe_check", ROOT / "tools" / "device" / "moe_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["moe_check"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("moe") / "qwen3-moe-kv1"
    ensure_synthetic(TINY["qwen3-moe-kv1"].model_dump(), d)
    return d


def _record(mc: ModuleType, model: Any, lens: list[int], new: int = 6) -> dict[str, Any]:
    """What `serve` writes, had `model` been the server: greedy tokens and their log-probabilities."""
    requests = []
    for i, n in enumerate(lens):
        ids = mc.prompt(i, n)
        out: list[int] = []
        lps: list[float] = []
        with torch.no_grad():
            for _ in range(new):
                logp = torch.log_softmax(model(torch.tensor([ids + out])).logits[0, -1].float(), -1)
                out.append(int(logp.argmax()))
                lps.append(float(logp[out[-1]]))
        requests.append({"rid": f"r{i}", "ok": True, "input_ids": ids, "output_ids": out,
                         "output_logprobs": lps})
    return {"ready": True, "rounds": {"a": {"requests": requests, "s": 0.0}}}


def test_a_bfloat16_forward_is_consistent_and_one_without_experts_is_not(moe_dir: Path) -> None:
    mc = _load()
    bf16 = transformers.AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.bfloat16).eval()
    good = mc.compare(moe_dir, _record(mc, bf16, [5, 33]))
    assert good["verdict"].startswith("consistent"), good
    assert good["sglang_vs_fp32"]["n"] == 12 and all(r["finite_logprobs"] for r in good["requests"])
    lost = transformers.AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in lost.model.layers:
            layer.mlp.gate.weight.zero_()  # routing lost, not the calibration's own perturbation
            layer.mlp.experts.gate_up_proj.mul_(0.5)
    bad = mc.compare(moe_dir, _record(mc, lost, [5, 33]))
    assert bad["verdict"].startswith("INCONSISTENT"), bad
    failed = {"ready": True, "rounds": {"a": {"requests": [{"rid": "x", "ok": False, "error": "timeout"}]}}}
    assert mc.compare(moe_dir, failed)["verdict"] == "no tokens to compare"


def test_startup_is_split_at_sglangs_log_lines() -> None:
    mc = _load()
    log = "\n".join([
        "[2026-12-01 10:00:05] server_args=ServerArgs(...)",
        "[2026-12-01 10:00:09 TP0] Init torch distributed begin.",
        "[2026-12-01 10:00:10 TP0] Init torch distributed ends. mem usage=0.00 GB",
        "[2026-12-01 10:00:12 TP0] Using default MoE kernel config. Performance might be sub-optimal!",
        "[2026-12-01 10:00:14 TP0] Load weight end. type=Qwen3MoeForCausalLM, dtype=torch.bfloat16",
        "[2026-12-01 10:00:15 TP0] KV Cache is allocated. #tokens: 65536",
        "[2026-12-01 10:00:20] INFO:     Uvicorn running on http://127.0.0.1:31000 (Press CTRL+C to quit)",
        "[2026-12-01 10:03:20] The server is fired up and ready to roll!",
    ])
    launch = 1796119200.0  # 2026-12-01 10:00:00 UTC
    got = mc.startup_phases(log, launch, launch + 202)
    assert got["phases"] == {"imports": 5.0, "spawn": 4.0, "dist_init": 1.0, "weights": 4.0, "kv_pool": 1.0,
                             "graphs": None, "http": 5.0, "warmup": 180.0, "ready": 2.0}
    assert got["total_s"] == 202.0
    assert any("MoE kernel config" in line for line in got["moe_lines"])


def test_the_script_parses_and_pins_the_tree_cptest_writes(moe_dir: Path) -> None:
    import re
    import subprocess

    from cptest.run.models import model_tree_sha256

    script = ROOT / "tools" / "device" / "moe_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    pinned = re.search(r"^PINNED_TREE=([0-9a-f]{64})$", script.read_text(), re.M)
    assert pinned is not None and pinned.group(1) == model_tree_sha256(moe_dir)
