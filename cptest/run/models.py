"""The model store and the synthetic checkpoints written into it.

A scenario can declare `model synthetic llama { heads 32 kv_heads 8 head_dim 128 ... seed 7 }` to
qualify layout contracts with Llama-3.1-8B's geometry and no download. The weights are drawn from
torch's CPU generator in a fixed order (identical bytes with torch 2.11 and 2.13 on AVX2/AVX-512
CPUs) and written once into the model store (`store_dir`) under `SyntheticGeometry.store_name()`;
the plan names the directory `<models>/NAME` (`cptest.paths`) and the run writes it if missing.
Every archive's manifest pins the model by its tree hash (`model_tree_sha256`).

`TINY` is the suite's named tiny models (`cptest models make NAME|--all`): the synthetic
geometries the committed scenarios declare, so that making them ahead of a GPU session writes
exactly the directories the runs will use.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from cptest.errors import Problem, RunError
from cptest.paths import checkout
from cptest.scenario import SyntheticGeometry
from cptest.store import sha256_file

STORE_ENV = "CPTEST_MODELS"
"""Environment variable naming the model store (`--models DIR` overrides it)."""


def store_dir(explicit: Path | None = None) -> Path:
    """The model store: `explicit`, else $CPTEST_MODELS (or the older $CPTEST_MODEL_CACHE), else
    `.cptest/models` in the checkout cptest runs from, else ~/.cache/cptest/models."""
    if explicit is not None:
        return Path(explicit).expanduser()
    for var in (STORE_ENV, "CPTEST_MODEL_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    root = checkout()
    return root / ".cptest" / "models" if root is not None else Path.home() / ".cache" / "cptest" / "models"


def _tiny(arch: str, kv_heads: int, seed: int, **extra: int | None) -> SyntheticGeometry:
    fields: dict[str, object] = {"architecture": arch, "layers": 4, "hidden": 256, "heads": 8,
                                 "kv_heads": kv_heads, "head_dim": 64, "vocab": 4096, "intermediate": 512,
                                 "seed": seed, **extra}
    return SyntheticGeometry.model_validate(fields)


TINY: dict[str, SyntheticGeometry] = {
    "llama-kv1": _tiny("llama", 1, 7),
    "llama-kv2": _tiny("llama", 2, 7),
    "llama-kv4": _tiny("llama", 4, 7),
    "qwen3-kv2": _tiny("qwen3", 2, 7),
    "deepseek-mla": _tiny("deepseek_mla", 8, 4321, head_dim=None, kv_lora_rank=64, q_lora_rank=128,
                          qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32),
    # The qualification scenarios' (scenarios/qualification/): Qwen3 in the kv_heads <= tp/dcp
    # regime, and MLA with DeepSeek's latent sizes, which FlashInfer's and FlashMLA's MLA kernels
    # require (kv_lora 512, rope 64; the 64/16 model above runs on triton only).
    "qwen3-kv1": _tiny("qwen3", 1, 7),
    "deepseek-mla-512": _tiny("deepseek_mla", 8, 4321, head_dim=None, kv_lora_rank=512, q_lora_rank=128,
                              qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    # Qwen3-MoE, an MHA family the pinned SGLang release runs on its CP-v2 path by default: 1 KV head, the
    # kv_heads <= tp/dcp regime of DCP 2 on TP 2 (and of PCP 2, attention-TP 1); 8 experts, top 2.
    "qwen3-moe-kv1": _tiny("qwen3_moe", 1, 7, experts=8, experts_per_tok=2, moe_intermediate=128),
    # And with 4 KV heads: PCP's attention-TP 1 holds all four on each CP rank.
    "qwen3-moe-kv4": _tiny("qwen3_moe", 4, 7, experts=8, experts_per_tok=2, moe_intermediate=128),
}
"""The suite's tiny models by name (the first five are the names tools/make-tiny-models used):
hidden 256, 4 layers, 8 heads of 64, vocab 4096, intermediate 512; MLA with kv_lora 64, q_lora 128,
nope 32, rope 16, v 32, or (`deepseek-mla-512`) kv_lora 512, q_lora 128, nope 128, rope 64, v 128;
Qwen3-MoE with every layer sparse, 8 experts of intermediate 128, 2 per token."""


def make_named(name: str, store: Path) -> tuple[Path, str]:
    """Write the tiny model `name` into `store` unless it is there, and link `store/name` to it;
    return its directory and tree hash. Raises KeyError for an unknown name."""
    geometry = TINY[name]
    directory = store / geometry.store_name()
    ensure_synthetic(geometry.model_dump(), directory)
    link = store / name
    if not link.exists() or link.is_symlink():
        tmp = store / f".{name}.link"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(directory.name)  # relative: the store may move
        os.replace(tmp, link)
    return directory, model_tree_sha256(directory)


def _remembered_tree(d: Path) -> str:
    """A store directory's tree hash: remembered in its marker when cptest wrote it, else computed."""
    try:
        known = json.loads((d / MARKER).read_text()).get("tree_sha256")
    except (OSError, ValueError, AttributeError):
        known = None
    return known or model_tree_sha256(d)


