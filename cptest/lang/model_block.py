"""The `model` statement (synthetic geometry, hub id and revision, local checkpoint) and the model's
facts: derived from a synthetic geometry, declared in a `facts` block, or read from a local
checkpoint's `config.json` inside the scenario tree (and compared with what `facts` declares)."""

from __future__ import annotations

import json
import os
from typing import Any

from cptest.engines.sglang.admission import DSA_CANDIDATES
from cptest.errors import Span, did_you_mean, one_of
from cptest.lang import model_ids
from cptest.lang import tables as T
from cptest.lang.extends import Chain
from cptest.lang.files import os_reason
from cptest.lang.includes import outside_tree
from cptest.lang.settings import Values, missing_block, node, unknown_word, was_written
from cptest.lang.syntax import Stmt
from cptest.scenario import Model, ModelFacts
from cptest.values import Ident, describe


def model_statement(v: Values, where: Span, chain: Chain) -> Model | None:
    s = v.stmt("", "model")
    if s is None:
        missing_block(v, "model", where)
        return None
    kind, arg = str(s.value["kind"]), s.value["arg"]
    if kind not in T.MODEL_KINDS:
        unknown_word(v.p, s.parts["kind"], f"unknown model kind {kind!r}", kind, T.MODEL_KINDS)
        return None
    geometry, gspans = v.block("model")
    facts_block, fspans = v.block("facts")
    has_facts = v.stmt("", "facts") is not None
    if "revision" in s.value and kind != "hub":
        v.p.add(s.parts["revision"], "'revision' applies to hub models only")
    if "sha256" in s.value and kind == "synthetic":
        v.p.add(s.parts["sha256"], "'sha256' pins a checkpoint on disk; synthetic weights are made by cptest",
                hint="their sha256 is recorded in the manifest of each run")
    if "sha256" in s.value and (why := model_ids.sha256_problem(s.value["sha256"])) is not None:
        v.p.add(s.parts["sha256"], why, expected='sha256 "<64 hex digits>"')
    fields: dict[str, Any] = {"kind": kind}
    spans: dict[str, Span] = {}
    if kind != "synthetic" and gspans:
        first = min(gspans.values())
        v.p.add(
            first,
            f"a {kind} model takes no geometry block",
            hint="declare what the model is in a `facts { ... }` block",
        )
    if kind in ("local", "hub") and not (isinstance(arg, str) and not isinstance(arg, Ident)):
        v.p.add(
            s.span,
            f"model {kind} needs a quoted {'path' if kind == 'local' else 'id'}",
            expected=f'model {kind} "{"../.tiny-models/llama-kv1" if kind == "local" else "org/name"}"',
        )
        return None
    facts: ModelFacts | None = None
    if kind == "synthetic":
        if has_facts:
            v.p.add(
                v.stmt("", "facts").span,
                "a synthetic model's facts are derived from its geometry",  # type: ignore[union-attr]
                hint="remove the facts block",
            )
        if not isinstance(arg, Ident) or str(arg) not in T.SYNTHETIC_ARCHITECTURES:
            close = did_you_mean(str(arg), T.SYNTHETIC_ARCHITECTURES) if arg is not None else None
            v.p.add(
                s.span,
                "synthetic model needs an architecture",
                expected=one_of(T.SYNTHETIC_ARCHITECTURES),
                found=describe(arg) if arg is not None else "nothing",
                hint=f"did you mean '{close}'?" if close else None,
            )
            return None
        arch = str(arg)
        is_mla = arch == "deepseek_mla"
        is_moe = arch == "qwen3_moe"
        required = ["layers", "hidden", "heads", "kv_heads", "vocab", "intermediate"]
        required += list(T.MLA_KEYS) if is_mla else ["head_dim"]
        required += list(T.MOE_KEYS) if is_moe else []
        absent = [k for k in required if k not in geometry and not was_written(v, "model", k)]
        if absent:
            v.p.add(
                s.span,
                f"synthetic {arch} model misses {', '.join(absent)}",
                expected="model synthetic " + arch + " { " + " ".join(f"{k} N" for k in required) + " }",
            )
        if not is_mla:
            for k in T.MLA_KEYS:
                if k in gspans:
                    v.p.add(gspans[k], f"{k} applies to deepseek_mla only")
        if not is_moe:
            for k in T.MOE_KEYS:
                if k in gspans:
                    v.p.add(gspans[k], f"{k} applies to qwen3_moe only")
        heads, kv = geometry.get("heads"), geometry.get("kv_heads")
        if heads and kv and heads % kv:
            v.p.add(gspans["kv_heads"], f"heads ({heads}) must be a multiple of kv_heads ({kv})")
        experts, top = geometry.get("experts"), geometry.get("experts_per_tok")
        if is_moe and experts and top and top > experts:
            v.p.add(gspans["experts_per_tok"], f"experts_per_tok ({top}) must be at most experts ({experts})")
        if not all(k in geometry for k in required):
            return None
        params = _synthetic_params(geometry, is_mla, is_moe)
        if params > T.MAX_SYNTHETIC_PARAMS:
            v.p.add(s.span, f"the synthetic model would have about {params:,} parameters",
                    expected=f"at most {T.MAX_SYNTHETIC_PARAMS:,} (cptest writes its weights)",
                    hint="make layers, hidden, intermediate or vocab smaller")
            return None
        fields.update(geometry, architecture=arch)
        fields.setdefault("seed", 0)
        spans.update(gspans)
        head_dim = (
            geometry["qk_nope_head_dim"] + geometry["qk_rope_head_dim"] if is_mla else geometry["head_dim"]
        )
        facts = node(
            ModelFacts,
            v.p,
            s.span,
            architecture=T.SYNTHETIC_ARCHITECTURES[arch],
            layers=geometry["layers"],
            hidden=geometry["hidden"],
            heads=geometry["heads"],
            kv_heads=geometry["kv_heads"],
            head_dim=head_dim,
            vocab=geometry["vocab"],
            is_mla=is_mla,
        )
    elif kind == "hub":
        fields["id"] = arg
        if (why := model_ids.hub_id_problem(arg)) is not None:
            v.p.add(s.span, why, expected='model hub "org/name" (no path, no "..", no "~")',
                    hint="a checkpoint on disk is `model local`, inside the scenario tree or the model store")
        if "revision" not in s.value:
            v.p.add(s.span, "a hub model needs a pinned revision", expected='revision "<commit>"')
        elif (why := model_ids.revision_problem(s.value["revision"])) is not None:
            v.p.add(s.parts["revision"], why, expected='revision "<commit hash or tag>"')
        fields["revision"] = s.value.get("revision")
        fields["sha256"] = s.value.get("sha256")
        if not has_facts:
            v.p.add(
                s.span,
                "a hub model needs a facts block (cptest never downloads to find out)",
                expected='facts { architecture "..." layers N hidden N heads N kv_heads N '
                "head_dim N vocab N }",
            )
            return None
        facts = _declared_facts(v, facts_block, s.span)
    else:
        path = os.path.normpath(os.path.join(chain.dir_of(s.span), arg))
        fields["path"] = path
        fields["sha256"] = s.value.get("sha256")  # the checkpoint's tree hash (cptest.run.preflight)
        facts = _local_facts(v, s, path, facts_block, fspans, has_facts, chain)
    if facts is None:
        return None
    return node(Model, v.p, s.span, field_spans=spans, facts=facts, **fields)


