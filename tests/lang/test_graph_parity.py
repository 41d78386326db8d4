"""Specification of the `graph parity vs eager` statement (D60): what it parses to, how it formats, and
what is refused where."""

from __future__ import annotations

import pytest

from cptest.errors import ScenarioError
from cptest.lang import format_text, parse_text

TEXT = """cptest 1
scenario t {
  engine sglang "0.5.17"
  model synthetic llama { layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 vocab 128 intermediate 128 }
  topology { gpus 2 tp 2 dcp 2 }
  serve { cuda_graph_decode full }
  baseline { tp 2 }
  workload { requests 4 concurrency 2 prompt_tokens 16 output_tokens 4 }
  expect {
    graph prefill eager
    graph parity vs eager {clauses}
  }
}
"""


def _parse(clauses: str):  # noqa: ANN202 - a Scenario
    return parse_text(TEXT.replace("{clauses}", clauses), "t.cps")


def test_the_statement_takes_generation_s_teacher_forced_and_free_running_clauses() -> None:
    s = _parse("logprob p99 <= 4 * control topk 5 agree >= 0.9 logprob max <= 0.5 free_running topk 5")
    gp = s.expect.graph_parity
    assert gp is not None and gp.free_running_topk == 5
    assert [b.text() for b in gp.bounds] == ["logprob p99 <= 4 * control", "topk 5 agree >= 0.9",
                                             "logprob max <= 0.5"]
    # `eager` stays a word of other statements: the graph contract's prefill mode still parses
    assert [(g.phase, g.mode) for g in s.expect.graph] == [("prefill", "eager")]


def test_it_formats_canonically_and_keeps_its_meaning() -> None:
    text = TEXT.replace("{clauses}", "free_running   topk 5\n      logprob p99 <= 4 *   control")
    out = format_text(text, "t.cps")
    assert "    graph parity vs eager logprob p99 <= 4 * control free_running topk 5\n" in out
    assert parse_text(out, "t.cps") == parse_text(text, "t.cps") and format_text(out, "t.cps") == out


@pytest.mark.parametrize(("clauses", "where", "says"), [
    ("", (11, 5), "graph parity expects nothing"),
    ("tokens_agree >= 0.9", (11, 5), "tokens_agree is an older key of generation only"),
    ("logprob p42 <= 1", (11, 5), "logprob statistic"),
])
def test_a_statement_without_a_valid_clause_is_refused_at_it(clauses: str, where: tuple[int, int],
                                                              says: str) -> None:
    with pytest.raises(ScenarioError) as err:
        _parse(clauses)
    assert any(p.span is not None and (p.span.line, p.span.col) == where and says in p.message
               for p in err.value.problems), err.value.render()


def test_the_words_parity_and_eager_are_checked_at_their_own_position() -> None:
    bad = TEXT.replace("graph parity vs eager {clauses}", "graph parity vs graphs logprob p99 <= 1")
    with pytest.raises(ScenarioError) as err:
        parse_text(bad, "t.cps")
    (problem,) = err.value.problems
    assert problem.span is not None and (problem.span.line, problem.span.col) == (11, 21)
    assert "graph parity reference" in problem.message and "eager" in (problem.expected or "")
    bad = TEXT.replace("graph parity vs eager {clauses}", "graph parrity vs eager logprob p99 <= 1")
    with pytest.raises(ScenarioError) as err:
        parse_text(bad, "t.cps")
    (problem,) = err.value.problems
    assert problem.span is not None and (problem.span.line, problem.span.col) == (11, 11)
    assert "did you mean" in (problem.hint or "") or "parity" in (problem.expected or "")
