"""The model store: `cptest models make|list|add`, names by content, lookup by tree hash."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cptest.lang import parse_file
from cptest.run.models import TINY, add_checkpoint, find_by_tree_sha256, model_tree_sha256, store_dir

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]


def cptest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cptest", *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def test_every_tiny_scenario_declares_a_model_models_make_writes() -> None:
    # `cptest models make --all` ahead of a GPU session writes exactly the directories the suite's
    # runs will use: each tiny scenario's synthetic model is one of TINY, by content name.
    names = {g.store_name(): n for n, g in TINY.items()}
    seen = set()
    for f in sorted((REPO / "scenarios").rglob("*.cps")):
        if "defaults" in f.parts:
            continue
        geometry = parse_file(f).model.synthetic_geometry()
        assert geometry is not None, f"{f.name}: every committed scenario names a synthetic model"
        if geometry.hidden == 256:
            assert geometry.store_name() in names, f"{f.name}: its tiny model is not one of TINY"
            seen.add(names[geometry.store_name()])
    assert seen == set(TINY)


def test_models_make_writes_named_links_and_list_shows_their_hashes(tmp_path: Path) -> None:
    store = tmp_path / "store"
    made = cptest("models", "make", "llama-kv1", "qwen3-kv2", "--models", str(store), "--json")
    assert made.returncode == 0, made.stderr
    out = json.loads(made.stdout)
    assert [m["name"] for m in out["models"]] == ["llama-kv1", "qwen3-kv2"]
    for m in out["models"]:
        link = store / m["name"]
        assert link.is_symlink() and (link / "config.json").is_file()
        assert Path(m["directory"]).name == TINY[m["name"]].store_name()
        assert m["tree_sha256"] == model_tree_sha256(link)
    listed = json.loads(cptest("models", "list", "--models", str(store), "--json").stdout)
    assert {(e["name"], e["aliases"][0]) for e in listed["models"]} == {
        (TINY["llama-kv1"].store_name(), "llama-kv1"), (TINY["qwen3-kv2"].store_name(), "qwen3-kv2")}
    # Making it again writes nothing new: the same directory, the same hash.
    again = json.loads(cptest("models", "make", "llama-kv1", "--models", str(store), "--json").stdout)
    assert again["models"][0]["tree_sha256"] == out["models"][0]["tree_sha256"]


def test_an_unknown_model_name_is_bad_input_naming_the_known_ones(tmp_path: Path) -> None:
    done = cptest("models", "make", "llama-70b", "--models", str(tmp_path))
    assert done.returncode == 2
    assert "unknown model llama-70b" in done.stderr and "llama-kv1" in done.stderr
    assert not any(tmp_path.iterdir())


def test_a_local_checkpoint_added_to_the_store_is_found_by_its_tree_hash(tmp_path: Path) -> None:
    store = tmp_path / "store"
    made = cptest("models", "make", "llama-kv1", "--models", str(tmp_path / "src"), "--json")
    made = json.loads(made.stdout)
    source = Path(made["models"][0]["directory"])
    mine = tmp_path / "my-checkpoint"
    shutil.copytree(source, mine)
    tree = model_tree_sha256(mine)
    assert find_by_tree_sha256(store, tree) is None
    target, added = add_checkpoint(mine, store)
    assert added == tree and target.name == f"local-{tree[:16]}"
    assert find_by_tree_sha256(store, tree) == target
    assert add_checkpoint(mine, store) == (target, tree)  # idempotent
    (mine / "model.safetensors").write_bytes(b"other weights")
    assert find_by_tree_sha256(store, model_tree_sha256(mine)) is None


def test_the_store_is_the_option_then_the_environment_then_the_checkout(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    monkeypatch.delenv("CPTEST_MODELS", raising=False)
    monkeypatch.delenv("CPTEST_MODEL_CACHE", raising=False)
    assert store_dir() == REPO / ".cptest" / "models"
    monkeypatch.setenv("CPTEST_MODEL_CACHE", str(tmp_path / "old"))
    assert store_dir() == tmp_path / "old"
    monkeypatch.setenv("CPTEST_MODELS", str(tmp_path / "env"))
    assert store_dir() == tmp_path / "env"
    assert store_dir(tmp_path / "opt") == tmp_path / "opt"
