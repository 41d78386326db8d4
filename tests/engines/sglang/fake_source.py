"""An unpacked-wheel tree in which every citation of a registry, and every flag declaration of its
release's flag table, holds without SGLang: each cited file holds, on each range's first line, the
anchors of the ranges that start there."""

from __future__ import annotations

from pathlib import Path

from cptest.engines.sglang.citations import Registry, flag_declarations


def fake_source(registry: Registry, root: Path) -> Path:
    every = (*registry.citations, *flag_declarations(registry.release))
    files: dict[str, dict[int, list[str]]] = {}
    for c in every:
        files.setdefault(c.wheel_path, {}).setdefault(c.start, []).append(c.anchor)
    ends = {c.wheel_path: 0 for c in every}
    for c in every:
        ends[c.wheel_path] = max(ends[c.wheel_path], c.end)
    for name, lines in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(" ".join(lines.get(i, [])) + "\n" for i in range(1, ends[name] + 1)))
    return root
