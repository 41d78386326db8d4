"""The reference engine's part of planning: its argv and its rank titles (pure).

`cptest.plan._server` calls these for `engine reference`; everything else in the plan (geometry,
workload, faults, expectations) is the same as for SGLang, so the same checkers judge both.
"""

from __future__ import annotations

from typing import Any

from cptest.reference.argv import TITLE_PREFIX, ReferenceConfig, build_argv
from cptest.scenario import Serve, Topology

SGLANG_TITLE_PREFIX = "sglang::scheduler"

__all__ = ["TITLE_PREFIX", "argv", "geometry"]


def argv(topo: Topology, serve: Serve, model_path: str, port: int) -> list[str]:
    """The reference server's argv for one topology (host 127.0.0.1; one node)."""
    return build_argv(ReferenceConfig(
        model_path=model_path, degrees=topo.as_degrees(), host="127.0.0.1", port=port,
        page_size=serve.page_size or 1, max_total_tokens=serve.max_total_tokens,
        context_length=serve.context_length,
    ))  # fmt: skip


def geometry(planned: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The planned geometry with rank titles of the reference engine (`cptest-ref::scheduler_TP<r>`):
    the same suffix scheme as SGLang, another prefix, so that a fault never hits the wrong engine."""
    out = []
    for g in planned:
        title = str(g.get("process_title", ""))
        if title.startswith(SGLANG_TITLE_PREFIX):
            title = TITLE_PREFIX + title[len(SGLANG_TITLE_PREFIX):]
        out.append({**g, "process_title": title})
    return out
