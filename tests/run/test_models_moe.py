"""Synthetic Qwen3-MoE checkpoints (`model synthetic qwen3_moe`, docs/decisions.md D64): named as Hugging
Face's Qwen3-MoE checkpoints, every tensor one that SGLang 0.5.17's loader puts into a parameter of its
shape, and loaded strictly and run by transformers (the real Qwen3MoeForCausalLM).

SGLang cannot be imported here (it needs CUDA), so its loader's name mapping is transcribed below from
the 0.5.17 wheel, with the lines (paths under sglang/srt/). Its loader skips a name it has no parameter
for without a word (models/qwen3_moe.py:1169, 1189, 1211): a misnamed tensor would leave a parameter
of the server unset and no load would fail, which is why the names are held to the mapping here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cptest.run.models import TINY, ensure_synthetic, model_tree_sha256
from cptest.scenario import SyntheticGeometry

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

MOE = SyntheticGeometry(architecture="qwen3_moe", layers=4, hidden=256, heads=8, kv_heads=1, head_dim=64,
                        vocab=4096, intermediate=512, seed=7, experts=8, experts_per_tok=2,
                        moe_intermediate=128)
"""The suite's tiny Qwen3-MoE geometry (hidden 256, 4 layers, 8 heads of 64 as the other tiny models)."""


def test_the_geometry_checked_here_is_the_suites_tiny_qwen3_moe() -> None:
    assert TINY["qwen3-moe-kv1"] == MOE

# models/qwen3_moe.py:1105-1111: (param, checkpoint name, shard)
STACKED = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
           ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)]  # fmt: skip


def expert_params_mapping(num_experts: int) -> list[tuple[str, str, int, str]]:
    """`FusedMoE.make_expert_params_mapping("gate_proj", "down_proj", "up_proj", num_experts)`
    (models/qwen3_moe.py:1114-1119; layers/moe/fused_moe_triton/layer.py:1521-1546)."""
    return [("experts.w13_" if w in ("gate_proj", "up_proj") else "experts.w2_", f"experts.{e}.{w}.", e,
             shard)
            for e in range(num_experts)
            for shard, w in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj"))]  # fmt: skip


def sglang_target(name: str, num_experts: int) -> tuple[str, str | int | None, int | None]:
    """(parameter, shard, expert) that Qwen3MoeForCausalLM.load_weights loads checkpoint tensor `name`
    into (models/qwen3_moe.py:1153-1219): a stacked projection unless it is an expert's, else an
    expert's shard, else the parameter of that name."""
    for param, weight, shard in STACKED:
        if weight in name and "mlp.experts" not in name:
            return name.replace(weight, param), shard, None
    for param, weight, expert, shard in expert_params_mapping(num_experts):
        if weight in name:
            return name.replace(weight, param), shard, expert
    return name, None, None


def sglang_parameters(cfg: dict[str, Any]) -> dict[str, set[tuple[str | int | None, int | None]]]:
    """Qwen3MoeForCausalLM's parameters (unquantised, TP any) and the (shard, expert) pieces each is
    loaded from: embed_tokens and norm (models/qwen2_moe.py:852-884), per layer the attention's
    qkv_proj, o_proj, q_norm, k_norm (qwen3_moe.py:483-544), the router `gate` (279-285), the experts'
    w13_weight / w2_weight (258-267; layers/quantization/unquant.py:329-362) in every layer
    (qwen3_moe.py:759-760), the two layer norms; lm_head."""
    whole = {(None, None)}
    out = {"model.embed_tokens.weight": whole, "model.norm.weight": whole, "lm_head.weight": whole}
    experts = range(cfg["num_experts"])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "self_attn.qkv_proj.weight"] = {("q", None), ("k", None), ("v", None)}
        for name in ("self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm", "mlp.gate",
                     "input_layernorm", "post_attention_layernorm"):
            out[p + name + ".weight"] = whole
        out[p + "mlp.experts.w13_weight"] = {(s, e) for e in experts for s in ("w1", "w3")}
        out[p + "mlp.experts.w2_weight"] = {("w2", e) for e in experts}
    return out


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("moe") / MOE.store_name()
    ensure_synthetic(MOE.model_dump(), d)
    return d


def _config(d: Path) -> dict[str, Any]:
    return json.loads((d / "config.json").read_text())