def store_entries(store: Path) -> list[dict[str, Any]]:
    """Every checkpoint in `store`: its name, tree hash and the names linking to it."""
    if not store.is_dir():
        return []
    links: dict[str, list[str]] = {}
    for p in store.iterdir():
        if p.is_symlink():
            links.setdefault(os.readlink(p), []).append(p.name)
    return [{"name": d.name, "tree_sha256": _remembered_tree(d), "aliases": sorted(links.get(d.name, []))}
            for d in sorted(p for p in store.iterdir() if p.is_dir() and not p.is_symlink()
                            and not p.name.startswith("."))]


def add_checkpoint(source: Path, store: Path) -> tuple[Path, str]:
    """Copy the checkpoint files of `source` (`TREE_SUFFIXES`) into `store/local-<tree hash>`, written
    aside and renamed into place; return the directory and the tree hash."""
    tree = model_tree_sha256(source)
    target = store / f"local-{tree[:16]}"
    if target.is_dir() and _remembered_tree(target) == tree:
        return target, tree
    store.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=store))
    os.chmod(tmp, 0o755)
    try:
        for f in Path(source).iterdir():
            if f.is_file() and f.suffix in TREE_SUFFIXES and f.name != MARKER:
                shutil.copy2(f, tmp / f.name)
        (tmp / MARKER).write_text(json.dumps({"tree_sha256": tree, "copied_from": source.name}, indent=2))
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target, tree


def find_by_tree_sha256(store: Path, digest: str) -> Path | None:
    """The checkpoint in `store` whose tree hash is `digest`, or None. Each directory's hash is
    remembered in its `cptest-weights.json` marker, or computed (and not remembered) for a
    checkpoint someone put there by hand."""
    for entry in store_entries(store):
        if entry["tree_sha256"] == digest:
            return store / entry["name"]
    return None


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
    if arch == "qwen3_moe":
        # As Qwen/Qwen3-30B-A3B's config.json, scaled down; every layer a sparse MoE block. The pinned
        # SGLang release builds one in every layer whatever the config says (models/qwen3_moe.py:759-760),
        # transformers where `layer not in mlp_only_layers and (layer + 1) % decoder_sparse_step == 0`:
        # step 1 and no MLP-only layers make the two agree. `intermediate_size` is the dense MLP's
        # (no layer has one). norm_topk_prob as Qwen3-30B-A3B: SGLang's default when absent is true
        # (qwen3_moe.py:247), transformers' false, so it is written.
        return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "rope_theta": 1000000.0,
                "use_sliding_window": False, "sliding_window": None,
                "max_window_layers": model["layers"], **common,
                "num_experts": model["experts"], "num_experts_per_tok": model["experts_per_tok"],
                "moe_intermediate_size": model["moe_intermediate"], "decoder_sparse_step": 1,
                "mlp_only_layers": [], "norm_topk_prob": True, "output_router_logits": False,
                "router_aux_loss_coef": 0.001}  # fmt: skip
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
                           hint="use llama, qwen3, qwen3_moe or deepseek_mla, or a local "
                                "checkpoint"))  # fmt: skip


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
        if cfg["model_type"] == "qwen3_moe":
            _moe_and_norms(t, p, rnd, ones, h, cfg["num_experts"], cfg["moe_intermediate_size"])
        else:
            _mlp_and_norms(t, p, rnd, ones, h, inter)
        if cfg["model_type"] in ("qwen3", "qwen3_moe"):
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


