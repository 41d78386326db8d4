"""A scenario's regex is searched with a time limit: a catastrophic pattern gives `unknown` in about
the limit, never a check that does not end (cptest/contracts/patterns.py)."""

from __future__ import annotations

import time

import pytest

from cptest.contracts import patterns
from cptest.contracts.log import LogExpect, LogParams, check
from cptest.errors import ScenarioError
from cptest.evidence import Evidence, RoleEvidence
from cptest.lang import parse_text

CATASTROPHIC = "(x+x+)+y"
"""Exponential in Python's `re` on a line of x's without a y: `re.search` would not return."""


def evidence(log: str) -> Evidence:
    return Evidence(roles={"main": RoleEvidence(role="main", world_size=1, nodes=[0], logs={0: log})})


def test_a_catastrophic_pattern_on_a_long_log_is_unknown_within_seconds() -> None:
    # The limit is CPU time (the regex module's timeout): on a shared machine the wall clock runs longer.
    t0 = time.process_time()
    v = check(evidence("x" * 5000 + "\n"), LogParams(pattern=CATASTROPHIC, present=False))
    took = time.process_time() - t0
    assert v.status == "unknown" and "did not finish within 2 s of CPU time" in v.reason, v.reason
    assert took < 4, took


def test_search_raises_pattern_timeout_at_its_limit() -> None:
    t0 = time.process_time()
    with pytest.raises(patterns.PatternTimeout):
        patterns.search(CATASTROPHIC, "x" * 5000, timeout_s=0.2)
    assert time.process_time() - t0 < 2


def test_ordinary_patterns_keep_their_meaning() -> None:
    v = check(evidence("a\nDCP enabled, dcp_size=2\nb\n"), LogParams(pattern=r"dcp_size=\d+$", present=True))
    assert v.status == "pass"
    v = check(evidence("all fine\n"), LogParams(pattern="Traceback", present=False))
    assert v.status == "pass"
    assert patterns.search(r"(?P<n>\d+) tokens", "kv 128 tokens")["n"] == "128"  # type: ignore[index]


def test_a_pattern_that_does_not_compile_or_is_too_long_is_bad_input() -> None:
    assert patterns.check("[") is not None and patterns.check("x" * 5000) is not None
    with pytest.raises(ValueError):
        LogExpect(mode="absent", pattern="(")
    text = """cptest 1
scenario s {
  engine reference
  model synthetic llama { layers 1 hidden 64 heads 8 kv_heads 1 head_dim 16 vocab 256 intermediate 128 }
  topology { gpus 1 tp 1 }
  workload { requests 1 concurrency 1 prompt_tokens 8 output_tokens 1 }
  expect { log absent "(" launch rejected matching "[" }
}
"""
    with pytest.raises(ScenarioError) as e:
        parse_text(text, "s.cps", base_dir="/nonexistent")
    assert [str(p.span) for p in e.value.problems] == ["s.cps:7:12", "s.cps:7:27"]
