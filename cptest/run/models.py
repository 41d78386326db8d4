"""Synthetic checkpoints: deterministic random weights with a real model's head geometry.

A scenario can declare `model synthetic llama { heads 32 kv_heads 8 head_dim 128 ... seed 7 }` to
qualify layout contracts with Llama-3.1-8B's geometry and no download. The weights are drawn from
torch's CPU generator in a fixed order (the same scheme as the GPU machine's tiny models, which
gives identical bytes with torch 2.11 and 2.13 on AVX2/AVX-512 CPUs) and written once into the
plan's model cache; their sha256 goes into the manifest. This is a run-stage side effect: the plan
only names the directory.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from cptest.errors import Problem, RunError
from cptest.store import sha256_file

STD = 0.02
MARKER = "cptest-weights.json"
"""Written last: a directory without it is an interrupted write and is regenerated."""


def _config(model: dict[str, Any]) -> dict[str, Any]:
    arch = model["architecture"]
    common = {
        "hidden_size": model["hidden"], "intermediate_size": model["intermediate"] or 4 * model["hidden"],
        "num_hidden_layers": model["layers"], "num_attention_heads": model["heads"],
        "num_key_value_heads": model["kv_heads"], "head_dim": model["head_dim"],
        "vocab_size": model["vocab"], "max_position_embeddings": 8192, "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "initializer_range": STD, "use_cache": True, "bos_token_id": 0,
        "eos_token_id": 1, "torch_dtype": "bfloat16",
    }  # fmt: skip
    if arch == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rope_theta": 500000.0,
                "mlp_bias": False, "pretraining_tp": 1, **common}  # fmt: skip
    if arch == "qwen3":
        return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "rope_theta": 1000000.0,
                "use_sliding_window": False, "sliding_window": None,
                "max_window_layers": model["layers"], **common}  # fmt: skip
    if arch == "deepseek_mla":
        # Every layer dense (first_k_dense_replace = layers), as make-tiny-models' deepseek-mla.
        return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", **common,
                "num_key_value_heads": model["heads"], "moe_intermediate_size": 128,
                "num_nextn_predict_layers": 0, "n_shared_experts": 1, "n_routed_experts": 8,
                "num_experts_per_tok": 2, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
                "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
                "moe_layer_freq": 1, "first_k_dense_replace": model["layers"],
                "kv_lora_rank": model["kv_lora_rank"], "q_lora_rank": model["q_lora_rank"],
                "qk_nope_head_dim": model["qk_nope_head_dim"], "qk_rope_head_dim": model["qk_rope_head_dim"],
                "v_head_dim": model["v_head_dim"], "head_dim": model["qk_rope_head_dim"],
                "rope_interleave": True, "rope_theta": 10000.0}  # fmt: skip
    raise RunError(Problem(None, f"synthetic weights for architecture {arch!r} are not implemented",
                           hint="use llama or qwen3, or a local checkpoint"))  # fmt: skip


def _tensors(torch: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    h, inter, heads, kv, hd = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                "num_key_value_heads", "head_dim"))
    bf16 = torch.bfloat16

    def rnd(*shape: int) -> Any:
        return (torch.randn(*shape) * STD).to(bf16)

    def ones(n: int) -> Any:
        return torch.ones(n, dtype=bf16)

    t = {"model.embed_tokens.weight": rnd(cfg["vocab_size"], h)}
    mla = cfg["model_type"] == "deepseek_v3"
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if mla:
            kvl, ql = cfg["kv_lora_rank"], cfg["q_lora_rank"]
            nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
            t[p + "self_attn.q_a_proj.weight"] = rnd(ql, h)
            t[p + "self_attn.q_a_layernorm.weight"] = ones(ql)
            t[p + "self_attn.q_b_proj.weight"] = rnd(heads * (nope + rope), ql)
            t[p + "self_attn.kv_a_proj_with_mqa.weight"] = rnd(kvl + rope, h)
            t[p + "self_attn.kv_a_layernorm.weight"] = ones(kvl)
            t[p + "self_attn.kv_b_proj.weight"] = rnd(heads * (nope + vd), kvl)
            t[p + "self_attn.o_proj.weight"] = rnd(h, heads * vd)
            _mlp_and_norms(t, p, rnd, ones, h, inter)
            continue
        t[p + "self_attn.q_proj.weight"] = rnd(heads * hd, h)
        t[p + "self_attn.k_proj.weight"] = rnd(kv * hd, h)
        t[p + "self_attn.v_proj.weight"] = rnd(kv * hd, h)
        t[p + "self_attn.o_proj.weight"] = rnd(h, heads * hd)
        _mlp_and_norms(t, p, rnd, ones, h, inter)
        if cfg["model_type"] == "qwen3":
            t[p + "self_attn.q_norm.weight"] = ones(hd)
            t[p + "self_attn.k_norm.weight"] = ones(hd)
    t["model.norm.weight"] = ones(h)
    t["lm_head.weight"] = rnd(cfg["vocab_size"], h)
    return t


def _mlp_and_norms(t: dict[str, Any], p: str, rnd: Any, ones: Any, h: int, inter: int) -> None:
    t[p + "mlp.gate_proj.weight"] = rnd(inter, h)
    t[p + "mlp.up_proj.weight"] = rnd(inter, h)
    t[p + "mlp.down_proj.weight"] = rnd(h, inter)
    t[p + "input_layernorm.weight"] = ones(h)
    t[p + "post_attention_layernorm.weight"] = ones(h)


def ensure_synthetic(model: dict[str, Any], directory: Path) -> str:
    """Write the synthetic checkpoint described by `model` (a scenario Model dump) into `directory`
    unless a complete one is there; return the sha256 of its model.safetensors."""
    marker = directory / MARKER
    if marker.is_file():
        return json.loads(marker.read_text())["sha256"]
    try:
        import torch
        from safetensors.torch import save_file
    except ImportError as e:
        raise RunError(Problem(None, f"synthetic weights need torch and safetensors ({e})",
                               hint="pip install -e '.[weights]'")) from None  # fmt: skip
    cfg = _config(model)
    torch.manual_seed(int(model.get("seed") or 0))
    tensors = _tensors(torch, cfg)
    # Written aside and renamed into place: scenarios of one suite that share a model start at the
    # same time, and a server must never load a checkpoint another process is still writing.
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
        path = tmp / "model.safetensors"
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})
        digest = sha256_file(path)
        (tmp / MARKER).write_text(json.dumps({"sha256": digest, "torch": torch.__version__, "model": model},
                                             indent=2))
        if directory.exists() and not marker.is_file():
            shutil.rmtree(directory, ignore_errors=True)  # an interrupted write of an older cptest
        try:
            os.rename(tmp, directory)
        except OSError:
            if not marker.is_file():  # not another writer's complete copy: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return json.loads(marker.read_text())["sha256"]


TREE_SUFFIXES = (".json", ".safetensors", ".bin", ".model", ".tiktoken", ".txt")
"""The files of a checkpoint that determine what it computes: config and tokenizer files, weights."""


def model_tree_sha256(model_dir: Path) -> str:
    """One sha256 over a checkpoint directory's config, tokenizer and weights files: of the lines
    `<name> <sha256 of the file>` sorted by name (cptest's own `cptest-weights.json` marker is not
    part of the checkpoint). What a scenario pins with `model local "dir" sha256 "..."`."""
    import hashlib

    lines = sorted(f"{f.name} {sha256_file(f)}\n" for f in Path(model_dir).iterdir()
                   if f.is_file() and f.suffix in TREE_SUFFIXES and f.name != MARKER)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def weights_sha256(model_dir: str | None) -> dict[str, str] | None:
    """sha256 of every weights file of a local checkpoint (what pins a result to its weights), or
    None when `model_dir` is not a directory here (a hub id, a container-only path)."""
    if not model_dir or not Path(model_dir).is_dir():
        return None
    files = sorted(Path(model_dir).glob("*.safetensors")) + sorted(Path(model_dir).glob("*.bin"))
    return {f.name: sha256_file(f) for f in files}
