"""Whatever the input, parsing raises ScenarioError or nothing: never a raw Lark/pydantic/other error."""

from __future__ import annotations

import contextlib
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from cptest.errors import ScenarioError
from cptest.lang import format_text, parse_text
from cptest.testing.scenarios import random_scenario_text
from tests.lang.cases import BAD, BASE, with_line
from tests.lang.test_parse import FULL

SEEDS = [BASE, FULL, *(with_line(line, text) for _id, line, text, _w, _p in BAD)]
TOKENS = [
    "{", "}", "(", ")", ",", "%", "==", "*", ">=", '"', "#", "\t", "\n", "-", "0", "-1", "1.5", "1e999",
    "30s", "tp", "gpus", "fault", "expect", "violated", "because", "model", "local", "synthetic", "extends",
    "baseline", "uniform(", "choice()", "rank", "after", "at", "for", "server", "true", "none", "é", "\x00",
    "\\", '"\\"',
]  # fmt: skip


def _only_scenario_error(text: str) -> None:
    try:
        parse_text(text, "fuzz.cps", base_dir="/nonexistent")
    except ScenarioError as err:
        assert err.problems and str(err)
    with contextlib.suppress(ScenarioError):
        format_text(text, "fuzz.cps")


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=200))
def test_random_text_raises_only_scenario_error(text: str):
    _only_scenario_error(text)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.sampled_from([*TOKENS, " "]), max_size=60).map(
        lambda t: "cptest 1 scenario x {" + " ".join(t)
    )
)
def test_token_soup_raises_only_scenario_error(text: str):
    _only_scenario_error(text)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    base = draw(st.sampled_from(SEEDS + [random_scenario_text(random.Random(i)) for i in range(5)]))
    chars = list(base)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["insert", "delete", "replace", "token"]))
        pos = draw(st.integers(0, len(chars)))
        if op == "delete" and chars:
            del chars[min(pos, len(chars) - 1)]
        elif op == "insert":
            chars.insert(pos, draw(st.characters()))
        elif op == "replace" and chars:
            chars[min(pos, len(chars) - 1)] = draw(st.characters())
        else:
            chars[pos:pos] = list(" " + draw(st.sampled_from(TOKENS)) + " ")
    return "".join(chars)


@settings(max_examples=1500, deadline=None)
@given(mutated())
def test_mutated_scenarios_raise_only_scenario_error(text: str):
    _only_scenario_error(text)


@settings(max_examples=300, deadline=None)
@given(mutated())
def test_formatting_a_mutated_scenario_that_parses_keeps_its_meaning(text: str):
    try:
        before = parse_text(text, "fuzz.cps", base_dir="/nonexistent")
    except ScenarioError:
        return
    once = format_text(text, "fuzz.cps")
    assert format_text(once, "fuzz.cps") == once
    assert parse_text(once, "fuzz.cps", base_dir="/nonexistent") == before
