"""The LWS CRD as published -> the form of `schemas/leaderworkerset-v1.json`, to compare the two.

The vendored schema is a transcription (descriptions left out, core subtrees elided). Where the
published CRD can be fetched (not on this project's machines), `transcribe` turns it into the same
form, so that `differences(crd)` says whether a newer LWS release changed a field cptest's check
knows (docs/kubernetes.md, "Updating the LWS schema").
"""

from __future__ import annotations

from typing import Any

from cptest.k8s.validate import lws_document

DROPPED = ("description",)
"""Prose; the transcription keeps names, types, formats, enums, defaults, bounds, required lists."""


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k not in DROPPED}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def transcribe(crd: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    """`crd`'s openAPIV3Schema of `version` without descriptions and with the subtrees the vendored
    schema elides replaced by its markers (a required list kept where it stands beside them)."""
    entry = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema = _strip(entry["schema"]["openAPIV3Schema"])
    for core, paths in lws_document()["elided"].items():
        for path in paths:
            parent, key = _locate(schema, path)
            old = parent[key]
            parent[key] = {"type": "object", **({"required": old["required"]} if "required" in old else {}),
                           "x-kubernetes-preserve-unknown-fields": True, "x-cptest-elided": core}
    return schema


def _locate(schema: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """The dict holding the node at `path` (`a.b[]`: the items of b) and its key there."""
    node, parts = schema, path.split(".")
    for part in parts[:-1]:
        node = node["properties"][part.removesuffix("[]")]
        if part.endswith("[]"):
            node = node["items"]
    last = parts[-1]
    if last.endswith("[]"):
        return node["properties"][last.removesuffix("[]")], "items"
    return node["properties"], last


def differences(crd: dict[str, Any]) -> list[str]:
    """Where the transcription of `crd` differs from the vendored schema, as JSON paths (empty: none)."""
    return _diff(transcribe(crd), lws_document()["openAPIV3Schema"], "")


def _diff(a: Any, b: Any, where: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in
                (_diff(a[k], b[k], f"{where}.{k}") if k in a and k in b else
                 [f"{where}.{k}: only in the {'CRD' if k in a else 'vendored schema'}"])]
    return [] if a == b else [f"{where}: CRD {a!r}, vendored {b!r}"]
