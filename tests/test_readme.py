"""The README's examples work: its scenario is valid as written, in the folder it names."""

from __future__ import annotations

import re
from pathlib import Path

from cptest.lang import format_text, parse_file, parse_text

ROOT = Path(__file__).resolve().parents[1]


def readme_scenario() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```\n(.*?)```", text, re.S) if b.startswith("cptest 1\n")]
    assert len(blocks) == 1, "the README shows one scenario"
    return blocks[0]


def test_the_readme_scenario_is_the_one_it_names_and_valid_there() -> None:
    source = readme_scenario()
    path = ROOT / "scenarios" / "dcp2_llama_kv1.cps"
    scenario = parse_text(source, str(path), base_dir=str(path.parent))
    named = parse_file(path)
    assert scenario.name == named.name == "dcp2_llama_kv1"
    assert scenario.topology == named.topology and scenario.model == named.model
    assert format_text(source, "README.md") == source, "the README shows the form `cptest fmt` writes"


def test_the_language_guide_shows_its_example_in_the_form_fmt_writes() -> None:
    text = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    example = re.findall(r"```\n(.*?)```", text, re.S)[0]
    assert "cptest 1\nscenario " in example
    assert format_text(example, "docs/language.md") == example