def test_the_config_is_a_qwen3_moe_one_whose_every_layer_is_sparse(moe_dir: Path) -> None:
    cfg = _config(moe_dir)
    assert (cfg["architectures"], cfg["model_type"]) == (["Qwen3MoeForCausalLM"], "qwen3_moe")
    assert (cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]) == (8, 2, 128)
    assert (cfg["num_key_value_heads"], cfg["num_attention_heads"], cfg["head_dim"]) == (1, 8, 64)
    # SGLang makes every layer sparse whatever these say (qwen3_moe.py:759-760); transformers reads them.
    assert cfg["decoder_sparse_step"] == 1 and cfg["mlp_only_layers"] == []
    assert cfg["norm_topk_prob"] is True and cfg["tie_word_embeddings"] is False


def test_every_tensor_is_one_sglang_0_5_17_loads_into_a_parameter_of_its_shape(moe_dir: Path) -> None:
    cfg = _config(moe_dir)
    h, inter, experts = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts"]
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    tensors = safetensors_torch.load_file(str(moe_dir / "model.safetensors"))
    wanted = sglang_parameters(cfg)
    got: dict[str, set[tuple[str | int | None, int | None]]] = {}
    for name, t in tensors.items():
        param, shard, expert = sglang_target(name, experts)
        assert param in wanted, f"{name} -> {param}: no parameter of SGLang's Qwen3MoeForCausalLM"
        assert (shard, expert) not in got.get(param, set()), f"{name}: {param} {shard} {expert} loaded twice"
        got.setdefault(param, set()).add((shard, expert))
        if shard in ("w1", "w3"):  # gate/up: nn.Linear's (out, in), sharded on dim 0 (layer.py:1126)
            assert tuple(t.shape) == (inter, h), name
        elif shard == "w2":  # down: sharded on dim 1 (layer.py:1126)
            assert tuple(t.shape) == (h, inter), name
        elif shard in ("q", "k", "v"):
            assert tuple(t.shape) == ((heads if shard == "q" else kv) * hd, h), name
        elif name.endswith("mlp.gate.weight"):  # ReplicatedLinear(hidden_size, num_experts)
            assert tuple(t.shape) == (experts, h), name
    assert got == wanted  # every parameter gets every piece: no expert, shard or layer left unset
    for tp in (1, 2):  # MoE-TP = tp: layer.py:307 asserts the split, qwen3_moe.py:239-243 tp <= experts
        assert inter % tp == 0 and tp <= experts


def test_transformers_loads_it_with_no_missing_or_unexpected_key_and_its_logits_are_finite(
        moe_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        moe_dir, dtype=torch.float32, output_loading_info=True)
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert {k: v for k, v in info.items() if v} == {}, info  # missing, unexpected, mismatched, errors
    layers = model.model.layers
    assert len(layers) == 4 and all(type(x.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for x in layers)
    # transformers fuses each layer's experts gate first, then up: the order SGLang's w13 has (w1 at
    # 0, w3 after it: layers/moe/fused_moe_triton/layer.py:632-642).
    tensors = safetensors_torch.load_file(str(moe_dir / "model.safetensors"))
    fused = layers[3].mlp.experts.gate_up_proj[5]
    want = torch.cat([tensors["model.layers.3.mlp.experts.5.gate_proj.weight"],
                      tensors["model.layers.3.mlp.experts.5.up_proj.weight"]]).float()
    assert torch.equal(fused, want)
    assert torch.equal(layers[0].mlp.gate.weight, tensors["model.layers.0.mlp.gate.weight"].float())
    ids = torch.arange(1, 65).view(2, 32)
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (2, 32, 4096) and bool(torch.isfinite(logits).all())
    assert float(logits.std()) > 0


def test_the_same_geometry_gives_the_same_bytes_and_another_seed_others(tmp_path: Path) -> None:
    a = ensure_synthetic(MOE.model_dump(), tmp_path / "a")
    assert ensure_synthetic(MOE.model_dump(), tmp_path / "b") == a
    assert model_tree_sha256(tmp_path / "a") == model_tree_sha256(tmp_path / "b")
    other = MOE.model_copy(update={"seed": 8})
    assert ensure_synthetic(other.model_dump(), tmp_path / "c") != a
