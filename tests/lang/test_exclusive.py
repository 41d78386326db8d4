"""The `exclusive "why"` statement: parsed, kept by the formatter, and a reason is required."""

from __future__ import annotations

from pathlib import Path

import pytest

from cptest.errors import ScenarioError
from cptest.lang import format_text, parse_file, parse_text
from cptest.plan import canonical_sha256

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
TEXT = (SCENARIOS / "tp1_llama_kv1.cps").read_text()


def body(line: str) -> str:
    """tp1_llama_kv1.cps with `line` as the first statement of its scenario block."""
    head, rest = TEXT.split("{", 1)
    return f"{head}{{\n  {line}{rest}"


def parse(text: str):
    return parse_text(text, str(SCENARIOS / "s.cps"), base_dir=str(SCENARIOS))


def test_exclusive_is_parsed_and_formatted_back(tmp_path: Path) -> None:
    text = body('exclusive "times decode steps"')
    assert parse(text).exclusive == "times decode steps"
    assert 'exclusive "times decode steps"' in format_text(text, "s.cps")


def test_without_it_the_scenario_may_share_and_its_hash_is_unchanged(tmp_path: Path) -> None:
    s = parse(body(""))
    assert s.exclusive is None and "exclusive" not in s.model_dump()
    assert canonical_sha256(s) == canonical_sha256(parse_file(SCENARIOS / "tp1_llama_kv1.cps"))


def test_an_empty_reason_is_bad_input_at_its_position() -> None:
    with pytest.raises(ScenarioError) as e:
        parse(body('exclusive ""'))
    line = 1 + TEXT.split("{", 1)[0].count("\n") + 1
    assert f"s.cps:{line}:3: exclusive needs a reason" in e.value.render()
