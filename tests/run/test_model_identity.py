"""A run loads its model only from the model store or the scenario's folder, finds a hub model as
its snapshot in the store (never downloading, never reading the id as a path), and verifies a
declared revision and sha256 before anything starts: otherwise `unknown`, exit 3, nothing launched
(issue 32: `model hub "/root/.ssh"` became `--model-path /root/.ssh`; pins were never enforced)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cptest import paths
from cptest.lang import parse_text
from cptest.plan import plan
from cptest.plan.model import ModelPin, Plan
from cptest.run.models import model_tree_sha256
from cptest.run.preflight import preflight

from conftest import fake_server, free_port, make_plan  # isort: skip

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
FACTS = ('facts { architecture "LlamaForCausalLM" layers 4 hidden 256 heads 8 kv_heads 1 head_dim 64 '
         'vocab 4096 }')


def checkpoint(d: Path, recorded: str | None = None) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (d / "model.safetensors").write_bytes(b"\0" * 64)
    if recorded:  # as `huggingface-cli download --local-dir` leaves it
        meta = d / ".cache" / "huggingface" / "download"
        meta.mkdir(parents=True)
        (meta / "model.safetensors.metadata").write_text(f"{recorded}\netag\n1700000000.0\n")
    return d


def with_model(model_dir: Path, pin: ModelPin) -> Plan:
    p = make_plan(fake_server("main", free_port()))
    node = p.main.nodes[0].model_copy(update={"model_mount": str(model_dir)})
    main = p.main.model_copy(update={"nodes": [node]})
    return p.model_copy(update={"main": main, "pins": p.pins.model_copy(update={"model": pin})})


def codes(p: Plan, tmp_path: Path, store: Path, scenario_dir: Path) -> list[str]:
    with paths.rooted({paths.MODELS: store, paths.SCENARIO: scenario_dir}):
        return [c.code for c in preflight(p, results=tmp_path / "results")]


def local(d: Path, sha256: str | None = None) -> ModelPin:
    return ModelPin(kind="local", path=str(d), sha256=sha256, architecture="LlamaForCausalLM")


def hub(sha256: str | None = None, revision: str = COMMIT) -> ModelPin:
    return ModelPin(kind="hub", id="org/m", revision=revision, sha256=sha256, architecture="LlamaForCausalLM")


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "store").mkdir()
    (tmp_path / "scenarios").mkdir()
    return tmp_path / "store", tmp_path / "scenarios"


def test_a_checkpoint_in_the_store_or_beside_the_scenario_is_loaded(tmp_path: Path, roots: tuple[Path, Path]):
    store, scenarios = roots
    for d in (checkpoint(store / "m"), checkpoint(scenarios / "ckpt")):
        assert codes(with_model(d, local(d)), tmp_path, store, scenarios) == []


@pytest.mark.parametrize("how", ["elsewhere", "symlink_in_scenarios", "symlink_in_store", "parent_dirs"])
def test_a_checkpoint_outside_the_model_roots_is_refused_unread(tmp_path: Path, roots: tuple[Path, Path],
                                                                 how: str) -> None:
    store, scenarios = roots
    target = checkpoint(tmp_path / "elsewhere" / ".ssh")  # stands for /root/.ssh: a folder of the machine
    d = {"elsewhere": target, "parent_dirs": scenarios / ".." / "elsewhere" / ".ssh",
         "symlink_in_scenarios": scenarios / "ckpt", "symlink_in_store": store / "m"}[how]
    if how.startswith("symlink"):
        d.symlink_to(target)
    with paths.rooted({paths.MODELS: store, paths.SCENARIO: scenarios}):
        (cause, *_) = preflight(with_model(d, local(d)), results=tmp_path / "results")
    assert cause.code == "model_outside" and "lies outside the model store" in cause.message
    assert "--models DIR" in cause.remedy


def test_a_hub_model_is_its_snapshot_in_the_store_and_never_its_id(tmp_path: Path) -> None:
    text = f"""cptest 1
