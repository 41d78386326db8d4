"""The stage layering of docs/architecture.md: a module imports only modules of its own layer or below.

The layers follow the pipeline (lang → scenario → plan → run → checks → store/report), with the
values that cross stages underneath the stages that make and read them: the evidence records
(written by the probe and the runner, read by the checks) and the store's layout (used by every
stage that touches an archive) sit low, so that no stage reaches up. Every `import` in every module
counts, including those inside functions and under TYPE_CHECKING: a lazy import is still a
dependency. `cptest.testing` (fixtures for tests and benchmarks) may import anything; nothing in
the package may import it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cptest

PACKAGE = Path(cptest.__file__).resolve().parent

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("cptest", "cptest.errors", "cptest.outline", "cptest.retry", "cptest.values", "cptest.node",
              "cptest.bounds")),
    ("topology", ("cptest.topology",)),
    ("evidence", ("cptest.evidence", "cptest.record_base", "cptest.rank_records", "cptest.archive_io",
                  "cptest.store", "cptest.analyses",
                  "cptest.verdict", "cptest.request_ids")),
    ("contracts", ("cptest.contracts",)),
    ("scenario", ("cptest.scenario",)),
    ("engine runtimes", ("cptest.probe", "cptest.reference")),
    ("engines", ("cptest.engines",)),
    ("lang", ("cptest.lang",)),
    ("plan", ("cptest.plan",)),
    # The image lock and the builder of cptest's own images: the docker launcher (run) asks the lock
    # which digest an image must have and the Kubernetes renderer (k8s) what it pins, so both sit
    # above it; the builder needs only the lock and the container engine's client it is handed.
    ("images", ("cptest.image",)),
    ("run", ("cptest.run",)),
    ("k8s", ("cptest.k8s",)),
    ("checks", ("cptest.checks",)),
    ("report", ("cptest.report",)),
    ("pipeline", ("cptest.pipeline",)),
    ("suite", ("cptest.suite",)),
    ("cli", ("cptest.cli", "cptest.__main__", "cptest.interface", "cptest.console", "cptest.sources_cli")),
]
"""Lowest first. A module belongs to the layer of its longest matching prefix."""

FIXTURES = "cptest.testing"


def layer_of(module: str) -> int | None:
    """Index of `module`'s layer; None for the fixtures package or a module outside cptest."""
    if module == FIXTURES or module.startswith(FIXTURES + "."):
        return None
    best: tuple[int, int] | None = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), i)
    return None if best is None else best[1]


def module_name(path: Path, package: Path = PACKAGE) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import of a cptest module in `path`, relative ones resolved."""
    out = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from cptest import store` imports cptest.store, not just the package.
            out += [(node.lineno, f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base)
                    for a in node.names]
    return [(line, m) for line, m in out if m == "cptest" or m.startswith("cptest.")]


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


def upward_imports(package: Path = PACKAGE) -> list[str]:
    """Every import that reaches a higher layer, or the fixtures, as `file:line: a -> b (layer -> layer)`."""
    found = []
    for path in sorted(package.rglob("*.py")):
        module = module_name(path, package)
        mine = layer_of(module)
        if mine is None:
            continue  # the fixtures may import anything
        for line, target in imports_of(path, module):
            theirs = layer_of(target)
            where = f"{path.relative_to(package.parent)}:{line}: {module} -> {target}"
            if theirs is None:
                found.append(f"{where} (the fixtures are for tests and benchmarks only)")
            elif theirs > mine:
                found.append(f"{where} ({LAYERS[mine][0]} -> {LAYERS[theirs][0]})")
    return found


def test_every_module_belongs_to_a_layer():
    unplaced = [module_name(p) for p in sorted(PACKAGE.rglob("*.py"))
                if layer_of(module_name(p)) is None and not module_name(p).startswith(FIXTURES)]
    assert unplaced == []


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports() == []


def test_the_scan_finds_an_upward_import_and_a_fixture_import(tmp_path: Path):
    # The check must be able to fail: a planted package whose evidence module imports the plan
    # (a layer above) and whose store imports the fixtures.
    pkg = tmp_path / "cptest"
    (pkg / "plan").mkdir(parents=True)
    (pkg / "testing").mkdir()
    for f in ("__init__.py", "plan/__init__.py", "testing/__init__.py"):
        (pkg / f).write_text("")
    (pkg / "evidence.py").write_text("from cptest.plan import plan\n")
    (pkg / "store.py").write_text("def f():\n    import cptest.testing\n")
    found = upward_imports(pkg)
    assert found == [
        "cptest/evidence.py:1: cptest.evidence -> cptest.plan (evidence -> plan)",
        "cptest/store.py:2: cptest.store -> cptest.testing (the fixtures are for tests and benchmarks only)",
    ]


@pytest.mark.parametrize(("module", "layer"), [
    ("cptest.contracts.rows", "contracts"), ("cptest.plan.model", "plan"), ("cptest.store", "evidence"),
    ("cptest.engines.sglang.releases", "engines"), ("cptest.reference.server", "engine runtimes"),
    ("cptest.k8s.render", "k8s"), ("cptest.image.lock", "images"),
])  # fmt: skip
def test_a_module_is_placed_by_its_longest_prefix(module: str, layer: str):
    assert LAYERS[layer_of(module)][0] == layer  # type: ignore[index]