def _synthetic_params(g: dict[str, int], is_mla: bool, is_moe: bool = False) -> int:
    """A synthetic model's parameter count, roughly (embeddings, attention and MLP of every layer):
    enough to refuse one whose weights would not fit on a disk. A MoE layer's MLP is its router and
    every expert (every qwen3_moe layer is sparse)."""
    hidden, layers = g["hidden"], g["layers"]
    head = (g["qk_nope_head_dim"] + g["qk_rope_head_dim"]) if is_mla else g["head_dim"]
    attention = hidden * head * (2 * g["heads"] + 2 * g["kv_heads"])
    mlp = 3 * hidden * g["intermediate"]
    if is_moe:
        mlp = g["experts"] * (hidden + 3 * hidden * g["moe_intermediate"])
    return 2 * g["vocab"] * hidden + layers * (attention + mlp)


def _declared_facts(v: Values, facts: dict[str, Any], where: Span) -> ModelFacts | None:
    need = ["architecture", "layers", "hidden", "heads", "kv_heads", "head_dim", "vocab"]
    absent = [k for k in need if k not in facts and not was_written(v, "facts", k)]
    fs = v.stmt("", "facts")
    if absent:
        v.p.add(fs.span if fs else where, f"facts block misses {', '.join(absent)}")
        return None
    if any(k not in facts for k in need):
        return None
    return node(ModelFacts, v.p, fs.span if fs else where, **{"is_mla": False, **facts})


_CONFIG_KEYS = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "vocab": "vocab_size",
}


def facts_from_config(config: dict[str, Any]) -> dict[str, Any]:
    """ModelFacts fields from a Hugging Face config.json. Raises KeyError/TypeError/ValueError."""
    out: dict[str, Any] = {"architecture": str(config["architectures"][0])}
    for fact, key in _CONFIG_KEYS.items():
        out[fact] = int(config[key])
    out["kv_heads"] = int(config.get("num_key_value_heads") or out["heads"])
    out["is_mla"] = "kv_lora_rank" in config
    if out["architecture"] in DSA_CANDIDATES:
        out["dsa_indexer"] = config.get("index_topk") is not None
    if out["is_mla"]:
        out["head_dim"] = int(config["qk_nope_head_dim"]) + int(config["qk_rope_head_dim"])
    else:
        out["head_dim"] = int(config.get("head_dim") or out["hidden"] // out["heads"])
    return out


def _local_facts(
    v: Values,
    s: Stmt,
    path: str,
    declared: dict[str, Any],
    fspans: dict[str, Span],
    has_facts: bool,
    chain: Chain,
) -> ModelFacts | None:
    config_path = os.path.join(path, "config.json")
    if not chain.is_dir(path) or outside_tree(path, chain.roots):
        # Outside the scenario tree config.json is not read: its values would be quoted in the
        # problems below. The run finds the checkpoint in the model store or refuses it (preflight).
        if has_facts:
            return _declared_facts(v, declared, s.span)
        v.p.add(
            s.span,
            f"model directory {path!r} "
            + ("lies outside the scenario tree" if chain.is_dir(path) else "does not exist")
            + " and no facts block declares the model",
            hint="generate it (make-tiny-models) or add facts { ... }",
        )
        return None
    try:
        config = json.loads(chain.read(config_path))
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
        found = facts_from_config(config)
    except (OSError, UnicodeDecodeError) as err:
        v.p.add(s.span, f"cannot read {config_path}: {os_reason(err)}")
        return None
    except (ValueError, KeyError, TypeError, IndexError) as err:
        v.p.add(
            s.span,
            f"malformed {config_path}: {type(err).__name__} {err}",
            expected="a Hugging Face config.json with architectures, num_hidden_layers, hidden_size, ...",
        )
        return None
    for field, value in declared.items():
        if found.get(field) != value:
            v.p.add(
                fspans[field],
                f"facts say {field} {value} but config.json says {found.get(field)}",
                hint=f"see {config_path}",
            )
    return node(ModelFacts, v.p, s.span, **found)
