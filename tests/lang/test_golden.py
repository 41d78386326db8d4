"""Every file in scenarios/ parses, is already in canonical form, and survives the formatter.

The parsed value of each scenario is also pinned as JSON under tests/golden/lang/<name>.json, so a
change of meaning (a default, a merge rule) shows up as a diff.  Regenerate with
`CPTEST_UPDATE_GOLDEN=1 python -m pytest tests/lang/test_golden.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cptest.lang import format_text, parse_file, parse_text

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.cps"))
DEFAULTS = sorted((ROOT / "scenarios" / "defaults").glob("*.cps"))
GOLDEN = ROOT / "tests" / "golden" / "lang"


def _portable(data: dict) -> dict:
    # Model and dataset paths are resolved to absolute paths; pin them relative to the repo.
    text = json.dumps(data, sort_keys=True, indent=1).replace(str(ROOT) + "/", "")
    return json.loads(text)


def test_the_suite_exists():
    assert len(SCENARIOS) >= 10 and DEFAULTS


@pytest.mark.parametrize("path", SCENARIOS + DEFAULTS, ids=lambda p: p.name)
def test_scenario_file_is_in_canonical_form(path: Path):
    text = path.read_text()
    assert format_text(text, str(path)) == text


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_scenario_round_trips_and_matches_its_golden_value(path: Path):
    scenario = parse_file(path)
    again = parse_text(format_text(path.read_text(), str(path)), str(path))
    assert again == scenario
    golden = GOLDEN / f"{path.stem}.json"
    value = _portable(scenario.model_dump(mode="json"))
    if os.environ.get("CPTEST_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(json.dumps(value, sort_keys=True, indent=1) + "\n")
    assert golden.exists(), f"missing {golden}; set CPTEST_UPDATE_GOLDEN=1 to create it"
    assert json.loads(golden.read_text()) == value, f"{path.name} changed meaning; see {golden}"
