"""A reference-engine archive made in one checkout reruns from another checkout at another path,
with another model store, and its evidence diffs clean (issue 12: reproducible evidence).

The two checkouts are copies of this one's package and scenarios in different folders of different
depth (what a clone elsewhere is to cptest: `paths.checkout()` and the default model store follow
the package). Nothing of the first is visible to the second: the rerun re-plans from the archived
scenario.cps, writes the synthetic checkpoint into its own store and checks that its tree hash is
the one the archive pinned. Every file of both archives is then searched for an absolute path of
either machine-side root: the checkouts, the model stores, the temporary folder, the home.

Takes about two minutes on 2 CPU cores (two runs of a 2-rank DCP server, no baseline).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]

SCENARIO = """cptest 1
# DCP2 on TP2 with the suite's tiny Llama: small enough to run twice in a test.
scenario portable_dcp2 {
  extends "defaults/tiny.cps"
  engine reference "builtin"
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
    dcp 2
  }
  baseline none
  workload {
    requests 8
    concurrency 4
    prompt_tokens uniform(16, 96)
    output_tokens 8
  }
  expect {
    rows kv_owner position % 2
    capacity logical == 2 * physical within 0.01
  }
}
"""


def _checkout(where: Path) -> Path:
    where.mkdir(parents=True)
    for name in ("cptest", "scenarios"):
        shutil.copytree(REPO / name, where / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", where / "pyproject.toml")
    (where / "scenarios" / "portable_dcp2.cps").write_text(SCENARIO)
    return where


def _cptest(checkout: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # `python -m cptest` from the checkout imports that checkout's package, as a clone's would.
    env = {k: v for k, v in os.environ.items()
           if k not in ("CPTEST_MODELS", "CPTEST_MODEL_CACHE", "PYTHONPATH")}
    env["PYTHONPATH"] = str(checkout)
    return subprocess.run([sys.executable, "-m", "cptest", *args], cwd=checkout, env=env, capture_output=True,
                          text=True, timeout=900)


def _absolute_paths_in(archive: Path, roots: list[str]) -> list[str]:
    found = []
    for f in sorted(archive.rglob("*")):
        if f.is_file():
            text = f.read_text(encoding="utf-8", errors="replace")
            found += [f"{f.relative_to(archive)}: {r}" for r in roots if r in text]
    return found


def test_an_archive_reruns_from_another_checkout_and_store_with_no_difference(tmp_path: Path) -> None:
    a = _checkout(tmp_path / "first")
    b = _checkout(tmp_path / "somewhere" / "else" / "second")
    ports = "31771,31871"
    made = _cptest(a, "run", "scenarios/portable_dcp2.cps", "--engine", "reference", "--ports", ports,
                   "--no-baseline-cache", "--json")
    assert made.returncode == 0, made.stderr[-3000:]
    archive = Path(json.loads(made.stdout)["archive"])
    archive = archive if archive.is_absolute() else a / archive
    manifest = json.loads((archive / "manifest.json").read_text())
    tree = manifest["pins"]["model"]["sha256"]
    assert tree and len(tree) == 64  # pinned by content
    assert (a / ".cptest" / "models").is_dir() and not (b / ".cptest").exists()

    again = _cptest(b, "rerun", str(archive), "--no-baseline-cache", "--json")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    out = json.loads(again.stdout)
    assert out["status"] == "pass" and out["diff"]["same"] and out["diff"]["differences"] == 0, out["diff"]
    second = Path(out["archive"])
    second = second if second.is_absolute() else b / second
    assert json.loads((second / "manifest.json").read_text())["pins"]["model"]["sha256"] == tree
    # The second checkout wrote the checkpoint into its own store, and it came out the same bytes.
    assert any((b / ".cptest" / "models").iterdir())

    roots = [str(tmp_path), str(REPO), str(Path.home()), sys.prefix]
    assert _absolute_paths_in(archive, roots) == []
    assert _absolute_paths_in(second, roots) == []
    plan = json.loads((archive / "plan.json").read_text())
    assert plan["main"]["nodes"][0]["model_mount"].startswith("<models>/")


def test_a_rerun_whose_checkpoint_comes_out_other_bytes_is_unknown_not_a_fail(tmp_path: Path) -> None:
    # The archive pins the tree hash; a store whose checkpoint under that name holds other weights
    # (another torch build would write other bytes) stops the rerun before launch, exit 3.
    a = _checkout(tmp_path / "first")
    made = _cptest(a, "run", "scenarios/portable_dcp2.cps", "--engine", "reference", "--ports", "31772,31872",
                   "--no-baseline-cache", "--json")
    assert made.returncode == 0, made.stderr[-3000:]
    archive = Path(json.loads(made.stdout)["archive"])
    archive = archive if archive.is_absolute() else a / archive
    (store,) = [d for d in (a / ".cptest" / "models").iterdir() if d.is_dir()]
    weights = store / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    again = _cptest(a, "rerun", str(archive), "--no-baseline-cache", "--results", str(tmp_path / "r"))
    assert again.returncode == 3, again.stderr[-3000:]
    assert "unknown (weights_mismatch)" in again.stderr
    assert not (tmp_path / "r").exists()
