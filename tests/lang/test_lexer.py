"""`ScenarioLexer` yields exactly what Lark's own basic lexer yields: the same tokens with the same
positions, the same parse trees, the same comments and the same syntax errors, on valid scenarios
and on broken ones (unexpected characters, cut strings, stray braces, newlines anywhere)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from lark import Lark, Token
from lark.exceptions import UnexpectedInput

from cptest.lang import syntax
from cptest.lang.lexer import ScenarioLexer
from cptest.testing.scenarios import random_scenario_text
from tests.lang.cases import BAD, BASE, with_line
from tests.lang.test_parse import FULL

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").rglob("*.cps"))
NOISE = ["'", "@", "\n", "{", "}", '"', "x", "1", " ", "#", "\t", "é", "\r", "$", "\\", "-", "*"]


def _lark_basic() -> Lark:
    """The parser as cptest builds it, but with Lark's own basic lexer."""
    return Lark.open(str(Path(syntax.__file__).with_name("cps.lark")), parser="lalr", lexer="basic",
                     propagate_positions=True, maybe_placeholders=True,
                     lexer_callbacks={"COMMENT": syntax._on_comment})


def _texts() -> list[str]:
    rng = random.Random(20)
    valid = [BASE, FULL, *(p.read_text() for p in SCENARIOS), *(random_scenario_text(rng) for _ in range(60))]
    broken = [with_line(line, text) for _id, line, text, _w, _p in BAD]
    for text in valid[:80]:
        for _ in range(3):
            at = rng.randrange(len(text))
            broken.append(text[:at] + rng.choice(NOISE) + text[at + 1 :])
    return valid + broken


def _token(t: Token) -> tuple[Any, ...]:
    return (t.type, str(t), t.start_pos, t.line, t.column, t.end_line, t.end_column, t.end_pos)


def _outcome(parser: Lark, text: str) -> tuple[Any, ...]:
    comments: list[syntax.Comment] = []
    syntax._comments.sink = comments
    try:
        tree = parser.parse(text)
    except UnexpectedInput as err:
        token = getattr(err, "token", None)
        expected = next((getattr(err, k) for k in ("accepts", "expected", "allowed")
                         if getattr(err, k, None)), ())
        return ("error", type(err).__name__, err.line, err.column, getattr(err, "pos_in_stream", None),
                token is not None and _token(token), sorted(expected), comments)
    finally:
        syntax._comments.sink = None
    tokens = [_token(t) for t in tree.scan_values(lambda v: isinstance(v, Token))]
    metas = [(n.data, n.meta.line, n.meta.column, n.meta.end_line, n.meta.end_column)
             for n in tree.iter_subtrees() if not n.meta.empty]
    return ("tree", str(tree), tokens, metas, comments)


def test_cptest_parses_with_the_scenario_lexer():
    assert isinstance(syntax.parser().parser.lexer, ScenarioLexer)


@pytest.fixture(scope="module")
def lark_basic() -> Lark:
    return _lark_basic()


def test_tokens_trees_comments_and_errors_are_lark_basic_lexers(lark_basic: Lark):
    texts = _texts()
    outcomes = [(_outcome(syntax.parser(), t), _outcome(lark_basic, t)) for t in texts]
    differ = [t for t, (ours, theirs) in zip(texts, outcomes, strict=True) if ours != theirs]
    assert differ == []
    # Both kinds of input were compared: parses, and errors of the lexer and of the parser.
    kinds = {o[0] if o[0] == "tree" else o[1] for o, _ in outcomes}
    assert kinds == {"tree", "UnexpectedCharacters", "UnexpectedToken"}
