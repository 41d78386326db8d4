"""Offline validation of the manifests cptest renders: no API server, no network.

- **Core kinds** (Service; each pod template of a LeaderWorkerSet, as the core `v1 PodTemplate`
  whose `template` it is; a LeaderWorkerSet's `metadata`, as a core object's ObjectMeta) against the
  Kubernetes OpenAPI schemas that kubernetes-validate bundles, for `KUBERNETES_VERSION`, in its
  strict form: an unknown field is an error, as kubectl's default server-side field validation
  (`--validate=strict`) makes it.
- **LeaderWorkerSet** against the structural schema of `leaderworkerset.x-k8s.io/v1`
  (`schemas/leaderworkerset-v1.json`, transcribed from the CRD kubernetes-sigs/lws publishes) with
  jsonschema; unknown fields are errors here too (an API server would prune them silently from a
  custom resource, or reject them under strict field validation), `int32`/`int64` are bounded.
- **Names and label values** (`cptest.k8s.names`): the schemas type them as strings only.

What this cannot check is in docs/kubernetes.md: admission (LWS's webhook: size >= 1, subgroup
rules, immutable fields), quantities' and probes' semantics beyond their types, whether the image
exists, whether the claims exist and are ReadWriteMany, and anything a scheduler decides.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

import jsonschema
import kubernetes_validate
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

from cptest.k8s.names import label_problems, name_problems

KUBERNETES_VERSION = "1.35"
"""The Kubernetes version whose core schemas the manifests are held to: the oldest minor release
still maintained upstream when this was written (1.35, 1.36, 1.37), so a manifest that validates
here uses no field a maintained cluster lacks. kubernetes-validate bundles 1.25 to 1.37."""
LWS_SCHEMA = "leaderworkerset-v1.json"
INT_BOUNDS = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


@lru_cache(maxsize=1)
def lws_document() -> dict[str, Any]:
    """The vendored LWS schema document (its source, what it elides, `openAPIV3Schema`)."""
    text = resources.files("cptest.k8s").joinpath("schemas", LWS_SCHEMA).read_text()
    return json.loads(text)


def strict(schema: Any) -> Any:
    """A CRD structural schema as the JSON Schema an API server's strict field validation
    amounts to: objects with `properties` admit no other key unless they preserve unknown fields,
    and `format: int32|int64` becomes bounds (jsonschema does not know those formats)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    bounds = INT_BOUNDS.get(out.get("format", ""))
    if bounds and out.get("type") == "integer":
        out.setdefault("minimum", bounds[0])
        out.setdefault("maximum", bounds[1])
    return out


@lru_cache(maxsize=1)
def _lws_validator() -> jsonschema.protocols.Validator:
    schema = strict(lws_document()["openAPIV3Schema"])
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def _path(parts: Any) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".") or "(top)"


def lws_problems(obj: dict[str, Any]) -> list[str]:
    """Every place `obj` breaks the LeaderWorkerSet v1 structural schema, as `path: message`."""
    doc = lws_document()
    out = []
    expected = f"{doc['group']}/{doc['version']}"
    if obj.get("apiVersion") != expected or obj.get("kind") != doc["kind"]:
        out.append(f"apiVersion/kind: {obj.get('apiVersion')}/{obj.get('kind')}, expected {expected}/"
                   f"{doc['kind']}")
    for e in sorted(_lws_validator().iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        out.append(f"{_path(e.absolute_path)}: {e.message}")
    return out


def core_problems(obj: dict[str, Any]) -> list[str]:
    """Where `obj`, a core object, breaks its kind's strict schema of `KUBERNETES_VERSION` (the first
    error kubernetes-validate finds), or that it knows no schema for the kind."""
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except ValidationError as e:
        return [f"{_path(e.path)}: {e.message}"]
    except SchemaNotFoundError as e:
        return [e.message]
    return []


def templates(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(key, template) of each pod template a LeaderWorkerSet holds; none for anything else."""
    spec = obj.get("spec") if obj.get("kind") == "LeaderWorkerSet" else None
    lwt = spec.get("leaderWorkerTemplate") if isinstance(spec, dict) else None
    if not isinstance(lwt, dict):
        return []
    return [(k, lwt[k]) for k in ("leaderTemplate", "workerTemplate") if isinstance(lwt.get(k), dict)]


def problems(obj: dict[str, Any]) -> list[str]:
    """Everything wrong with one rendered object, each prefixed by `Kind/name`; empty when valid."""
    if not isinstance(obj, dict):
        return [f"a document is not an object: {type(obj).__name__}"]
    kind, meta = obj.get("kind"), obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    out: list[str] = []
    if kind == "LeaderWorkerSet":
        out += lws_problems(obj)
        if isinstance(meta, dict):
            # The CRD types metadata as `object`; the API server holds it to ObjectMeta.
            out += core_problems({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta})
        for key, tpl in templates(obj):
            where = f"spec.leaderWorkerTemplate.{key}"
            pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                            "template": tpl}
            out += [f"{where}.{p.removeprefix('template.')}" for p in core_problems(pod_template)]
            out += label_problems(where, (tpl.get("metadata") or {}).get("labels"))
    elif kind == "Service":
        out += core_problems(obj)
    else:
        out.append(f"no schema for kind {kind!r}: cptest renders LeaderWorkerSet and Service")
    if kind in ("LeaderWorkerSet", "Service"):
        out += name_problems(kind, name)
        if isinstance(meta, dict):
            out += label_problems("metadata", meta.get("labels"))
    return [f"{kind}/{name}: {p}" for p in out]


def validate_all(objects: list[dict[str, Any]]) -> list[str]:
    """`problems` of every object, in order."""
    return [p for obj in objects for p in problems(obj)]


def warnings(objects: list[dict[str, Any]]) -> list[str]:
    """What is valid but not reproducible: a container image that names no digest."""
    return [f"LeaderWorkerSet/{obj['metadata']['name']}: {key} image {c.get('image')!r} names no digest"
            for obj in objects for key, tpl in templates(obj)
            for c in (tpl.get("spec") or {}).get("containers", [])
            if "@sha256:" not in str(c.get("image", ""))]
