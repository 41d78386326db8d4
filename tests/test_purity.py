"""Parse, plan, lint and check are pure (docs/architecture.md §1): no processes, containers, network or clock.

Two checks. (1) Importing the pure stages in a fresh interpreter must not import the run stage nor a
library that starts processes or talks to the network. (2) The source of every cptest module those
stages import must not read the clock, and the stage modules themselves must not import `time` or
`datetime` at all (the clock arrives as an argument, as in Jepsen's generator context).

Why not assert that `time` is absent from sys.modules: CPython imports it while starting up (and
pydantic imports `datetime` for its own types), so its presence says nothing about cptest. The
AST scan below is the check that can fail for cptest's own code.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import cptest

PACKAGE = Path(cptest.__file__).resolve().parent
PURE_STAGES = ("cptest.lang", "cptest.plan", "cptest.plan.lint", "cptest.contracts", "cptest.checks",
               "cptest.k8s.render", "cptest.k8s.validate")
FORBIDDEN_MODULES = ("cptest.run", "subprocess", "docker", "httpx", "psutil", "torch")
"""Not imported (directly or transitively) by any pure stage. `socket` cannot be on this list:
pydantic's plugin loader imports importlib.metadata -> email.utils -> socket; httpx and docker stand
for the network instead."""

CLOCK_CALLS = {
    ("time", "time"), ("time", "monotonic"), ("time", "perf_counter"), ("time", "time_ns"),
    ("time", "monotonic_ns"), ("time", "sleep"), ("datetime", "now"), ("datetime", "utcnow"),
    ("datetime", "today"), ("date", "today"),
}  # fmt: skip
CLOCK_MODULES = {"time", "datetime"}

IMPORT_SCRIPT = """
import json, sys
before = set(sys.modules)
for name in sys.argv[1:]:
    __import__(name)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


RUN_SCRIPT = """
import json, sys
from pathlib import Path
before = set(sys.modules)
from cptest.checks import check
from cptest.lang import parse_file
from cptest.plan.lint import lint
from cptest.plan import plan
scenario_file, archive_dir = sys.argv[1:]
s = parse_file(scenario_file)
plan(s)
lint(s)
check(Path(archive_dir))
print(json.dumps(sorted(set(sys.modules) - before)))
"""
"""Calls each pure stage once, so that imports made lazily inside functions are seen too."""


def _imported_by(*modules: str) -> list[str]:
    """Module names newly imported by importing `modules` in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", IMPORT_SCRIPT, *modules], capture_output=True, text=True,
                          check=True)  # fmt: skip
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def pure_imports() -> list[str]:
    return _imported_by(*PURE_STAGES)


def _source_file(module: str) -> Path:
    rel = Path(*module.split(".")[1:])
    path = PACKAGE / rel / "__init__.py" if (PACKAGE / rel).is_dir() else PACKAGE / rel.with_suffix(".py")
    assert path.is_file(), module
    return path


def _stage_files() -> list[Path]:
    """The pure stages' own modules (not the helpers they import)."""
    files = sorted((PACKAGE / "plan").glob("*.py"))
    files += sorted((PACKAGE / "lang").glob("*.py")) + sorted((PACKAGE / "checks").glob("*.py"))
    files += sorted((PACKAGE / "contracts").glob("*.py"))
    return files


def _rel(path: Path) -> str:
    return str(path.relative_to(PACKAGE)) if path.is_relative_to(PACKAGE) else str(path)


def _clock_calls(path: Path) -> list[str]:
    """`module.func(...)` calls that read the clock, as `file:line: text`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        # `time.time()`, `datetime.now()`, and `datetime.datetime.now()` alike.
        name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
        if (name, node.func.attr) in CLOCK_CALLS:
            found.append(f"{_rel(path)}:{node.lineno}: {ast.unparse(node)}")
    return found


def _clock_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module.split(".")[0]]
        found += [f"{_rel(path)}:{node.lineno}: {n}" for n in names if n in CLOCK_MODULES]
    return found


def test_the_scanner_finds_a_clock_call(tmp_path: Path):
    # The scan must be able to fail: a planted call is found, whatever the import style.
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import time\nfrom datetime import datetime\nx = time.monotonic()\ny = datetime.now()\n"
    )
    assert len(_clock_calls(planted)) == 2 and len(_clock_imports(planted)) == 2


@pytest.mark.parametrize("stage", PURE_STAGES)
def test_pure_stage_imports_no_process_network_or_run_module(stage: str):
    imported = _imported_by(stage)
    bad = [m for m in imported if any(m == f or m.startswith(f + ".") for f in FORBIDDEN_MODULES)]
    assert bad == [], f"importing {stage} pulls in {bad}"


def test_all_pure_stages_together_import_no_forbidden_module(pure_imports: list[str]):
    assert {m.split(".")[0] for m in pure_imports} & {"subprocess", "docker", "httpx", "psutil"} == set()
    assert not [m for m in pure_imports if m.startswith("cptest.run")]


def test_running_parse_plan_lint_and_check_imports_no_forbidden_module():
    root = PACKAGE.parent
    archive = next(d for d in sorted((root / "results").glob("*/*")) if (d / "verdict.json").is_file()
                   and not d.parent.name.startswith("_"))  # fmt: skip
    scenario = root / "scenarios" / "fault_kill_rank_dcp2.cps"
    argv = [sys.executable, "-c", RUN_SCRIPT, str(scenario), str(archive)]
    done = subprocess.run(argv, capture_output=True,
                          text=True, check=True)  # fmt: skip
    imported = json.loads(done.stdout)
    bad = [m for m in imported if any(m == f or m.startswith(f + ".") for f in FORBIDDEN_MODULES)]
    assert bad == []


def test_no_cptest_module_a_pure_stage_imports_reads_the_clock(pure_imports: list[str]):
    modules = sorted(m for m in pure_imports if m == "cptest" or m.startswith("cptest."))
    assert "cptest.plan" in modules and "cptest.contracts.rows" in modules
    calls = [c for m in modules for c in _clock_calls(_source_file(m))]
    assert calls == []


@pytest.mark.parametrize("path", _stage_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_pure_stage_module_does_not_import_the_clock(path: Path):
    assert _clock_imports(path) == []
