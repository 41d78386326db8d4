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


TREES = {
    # Made on the H200 machine (torch 2.11) too, the first four: results/_measure/run16-replay-check
    # and run17 list their trees as `cptest models make` printed them there.
    "llama-kv1": ("llama-833975c7d4a76e8d",
                  "3a799bfd847b5e08a8ce17f6ee0047188dbbc88c1050a92ea1ed2899e9d6974f"),
    "llama-kv2": ("llama-c46cb2256c842836",
                  "f18da58175737366e07de210ce84962d5c77f2b43108bc543ce9667aa92c7b6e"),
    "llama-kv4": ("llama-5190fbdab938c8f7",
                  "ad0894797a964111f4305435f5b7538f11b6f8cff48f7c87327aae73a8e70ad8"),
    "qwen3-kv2": ("qwen3-059506a20a20a3a9",
                  "f5574c40b8cd2bc3bcf6d301a9f3ee9625064c578e1cc10b6c87eaf3110d457c"),
    "deepseek-mla": ("deepseek_mla-6329cf85b3c6d546",
                     "37d2a746b88ed14454c3fcb6869788475d726748837953d9373f4e952a743998"),
    "qwen3-kv1": ("qwen3-b7ebaef82237d060",
                  "1b86dc1f465a3634a6ef7a32ff921391be854dd6d7cd5bbd32995cb5f11817e6"),
    "deepseek-mla-512": ("deepseek_mla-b9588c8edea81b74",
                         "737ff58556bb34c67145b64d028c201343986459c6b25e135d11087d0b360f4a"),
    "qwen3-moe-kv1": ("qwen3_moe-ce4ae62c3fb9be6b",
                      "7d041f491f37e29b22da264a64493e6c0e3196af7c3c1ceb54dc0ea343671fe2"),
    # As pinned by results/pcp2_zigzag_qwen3_moe_kv4_fa3/20261203T181219Z-049791eb, made on the GPU machine.
    "qwen3-moe-kv4": ("qwen3_moe-d8d71ba42242ec55",
                      "476f6394911b0e80e26a3e715b70ec3eb6761d5e8b5c72b479f783f7d9fb2e7b"),
}
"""Each tiny model's store name and tree hash, as archives and plans pin them (docs/decisions.md D64:
adding an architecture must leave every other model's bytes and name as they were)."""


def test_every_tiny_model_keeps_its_store_name_and_its_bytes(tmp_path: Path) -> None:
    from cptest.run.models import make_named

    assert set(TREES) == set(TINY)
    for name, (directory, tree) in TREES.items():
        made, hashed = make_named(name, tmp_path)
        assert (made.name, hashed) == (directory, tree), name


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
