"""Specification of `capacity transitions` and `workload { fill_drain P }` (D59) in the language: what
they parse to, how they format, and what is refused where."""

from __future__ import annotations

import pytest

from cptest.errors import ScenarioError
from cptest.lang import format_text, parse_text

TEXT = """cptest 1
scenario t {
  engine sglang "0.5.17"
  model synthetic llama { layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 vocab 128 intermediate 128 }
  topology { gpus 2 tp 2 dcp 2 }
  serve { max_total_tokens 4096 }
  workload { requests 40 {loop} prompt_tokens 240 output_tokens 16 }
  expect { {expect} }
}
"""


def _text(loop: str = "fill_drain 0.95", expect: str = "capacity transitions") -> str:
    return TEXT.replace("{loop}", loop).replace("{expect}", expect)


def test_the_statement_defaults_to_peak_0_9_and_no_slack() -> None:
    ct = parse_text(_text(), "t.cps").expect.capacity_transitions
    assert ct is not None and (ct.peak, ct.slack) == (0.9, 0)


def test_the_statement_takes_a_peak_and_a_slack() -> None:
    ct = parse_text(_text(expect="capacity transitions peak >= 0.95 together within 8"), "t.cps")
    assert ct.expect.capacity_transitions is not None
    assert (ct.expect.capacity_transitions.peak, ct.expect.capacity_transitions.slack) == (0.95, 8)


def test_both_format_canonically_and_keep_their_meaning() -> None:
    text = _text(expect="capacity transitions peak >= 0.95 together within 8 "
                        "capacity logical == 2 * physical")
    out = format_text(text, "t.cps")
    assert ("    capacity logical == 2 * physical\n"
            "    capacity transitions peak >= 0.95 together within 8\n") in out
    assert "    fill_drain 0.95\n" in out
    assert parse_text(out, "t.cps") == parse_text(text, "t.cps")


def test_a_scenario_without_them_dumps_as_before() -> None:
    s = parse_text(_text(loop="concurrency 4", expect="launch accepted"), "t.cps")
    dumped = s.model_dump(mode="json")
    assert "capacity_transitions" not in dumped["expect"] and "fill_drain" not in dumped["workload"]


@pytest.mark.parametrize(("expect", "message"), [
    ("capacity transitions peak >= 1.5", "capacity transitions peak is out of range"),
    ("capacity transitions peak >= 0", "capacity transitions peak is out of range"),
    ("capacity transitions together within 0.5", "'together within' takes whole tokens"),
])
def test_a_bad_value_is_refused_at_the_statement(expect: str, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_text(_text(expect=expect), "t.cps")
    (problem,) = err.value.problems
    assert message in problem.message and problem.span is not None and problem.span.line == 8


@pytest.mark.parametrize(("loop", "message", "col"), [
    ("fill_drain 0.95 concurrency 4", "fill_drain sets the workload's concurrency itself", 26),
    ("fill_drain 0.95 rate 2", "fill_drain sets the workload's concurrency itself", 26),
    ("fill_drain 1.5", "fill_drain is out of range", 26),
])
def test_fill_drain_is_refused_beside_a_loop_of_its_own_or_out_of_range(loop: str, message: str,
                                                                        col: int) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_text(_text(loop=loop), "t.cps")
    (problem,) = err.value.problems
    assert message in problem.message
    assert problem.span is not None and (problem.span.line, problem.span.col) == (7, col)


def test_fill_drain_overrides_a_concurrency_inherited_from_an_extends_file(tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "d.cps").write_text("cptest 1\ndefaults {\n  workload { concurrency 8 }\n}\n")
    text = _text().replace("scenario t {\n", 'scenario t {\n  extends "d.cps"\n')
    s = parse_text(text, str(tmp_path / "t.cps"))
    assert s.workload.fill_drain == 0.95 and s.workload.concurrency is None
