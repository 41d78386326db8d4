"""Kubernetes objects as multi-document YAML, byte for byte the same for the same objects."""

from __future__ import annotations

from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    """Writes a value every time it appears: no `&id001` anchors where two templates share a list
    (a reader of a manifest should not have to resolve aliases, and some tools refuse them)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(objects: list[dict[str, Any]], header: list[str] | None = None) -> str:
    """`objects` as YAML documents separated by `---`, keys in the order built (apiVersion, kind,
    metadata, spec reads as Kubernetes' own examples do), no line folding (a long argument such as
    `--forward-hooks`' JSON stays one line), preceded by `header` as comment lines."""
    body = yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1 << 20,
                              explicit_start=True)
    return "".join(f"# {line}\n" for line in header or []) + body


def load(text: str) -> list[dict[str, Any]]:
    """The documents of a multi-document YAML text (empty documents dropped)."""
    return [d for d in yaml.safe_load_all(text) if d is not None]
