"""Specifications of cptest/lang/fmt.py: canonical, idempotent, meaning-preserving, comment-keeping."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cptest.errors import ScenarioError
from cptest.lang import format_text, parse_text
from cptest.lang.fmt import render_duration
from cptest.testing.scenarios import random_scenario_text
from tests.lang.test_parse import DEFAULTS, FULL

MESSY = """# heading comment
cptest 1
scenario m {   # on the scenario line
  expect { log contains "a\\d+" launch accepted }
  workload { output_tokens 8 requests 4
    concurrency 2 prompt_tokens choice(16, 64)   # trailing
    timeout 2m }
  # explains the topology
  topology { tp 2 gpus 2
    # last words in topology
  }
  engine sglang "0.5.17"
  model synthetic llama { vocab 128 layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 intermediate 128 }
}
# tail
"""

CANONICAL = """# heading comment
cptest 1
scenario m {  # on the scenario line
  engine sglang "0.5.17"
  model synthetic llama {
    layers 2
    hidden 64
    heads 4
    kv_heads 1
    head_dim 16
    vocab 128
    intermediate 128
  }

  # explains the topology
  topology {
    gpus 2
    tp 2
    # last words in topology
  }
  workload {
    requests 4
    concurrency 2
    prompt_tokens choice(16, 64)  # trailing
    output_tokens 8
    timeout 120s
  }
  expect {
    launch accepted
    log contains "a\\d+"
  }
}
# tail
"""


def test_messy_file_formats_to_the_canonical_text():
    assert format_text(MESSY) == CANONICAL


def test_formatting_is_idempotent_and_keeps_meaning_on_examples():
    for text in (MESSY, FULL):
        once = format_text(text)
        assert format_text(once) == once
        assert parse_text(once) == parse_text(text)


def test_defaults_files_format_too():
    once = format_text(DEFAULTS)
    assert once.startswith("cptest 1\ndefaults {\n  engine sglang")
    assert format_text(once) == once


def test_formatter_reports_syntax_errors_as_scenario_errors():
    with pytest.raises(ScenarioError):
        format_text("cptest 1\nscenario x { topology { tpp 1 } }")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(30.0, "30s"), (0.5, "500ms"), (120.0, "120s"), (1.5, "1500ms"), (0.0001, "0.0001s")],
)
def test_durations_have_one_spelling(seconds: float, text: str):
    assert render_duration(seconds) == text


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_generated_scenarios_round_trip_through_the_formatter(seed: int):
    text = random_scenario_text(random.Random(seed))
    once = format_text(text)
    assert format_text(once) == once
    assert parse_text(once) == parse_text(text)