def _moe_and_norms(t: dict[str, Any], p: str, rnd: Any, ones: Any, h: int, experts: int, inter: int) -> None:
    """A Qwen3-MoE layer's sparse block, named as Hugging Face's Qwen3-MoE checkpoints name it, the
    router first, then expert by expert gate, up, down (the order fixes the bytes). What the pinned SGLang
    release reads (paths in its wheel, sglang/srt/):
    - `mlp.gate.weight` [experts, hidden]: the router, `ReplicatedLinear(hidden_size, num_experts)`
      with prefix `gate` (models/qwen3_moe.py:279-285), loaded by name (qwen3_moe.py:1203-1219).
    - `mlp.experts.E.{gate,up,down}_proj.weight`: `FusedMoE.make_expert_params_mapping("gate_proj",
      "down_proj", "up_proj", num_experts)` (qwen3_moe.py:1114-1119) maps `experts.E.gate_proj.` to
      `experts.w13_` shard w1, `up_proj` to w13_ w3, `down_proj` to `experts.w2_` shard w2
      (layers/moe/fused_moe_triton/layer.py:1521-1546). The checkpoint keeps nn.Linear's (out, in):
      gate and up [moe_intermediate, hidden] sharded on dim 0, down [hidden, moe_intermediate] on
      dim 1 (layer.py:1126), into w13 [experts, 2 x moe_intermediate / tp, hidden] and w2 [experts,
      hidden, moe_intermediate / tp] (layers/quantization/unquant.py:329-362).
    - the loader skips a name it has no parameter for without a word (qwen3_moe.py:1169, 1189, 1211):
      a misnamed tensor would leave SGLang's parameter unset, so tests/run/test_models_moe.py holds
      every name to this mapping and loads the checkpoint with transformers, strictly."""
    t[p + "mlp.gate.weight"] = rnd(experts, h)
    for e in range(experts):
        q = f"{p}mlp.experts.{e}."
        t[q + "gate_proj.weight"] = rnd(inter, h)
        t[q + "up_proj.weight"] = rnd(inter, h)
        t[q + "down_proj.weight"] = rnd(h, inter)
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
    os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the checkpoint from a container's other user
    try:
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
        path = tmp / "model.safetensors"
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})
        digest = checkpoint_file_sha256(path)
        (tmp / MARKER).write_text(json.dumps({"sha256": digest, "tree_sha256": model_tree_sha256(tmp),
                                              "torch": torch.__version__, "model": model}, indent=2))
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


_FILE_SHA256: dict[tuple[int, int, int, int], str] = {}


def checkpoint_file_sha256(path: Path) -> str:
    """sha256 of one checkpoint file, remembered for this process by the file's identity (device,
    inode, size, mtime): a run hashes its weights for the preflight pin check, the manifest's tree
    hash and the environment's per-file record, and a multi-GB checkpoint must be read once, not
    three times. A rename (written aside, then moved into the store) keeps the identity; a rewrite
    changes it."""
    st = path.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _FILE_SHA256:
        _FILE_SHA256[key] = sha256_file(path)
    return _FILE_SHA256[key]


TREE_SUFFIXES = (".json", ".safetensors", ".bin", ".model", ".tiktoken", ".txt")
"""The files of a checkpoint that determine what it computes: config and tokenizer files, weights."""


def model_tree_sha256(model_dir: Path) -> str:
    """One sha256 over a checkpoint directory's config, tokenizer and weights files: of the lines
    `<name> <sha256 of the file>` sorted by name (cptest's own `cptest-weights.json` marker is not
    part of the checkpoint). What a scenario pins with `model local "dir" sha256 "..."`."""
    import hashlib

    lines = sorted(f"{f.name} {checkpoint_file_sha256(f)}\n" for f in Path(model_dir).iterdir()
                   if f.is_file() and f.suffix in TREE_SUFFIXES and f.name != MARKER)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def weights_sha256(model_dir: str | None) -> dict[str, str] | None:
    """sha256 of every weights file of a local checkpoint (what pins a result to its weights), or
    None when `model_dir` is not a directory here (a hub id, a container-only path)."""
    if not model_dir or not Path(model_dir).is_dir():
        return None
    files = sorted(Path(model_dir).glob("*.safetensors")) + sorted(Path(model_dir).glob("*.bin"))
    return {f.name: checkpoint_file_sha256(f) for f in files}
