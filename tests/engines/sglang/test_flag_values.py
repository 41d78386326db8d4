"""Each flag of a release's table has the arity and value type SGLang's own parser gives it, and
cptest has a checker for every value type (cptest/engines/sglang/flag_values.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cptest.engines.sglang.flag_values import VALUE_TYPES, value_problem
from cptest.engines.sglang.releases import KNOWN_RELEASES, _load_flags

ROOT = Path(__file__).resolve().parents[3]
RELEASES = list(KNOWN_RELEASES.values())


def extractor() -> ModuleType:
    path = ROOT / "tools" / "extract_sglang_flags.py"
    spec = importlib.util.spec_from_file_location("extract_sglang_flags", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.name)
def test_every_flag_that_takes_a_value_has_a_type_cptest_checks(release) -> None:
    for name, entry in _load_flags(release.flags_file)["flags"].items():
        if entry["arity"] == "flag":
            assert entry["type"] is None, name
        else:
            assert entry["type"] in VALUE_TYPES, (name, entry["type"])


@pytest.mark.parametrize(("flag", "text", "why"), [
    ("--max-running-requests", "4", None),
    ("--max-running-requests", "four", "'four' is not an integer"),
    ("--max-running-requests", "4.0", "'4.0' is not an integer"),
    ("--watchdog-timeout", "1e3", None),
    ("--watchdog-timeout", "soon", "'soon' is not a number"),
    ("--max-prefill-tokens", "25.6k", None),
    ("--max-prefill-tokens", "2Mi", None),
    ("--max-prefill-tokens", "2.5Mi", "is not an integer, optionally with a suffix"),
    ("--max-prefill-tokens", "2m", "is not an integer, optionally with a suffix"),
    ("--preferred-sampling-params", '{"top_k": 1}', None),
    ("--preferred-sampling-params", "{top_k: 1}", "is not JSON"),
    ("--cuda-graph-config", "[1]", "is not a JSON object"),
    ("--schedule-policy", "fcfs", None),
    ("--schedule-policy", "FCFS", "--schedule-policy FCFS: expected lpm"),
    ("--log-level", "anything at all", None),
])  # fmt: skip
def test_a_value_is_checked_as_sglangs_converter_would(flag: str, text: str, why: str | None) -> None:
    entry = KNOWN_RELEASES["0.5.17"].flags[flag]
    found = value_problem(flag, entry, text)
    assert (found is None) if why is None else (found is not None and why in found), found


def test_a_type_cptest_does_not_know_is_refused_not_passed() -> None:
    entry = {"arity": "value", "type": "sglang.srt.something.new_converter", "choices": None}
    assert "cannot check a value of SGLang's type" in (value_problem("--x", entry, "1") or "")


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.name)
def test_the_committed_table_is_what_sglangs_own_parser_builds(release) -> None:
    """Where this release's sglang imports (a scratch environment: docs/decisions.md D6), its parser
    is built again with the generator's own code and compared flag by flag; elsewhere skipped, and
    the tests above hold the committed table to its form."""
    sglang = pytest.importorskip("sglang")
    pytest.importorskip("sglang.srt.server_args")
    if getattr(sglang, "__version__", None) != release.name:
        pytest.skip(f"the importable sglang is {getattr(sglang, '__version__', '?')}, not {release.name}")
    tool = extractor()
    raw = tool.extract_argparse(sys.executable, None)
    committed = _load_flags(release.flags_file)["flags"]
    seen = {}
    for action in raw["actions"]:
        if action["dest"] == "help":
            continue
        arity = tool.kind_of(action["action"], action["nargs"])
        seen[action["options"][0]] = {
            "aliases": action["options"][1:], "arity": arity, "nargs": action["nargs"],
            "type": tool.value_type(arity, action["type"]),
            "choices": None if action["choices"] is None else sorted(map(str, action["choices"])),
        }  # fmt: skip
    kept = {name: {"aliases": e["aliases"], "arity": e["arity"], "nargs": e["nargs"], "type": e["type"],
                   "choices": None if e["choices"] is None else sorted(map(str, e["choices"]))}
            for name, e in committed.items()}
    assert seen == kept
