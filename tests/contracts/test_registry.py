"""The contract registry (`cptest.contracts`): every contract is found from its module alone, and
everything that lists contracts agrees with it, so a new contract is its grammar rule, its module
and its tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cptest.contracts import CONTRACTS, Expectation
from cptest.lang import format_text, parse_text
from cptest.lang import tables as T
from cptest.lang.syntax import READERS, _Build
from cptest.scenario import Expect

GRAMMAR = (Path(T.__file__).parent / "cps.lark").read_text()

TEXT = """cptest 1
scenario t {
  engine sglang "0.5.17"
  model synthetic llama { layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 vocab 128 intermediate 128 }
  topology { gpus 2 tp 2 dcp 2 }
  baseline { tp 2 }
  workload { requests 8 concurrency 2 prompt_tokens 16 output_tokens 4 }
  expect { {expect} }
}
"""

EXAMPLES = [(name, text) for name, c in CONTRACTS.items() for text in c.examples]


def _expectation_rules() -> set[str]:
    """The aliases of the grammar's `expectation` rule (and the clause rules under it)."""
    block = GRAMMAR[GRAMMAR.index("?expectation:"):GRAMMAR.index("?value:")]
    return set(re.findall(r"->\s*(\w+)", block))


def test_the_registry_lists_every_contract_module_in_its_declared_order() -> None:
    modules = {p.stem for p in Path(T.__file__).parents[1].joinpath("contracts").glob("*.py")
               if re.search(r"^CONTRACT = Contract\(", p.read_text(), re.M)}
    assert set(CONTRACTS) == modules
    orders = [c.order for c in CONTRACTS.values()]
    assert orders == sorted(orders)


def test_each_contract_has_its_field_and_its_plan_kind() -> None:
    assert [f for f in Expect.model_fields if f not in ("span", "field_spans")] == list(CONTRACTS)
    kinds = {m.model_fields["kind"].default for m in Expectation.__origin__.__args__}  # type: ignore[attr-defined]
    assert kinds == set(CONTRACTS)


def test_every_expectation_rule_of_the_grammar_is_read_by_a_contract_and_no_other() -> None:
    assert _expectation_rules() == set(READERS)
    language_own = {name for name in dir(_Build) if not name.startswith("_")}
    assert not set(READERS) & language_own


def test_the_key_tables_follow_the_registry() -> None:
    assert tuple(k for c in CONTRACTS.values() for k in c.keys) == T.EXPECT_ORDER
    assert {c.syntax.keyword for c in CONTRACTS.values()} | {"violated"} == set(T.BLOCK_KEYS["expect"])
    assert {k for b, k in T.LIST_KEYS if b == "expect"} == {n for n, c in CONTRACTS.items() if c.listed}


@pytest.mark.parametrize(("name", "text"), EXAMPLES, ids=[t for _, t in EXAMPLES])
def test_each_example_parses_to_its_contract_and_formats_back_to_itself(name: str, text: str) -> None:
    scenario = TEXT.replace("{expect}", text)
    entries = parse_text(scenario, "t.cps").expect.entries()
    assert [n for n, _ in entries] == [name]
    assert f"    {text}\n" in format_text(scenario, "t.cps")


def test_every_contract_has_an_example() -> None:
    assert [n for n, c in CONTRACTS.items() if not c.examples] == []