scenario h {{
  extends "{ROOT / 'scenarios' / 'defaults' / 'tiny.cps'}"
  engine reference "builtin"
  model hub "org/m" revision "{COMMIT}"
  {FACTS}
  topology {{ gpus 1 tp 1 }}
}}
"""
    p = plan(parse_text(text, "h.cps", base_dir=str(tmp_path)))
    assert p.main.nodes[0].model_mount == f"<models>/hub/org/m/{COMMIT}"
    argv = p.main.nodes[0].argv
    assert "org/m" not in argv and f"<models>/hub/org/m/{COMMIT}" in " ".join(argv)


def test_a_missing_hub_snapshot_says_how_to_put_it_there(tmp_path: Path, roots: tuple[Path, Path]) -> None:
    store, scenarios = roots
    d = store / "hub" / "org" / "m" / COMMIT
    with paths.rooted({paths.MODELS: store, paths.SCENARIO: scenarios}):
        found = preflight(with_model(d, hub()), results=tmp_path / "r")
    (cause,) = [c for c in found if c.code.startswith("model")]
    assert cause.code == "model_missing"
    assert f"huggingface-cli download org/m --revision {COMMIT} --local-dir {d}" in cause.remedy


def test_a_hub_snapshot_downloaded_at_another_commit_is_refused(tmp_path: Path,
                                                                roots: tuple[Path, Path]) -> None:
    store, scenarios = roots
    d = checkpoint(store / "hub" / "org" / "m" / COMMIT, recorded=OTHER)
    assert codes(with_model(d, hub()), tmp_path, store, scenarios) == ["revision_mismatch"]
    assert codes(with_model(d, hub(revision="main")), tmp_path, store, scenarios) == []  # a branch: no commit
    good = checkpoint(store / "hub" / "org" / "good" / COMMIT, recorded=COMMIT)
    assert codes(with_model(good, hub()), tmp_path, store, scenarios) == []


def test_a_declared_sha256_is_verified_for_hub_and_local_models(tmp_path: Path,
                                                                roots: tuple[Path, Path]) -> None:
    store, scenarios = roots
    d = checkpoint(store / "hub" / "org" / "m" / COMMIT)
    right = model_tree_sha256(d)
    assert codes(with_model(d, hub(sha256=right)), tmp_path, store, scenarios) == []
    assert codes(with_model(d, hub(sha256="0" * 64)), tmp_path, store, scenarios) == ["weights_mismatch"]
    assert codes(with_model(d, local(d, sha256="0" * 64)), tmp_path, store, scenarios) == ["weights_mismatch"]


def run_cli(tmp_path: Path, model: str, store: Path) -> subprocess.CompletedProcess[str]:
    text = f"""cptest 1
scenario pinned {{
  extends "{ROOT / 'scenarios' / 'defaults' / 'tiny.cps'}"
  engine reference "builtin"
  {model}
  {FACTS}
  topology {{ gpus 2 tp 2 dcp 2 }}
  baseline none
  workload {{ requests 2 concurrency 1 }}
}}
"""
    (tmp_path / "scenarios" / "pinned.cps").write_text(text)
    cmd = [sys.executable, "-m", "cptest", "run", str(tmp_path / "scenarios" / "pinned.cps"), "--models",
           str(store), "--results", str(tmp_path / "results"), "--engine", "reference", "--no-baseline-cache",
           "--ports", f"{free_port()},{free_port()}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize(("model", "code"), [
    (f'model hub "org/m" revision "{COMMIT}" sha256 "{"0" * 64}"', "weights_mismatch"),
    (f'model hub "org/m" revision "{OTHER}"', "model_missing"),
    ('model local "../elsewhere/.ssh"', "model_outside"),
])  # fmt: skip
def test_the_cli_ends_unknown_exit_3_and_launches_nothing(tmp_path: Path, roots: tuple[Path, Path],
                                                          model: str, code: str) -> None:
    store, _ = roots
    checkpoint(store / "hub" / "org" / "m" / COMMIT)
    checkpoint(tmp_path / "elsewhere" / ".ssh")
    done = run_cli(tmp_path, model, store)
    assert done.returncode == 3 and done.stdout == "", done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"unknown ({code}): ")
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("manifest.json"))
