"""The grammar's keywords and the key tables (cptest/lang/tables.py) describe the same language."""

from __future__ import annotations

from cptest.lang import tables as T
from cptest.lang.syntax import parser


def _keywords() -> set[str]:
    out = set()
    for term in parser().terminals:
        if term.pattern.type == "str":
            out.add(str(term.pattern.value))
    return out


def test_every_table_key_is_a_keyword_of_the_grammar():
    words = _keywords()
    for block, keys in T.BLOCK_KEYS.items():
        missing = set(keys) - words
        assert not missing, f"{block}: {missing} not in cps.lark"


def test_every_typed_setting_is_a_key_of_its_block():
    for block, specs in T.SETTINGS.items():
        assert set(specs) <= set(T.BLOCK_KEYS[block]), block


def test_grammar_has_no_lalr_conflicts(caplog):
    # Without strict mode (needs interegular) Lark resolves shift/reduce conflicts silently and only
    # logs them at debug level; fail on any such log line.
    import logging

    from lark import Lark, logger

    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        with caplog.at_level(logging.DEBUG, logger="lark"):
            Lark.open("cps.lark", rel_to=T.__file__, parser="lalr", lexer="basic", debug=True)
    finally:
        logger.setLevel(old)
    conflicts = [r.getMessage() for r in caplog.records if "conflict" in r.getMessage().lower()]
    assert conflicts == []
