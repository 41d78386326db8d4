"""The scenario language's lexer: Lark's basic lexer with a tighter loop for the tokens it accepts.

Lark's `BasicLexer` spends most of a scenario's parse per token in generic machinery (a scanner
object, a line counter, a keyword regex run on every name). `ScenarioLexer` yields the same tokens
(type, value, start, line, column, end) from the same compiled terminal regex, looks keywords up in
a dict built from Lark's own keyword table, and hands the text over to `BasicLexer` at the first
character no terminal matches, so an `UnexpectedCharacters` error is Lark's own, raised with the
same position and token history.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lark.lexer import BasicLexer, LexerState, Token, UnlessCallback


class ScenarioLexer(BasicLexer):
    """`BasicLexer`, same tokens, less work per token (see the module's docstring)."""

    __future_interface__ = 2
    """Lark calls `lex(lexer_state, parser_state)` on it directly, as on its own lexers."""

    _keywords: dict[str, str] | None = None

    def _keyword_table(self) -> dict[str, str] | None:
        """Keyword text -> terminal name, from the keyword scanner Lark attaches to IDENT; None when a
        keyword has regex flags (case-insensitive, say), which a dict lookup cannot honour."""
        if self._keywords is None:
            unless = self.callback.get("IDENT")
            if not isinstance(unless, UnlessCallback):
                return None
            terminals = unless.scanner.terminals
            if any(t.pattern.flags for t in terminals):
                return None
            self._keywords = {t.pattern.value: t.name for t in terminals}
        return self._keywords

    def lex(self, state: LexerState, parser_state: Any) -> Iterator[Token]:
        scanner = self.scanner  # built on first use, with `self.callback`
        keywords = self._keyword_table()
        # Lark compiles the terminals into one regex unless there are too many for Python's `re`;
        # anything else than that one regex (another Lark release's scanner) is left to Lark.
        regexes = getattr(scanner, "_mres", None)
        if keywords is None or not isinstance(regexes, list) or len(regexes) != 1:
            yield from super().lex(state, parser_state)
            return
        match = regexes[0].match
        callbacks = {k: f for k, f in self.callback.items() if k != "IDENT"}
        ignore, newline_types = self.ignore_types, self.newline_types
        text, end = state.text.text, state.text.end
        ctr = state.line_ctr
        pos, line, line_start = ctr.char_pos, ctr.line, ctr.line_start_pos
        while pos < end:
            m = match(text, pos, end)
            if m is None:
                break
            value, type_, stop = m.group(0), m.lastgroup, m.end()
            assert type_ is not None
            start_line, start_col = line, pos - line_start + 1
            if type_ in newline_types:
                newlines = value.count("\n")
                if newlines:
                    line += newlines
                    line_start = pos + value.rindex("\n") + 1
            ignored = type_ in ignore
            if not ignored or type_ in callbacks:
                kind = keywords.get(value, type_) if type_ == "IDENT" else type_
                t = Token(kind, value, pos, start_line, start_col, line, stop - line_start + 1, stop)
                if type_ in callbacks:
                    t = callbacks[type_](t)
                if not ignored:
                    state.last_token = t
                    pos = stop
                    yield t
                    continue
            pos = stop
        # The end of the text, or a character no terminal matches: Lark's lexer takes over from here
        # (and raises its own error for that character).
        ctr.char_pos, ctr.line, ctr.line_start_pos = pos, line, line_start
        ctr.column = pos - line_start + 1
        yield from super().lex(state, parser_state)
