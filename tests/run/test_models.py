"""Specification of `cptest.run.models.ensure_synthetic`: deterministic synthetic checkpoints.

Geometry is tiny (hidden 64, 2 layers) so that writing a checkpoint takes milliseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cptest.errors import RunError
from cptest.run.models import MARKER, ensure_synthetic
from cptest.store import sha256_file

MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def tiny(architecture: str = "llama", seed: int = 7) -> dict[str, Any]:
    """A synthetic model as the plan pins it (`Plan.pins.model["synthetic"]`): MLA fields are None
    except for deepseek_mla."""
    mla = dict(zip(MLA_FIELDS, (32, 48, 16, 8, 16), strict=True))
    if architecture != "deepseek_mla":
        mla = dict.fromkeys(MLA_FIELDS)
    return {"architecture": architecture, "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2,
            "head_dim": 16, "vocab": 128, "intermediate": 128, "seed": seed, **mla}  # fmt: skip


@pytest.fixture(autouse=True)
def _needs_torch() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")


@pytest.mark.parametrize(
    ("architecture", "model_type"), [("llama", "llama"), ("qwen3", "qwen3"), ("deepseek_mla", "deepseek_v3")]
)
def test_writes_a_config_and_weights_whose_sha256_it_returns(
    tmp_path: Path, architecture: str, model_type: str
):
    digest = ensure_synthetic(tiny(architecture), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["hidden_size"] == 64 and cfg["model_type"] == model_type
    assert sha256_file(tmp_path / "model.safetensors") == digest
    assert json.loads((tmp_path / MARKER).read_text())["sha256"] == digest


def test_weights_have_the_declared_geometry(tmp_path: Path):
    from safetensors import safe_open

    ensure_synthetic(tiny("qwen3"), tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 - not a dict
    assert shapes["model.embed_tokens.weight"] == (128, 64)
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (4 * 16, 64)
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (2 * 16, 64)
    assert shapes["model.layers.0.self_attn.k_norm.weight"] == (16,)
    assert "model.layers.2.mlp.up_proj.weight" not in shapes


def test_mla_weights_have_the_declared_latent_geometry(tmp_path: Path):
    from safetensors import safe_open

    ensure_synthetic(tiny("deepseek_mla"), tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 - not a dict
    # kv_lora_rank 32, q_lora_rank 48, nope 16, rope 8, v 16, 4 heads, hidden 64.
    assert shapes["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"] == (32 + 8, 64)
    assert shapes["model.layers.0.self_attn.q_b_proj.weight"] == (4 * (16 + 8), 48)
    assert shapes["model.layers.1.self_attn.kv_b_proj.weight"] == (4 * (16 + 16), 32)
    assert shapes["model.layers.1.self_attn.o_proj.weight"] == (64, 4 * 16)


def test_same_seed_gives_byte_identical_weights_in_two_directories(tmp_path: Path):
    a = ensure_synthetic(tiny(seed=7), tmp_path / "a")
    b = ensure_synthetic(tiny(seed=7), tmp_path / "b")
    assert a == b
    weights = "model.safetensors"
    assert (tmp_path / "a" / weights).read_bytes() == (tmp_path / "b" / weights).read_bytes()


def test_another_seed_gives_other_weights(tmp_path: Path):
    assert ensure_synthetic(tiny(seed=7), tmp_path / "a") != ensure_synthetic(tiny(seed=8), tmp_path / "b")


def test_a_complete_directory_is_not_written_again(tmp_path: Path):
    digest = ensure_synthetic(tiny(), tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"left alone")  # a rewrite would restore the real weights
    assert ensure_synthetic(tiny(), tmp_path) == digest
    assert weights.read_bytes() == b"left alone"


def test_an_interrupted_write_without_the_marker_is_redone(tmp_path: Path):
    digest = ensure_synthetic(tiny(), tmp_path)
    (tmp_path / MARKER).unlink()
    (tmp_path / "model.safetensors").write_bytes(b"truncated")
    assert ensure_synthetic(tiny(), tmp_path) == digest
    assert sha256_file(tmp_path / "model.safetensors") == digest


def test_unsupported_architecture_is_a_run_error_that_writes_nothing(tmp_path: Path):
    with pytest.raises(RunError) as err:
        ensure_synthetic(tiny("gemma"), tmp_path / "m")
    assert "gemma" in err.value.problems[0].message
    assert err.value.problems[0].hint and "llama" in err.value.problems[0].hint
    assert not (tmp_path / "m").exists()


def test_writers_racing_for_one_model_leave_one_complete_checkpoint(tmp_path: Path):
    # A suite starts scenarios that share a model at the same moment: each writes aside and renames,
    # so every caller gets the same digest and nobody ever sees half a checkpoint.
    from concurrent.futures import ThreadPoolExecutor

    target = tmp_path / "cache" / "llama"
    with ThreadPoolExecutor(4) as pool:
        digests = list(pool.map(lambda _: ensure_synthetic(tiny(seed=3), target), range(4)))
    assert len(set(digests)) == 1
    assert sha256_file(target / "model.safetensors") == digests[0]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["llama"]  # no temporary left
