"""Text -> `Doc`: the statements of one `.cps` file as written, with positions (no meaning yet).

This is the only module that touches Lark.  `read_doc` parses one file's text into a `Doc` (a flat
list of `Stmt`, in source order) or raises `ScenarioError` with the position of the syntax error and
what was expected there.  It does not resolve `extends`, check types or ranges, or read files: that
is `cptest.lang.validate` and the modules it composes.  The formatter works on the same `Doc`, so it
can format a file whose `extends` target is missing.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from cptest.contracts import CONTRACTS
from cptest.contracts.base import Misread, Reader, Written
from cptest.errors import Problem, ScenarioError, Span, did_you_mean, one_of
from cptest.lang.lexer import ScenarioLexer
from cptest.lang.tables import BLOCK_KEYS, TOP_BLOCK
from cptest.values import Call, Duration, Ident


class Block:
    """Value of a statement that opens a `{ ... }` block."""

    def __repr__(self) -> str:
        return "BLOCK"


BLOCK = Block()


@dataclass(frozen=True)
class Stmt:
    """One setting or statement.

    `block` is where it appears ("" for the scenario body, "topology", "expect", ...); `key` is the
    setting name (for expectations: "launch", "rows", ..., "graph decode"; for faults "fault").
    `span` covers the whole statement (for block openers: the whole block); `head` ends where the
    statement's first line ends, which is where a trailing comment attaches.
    """

    block: str
    key: str
    value: Any
    span: Span
    head: Span
    parts: dict[str, Span] = field(default_factory=dict, compare=False)
    """Positions of the statement's own parts (fault rank, capacity multiplier, ...)."""


@dataclass(frozen=True)
class Comment:
    line: int
    col: int
    text: str


@dataclass
class Doc:
    """One parsed file: `cptest N` header, `scenario NAME` or `defaults`, statements, comments."""

    filename: str
    text: str
    version: int
    version_span: Span
    kind: str
    """"scenario" or "defaults"."""
    name: str | None
    name_span: Span
    stmts: list[Stmt]
    comments: list[Comment]
    end: Span
    """Position of the closing brace of the scenario / defaults body."""


# ---------------------------------------------------------------------------------------- parser

_comments = threading.local()


def _on_comment(token: Token) -> None:
    sink = getattr(_comments, "sink", None)
    if sink is not None:
        sink.append(Comment(token.line or 0, token.column or 0, str(token)))


@functools.lru_cache(maxsize=1)
def parser() -> Lark:
    """The LALR parser for cps.lark, built once per process.

    The basic lexer (here `ScenarioLexer`: the same tokens, faster) makes every keyword reserved, so
    an unknown key lexes as IDENT and the error handler can name the valid keys from the parser's
    `accepts` set (Lark's `UnexpectedToken.accepts`: the terminals the LALR state could shift, i.e.
    exactly the keys valid in that block).
    """
    return Lark.open(
        "cps.lark",
        rel_to=__file__,
        parser="lalr",
        lexer=ScenarioLexer,
        propagate_positions=True,
        maybe_placeholders=True,
        lexer_callbacks={"COMMENT": _on_comment},
    )


def _span(filename: str, meta: Any) -> Span:
    return Span(filename, meta.line, meta.column, meta.end_line, meta.end_column)


def _tok_span(filename: str, tok: Token) -> Span:
    return Span(filename, tok.line or 0, tok.column or 0, tok.end_line or 0, tok.end_column or 0)


def _readers() -> dict[str, Reader]:
    """Every grammar rule a contract reads -> its reader (a clause rule two contracts share, once)."""
    out: dict[str, Reader] = {}
    for contract in CONTRACTS.values():
        for rule, reader in contract.syntax.rules.items():
            if out.setdefault(rule, reader) is not reader:
                raise RuntimeError(f"grammar rule {rule} is read by two contracts differently")
    return out


READERS = _readers()


def unquote(text: str) -> str:
    """Decode a STRING token: only `\\"` and `\\\\` are escapes, so regexes read naturally ("\\d+")."""
    body = text[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body) and body[i + 1] in '"\\':
            out.append(body[i + 1])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def quote(value: str) -> str:
    """Inverse of `unquote`: escape quotes, and backslashes only where `unquote` would read an escape."""
    out: list[str] = ['"']
    for i, ch in enumerate(value):
        if ch == '"':
            out.append('\\"')
        elif ch == "\\" and (i + 1 == len(value) or value[i + 1] in '"\\'):
            out.append("\\\\")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


MAX_INT_DIGITS = 30
"""Longest integer literal the language reads. Every integer setting is bounded far below 10**30
(cptest/lang/tables.py), so a longer one is an error at its token, never CPython's 4,300-digit
`ValueError` or a bignum the later stages would choke on."""
MAX_NUMBER_CHARS = 64
"""Longest number or duration literal (`1e-3`, `1500ms`): longer ones are errors at the token."""


def duration_seconds(text: str) -> float:
    if text.endswith("ms"):
        return float(text[:-2]) / 1000.0
    if text.endswith("h"):
        return float(text[:-1]) * 3600.0
    if text.endswith("m"):
        return float(text[:-1]) * 60.0
    return float(text[:-1])


class _Build:
    """Tree -> values and `Stmt`s. Blocks return lists of `Stmt` that the parent flattens.

    A hand-written walk instead of lark.Transformer: every method gets (meta, children); it is
    several times faster than Transformer with v_args(meta=True), and parse speed is a target
    (benchmarks/parse_compile.py).
    """

    def __init__(self, filename: str):
        self.f = filename
        self._methods: dict[str, Any] = {}

    def transform(self, tree: Tree) -> Any:
        children = [self.transform(c) if isinstance(c, Tree) else c for c in tree.children]
        name = str(tree.data)
        method = self._methods.get(name)
        if method is None:
            method = self._methods[name] = self._contract_rule(name) or getattr(self, name)
        return method(tree.meta, children)

    def start(self, meta: Any, c: list[Any]) -> list[Any]:
        return c

    # -- values
    def int(self, meta: Any, c: list[Token]) -> int:
        return self._int(c[0])

    def _int(self, tok: Token) -> int:
        """An INT token's value. Longer than `MAX_INT_DIGITS` is a problem at the token, before
        `int()` would refuse it (CPython's 4,300-digit limit) or build a huge number."""
        text = str(tok)
        if len(text.lstrip("-")) > MAX_INT_DIGITS:
            raise _Dup(_tok_span(self.f, tok), f"integer of {len(text.lstrip('-'))} digits is too large "
                       f"(at most {MAX_INT_DIGITS} digits)")
        return int(text)

    def float(self, meta: Any, c: list[Token]) -> float:
        value = float(c[0])
        if value in (float("inf"), float("-inf")) or len(str(c[0])) > MAX_NUMBER_CHARS:
            raise _Dup(_tok_span(self.f, c[0]), f"number {str(c[0])!r} is too large")
        return value

    def duration(self, meta: Any, c: list[Token]) -> Duration:
        value = duration_seconds(str(c[0]))
        if value in (float("inf"), float("-inf")) or len(str(c[0])) > MAX_NUMBER_CHARS:
            raise _Dup(_tok_span(self.f, c[0]), f"duration {str(c[0])!r} is too large")
        return Duration(value)

    def string(self, meta: Any, c: list[Token]) -> str:
        return unquote(str(c[0]))

    def ident(self, meta: Any, c: list[Token]) -> Ident:
        return Ident(str(c[0]))

    def true(self, meta: Any, c: list[Token]) -> bool:
        return True

    def false(self, meta: Any, c: list[Token]) -> bool:
        return False

    def call(self, meta: Any, c: list[Any]) -> Call:
        return Call(str(c[0]), tuple(x for x in c[1:] if x is not None))

    # -- generic keyed settings inside a block: (key token, value); the block assigns positions
    def _item(self, meta: Any, c: list[Any]) -> tuple[Token, Any, Span]:
        return (c[0], c[1], _span(self.f, meta))

    def _key(self, meta: Any, c: list[Token]) -> Token:
        return c[0]

    model_key = facts_key = topology_key = serve_key = baseline_key = workload_key = sampling_key = _key

    model_item = facts_item = topology_item = serve_setting = baseline_item = _item
    workload_setting = sampling_item = _item

    def _block(self, block: str, items: list[Any], meta: Any, opener_key: str | None = None) -> list[Stmt]:
        span = _span(self.f, meta)
        out = [Stmt("", opener_key or block, BLOCK, span, Span(self.f, span.line, span.col, span.line, 0))]
        out += self._stmts(block, items)
        return out

    def _stmts(self, block: str, items: list[Any]) -> list[Stmt]:
        out: list[Stmt] = []
        for item in items:
            if isinstance(item, tuple):
                key, value, span = item
                out.append(Stmt(block, str(key), value, span, span, {"key": _tok_span(self.f, key)}))
            elif isinstance(item, list):
                out.extend(s if s.block or block == "" else _reblock(s, block) for s in item)
            elif isinstance(item, Stmt):
                out.append(item if item.block else _reblock(item, block))
        return out

    def facts(self, meta: Any, c: list[Any]) -> list[Stmt]:
        return self._block("facts", c, meta)

    def topology(self, meta: Any, c: list[Any]) -> list[Stmt]:
        return self._block("topology", c, meta)

    def serve(self, meta: Any, c: list[Any]) -> list[Stmt]:
        return self._block("serve", c, meta)

    def workload(self, meta: Any, c: list[Any]) -> list[Stmt]:
        return self._block("workload", c, meta)

    def expect(self, meta: Any, c: list[Any]) -> list[Stmt]:
        return self._block("expect", c, meta)

    def baseline_block(self, meta: Any, c: list[Any]) -> list[Stmt]:
        return self._block("baseline", c, meta)

    def baseline_word(self, meta: Any, c: list[Token]) -> Stmt:
        span = _span(self.f, meta)
        return Stmt("", "baseline", Ident(str(c[0])), span, span, {"value": _tok_span(self.f, c[0])})

    def flag(self, meta: Any, c: list[Token]) -> Stmt:
        span = _span(self.f, meta)
        # Each part's position: a problem with one value (a smuggled option, a wrong type) is
        # reported at that value ("0" is the flag's name).
        parts = {str(k): _tok_span(self.f, t) for k, t in enumerate(c)}
        return Stmt("serve", "flag", tuple(unquote(str(t)) for t in c), span, span, parts)

    # -- top-level statements
    def env(self, meta: Any, c: list[Token]) -> Stmt:
        span = _span(self.f, meta)
        return Stmt("serve", "env", (unquote(str(c[0])), unquote(str(c[1]))), span, span)

    def description(self, meta: Any, c: list[Token]) -> Stmt:
        span = _span(self.f, meta)
        return Stmt("", "description", unquote(str(c[0])), span, span)

    def exclusive(self, meta: Any, c: list[Token]) -> Stmt:
        span = _span(self.f, meta)
        return Stmt("", "exclusive", unquote(str(c[0])), span, span)

    def unsafe(self, meta: Any, c: list[Token]) -> Stmt:
        span = _span(self.f, meta)
        return Stmt("", "unsafe", unquote(str(c[0])), span, span)

    def deadline(self, meta: Any, c: list[Any]) -> Stmt:
        span = _span(self.f, meta)
        return Stmt("", "deadline", c[0], span, span)

    def extends(self, meta: Any, c: list[Token]) -> Stmt:
        span = _span(self.f, meta)
        return Stmt("", "extends", unquote(str(c[0])), span, span)

    def engine(self, meta: Any, c: list[Any]) -> Stmt:
        kind, release, image = c
        span = _span(self.f, meta)
        value = {
            "kind": Ident(str(kind)),
            "release": unquote(str(release)) if release is not None else None,
            "image": unquote(str(image)) if image is not None else None,
        }
        return Stmt("", "engine", value, span, span, {"kind": _tok_span(self.f, kind)})

    def model_opt(self, meta: Any, c: list[Token]) -> tuple[str, str, Span]:
        return (str(c[0]), unquote(str(c[1])), _tok_span(self.f, c[0]))

    def model_body(self, meta: Any, c: list[Any]) -> list[Stmt]:
        return [
            Stmt("", "model {", BLOCK, _span(self.f, meta), _span(self.f, meta)),
            *self._stmts("model", c),
        ]

    def model(self, meta: Any, c: list[Any]) -> list[Stmt]:
        kind, arg, *rest = c
        body = rest.pop() if rest else None
        span = _span(self.f, meta)
        value: dict[str, Any] = {"kind": Ident(str(kind)), "arg": arg}
        parts = {"kind": _tok_span(self.f, kind)}
        for opt in rest:
            if opt is not None:
                name, text, where = opt
                if name in value:
                    raise _Dup(where, f"duplicate '{name}' in model statement")
                value[name] = text
                parts[name] = where
        head_end = body[0].span if body else span
        head = Span(self.f, span.line, span.col, head_end.line, head_end.col)
        out = [Stmt("", "model", value, span, head, parts)]
        if body:
            out += body[1:]
        return out

    # -- faults
    def rank_target(self, meta: Any, c: list[Token]) -> tuple[str, int | None, Span | None]:
        return ("rank", self._int(c[0]), _tok_span(self.f, c[0]))

    def server_target(self, meta: Any, c: list[Token]) -> tuple[str, int | None, Span | None]:
        return ("server", None, None)

    def after_requests(self, meta: Any, c: list[Token]) -> tuple[str, Any, Span]:
        return ("after_requests", self._int(c[0]), _tok_span(self.f, c[0]))

    def after_decode_steps(self, meta: Any, c: list[Token]) -> tuple[str, Any, Span]:
        return ("after_decode_steps", self._int(c[0]), _tok_span(self.f, c[0]))

    def at_time(self, meta: Any, c: list[Any]) -> tuple[str, Any, Span]:
        return ("at", c[0], _span(self.f, meta))

    def fault(self, meta: Any, c: list[Any]) -> Stmt:
        action, (target, rank, rank_span), (trigger, tvalue, tspan), for_tok, heal = c
        span = _span(self.f, meta)
        value = {"action": Ident(str(action)), "target": target, "rank": rank, trigger: tvalue, "for": heal}
        parts = {"action": _tok_span(self.f, action), "trigger": tspan}
        if rank_span:
            parts["rank"] = rank_span
        if for_tok is not None:
            parts["for"] = _tok_span(self.f, for_tok)
        return Stmt("", "fault", value, span, span, parts)

    # -- workload specials
    def sampling(self, meta: Any, c: list[Any]) -> list[Stmt]:
        mode, body = c
        span = _span(self.f, meta)
        head = Span(self.f, span.line, span.col, mode.end_line or 0, mode.end_column or 0)
        out = [Stmt("workload", "sampling", Ident(str(mode)), span, head, {"mode": _tok_span(self.f, mode)})]
        if body:
            out += body
        return out

    def sampling_body(self, meta: Any, c: list[Any]) -> list[Stmt]:
        return self._stmts("sampling", c)

    def source(self, meta: Any, c: list[Any]) -> Stmt:
        kind, path = c
        span = _span(self.f, meta)
        value = (Ident(str(kind)), unquote(str(path)) if path is not None else None)
        return Stmt("workload", "source", value, span, span, {"kind": _tok_span(self.f, kind)})

    # -- expectations: each rule is read by the contract that lists it (`Syntax.rules`)
    def _contract_rule(self, name: str) -> Any:
        """The method for a grammar rule a contract reads, or None."""
        reader = READERS.get(name)
        if reader is None:
            return None

        def read(meta: Any, c: list[Any]) -> Any:
            try:
                out = reader([self._token(x) if isinstance(x, Token) else x for x in c])
            except Misread as err:
                raise _Dup(_span(self.f, meta), str(err)) from None
            if not isinstance(out, Written):
                return out  # a clause: its statement's reader takes it
            span = _span(self.f, meta)
            parts = {k: _tok_span(self.f, tok) for k, tok in out.parts.items()}
            return Stmt("expect", out.key, out.value, span, span, parts)

        return read

    def _token(self, tok: Token) -> Token:
        """A named token as a contract's reader gets it: a STRING's text unquoted, its position kept;
        an INT's length checked as every integer's."""
        if tok.type == "STRING":
            return Token.new_borrow_pos("STRING", unquote(str(tok)), tok)
        if tok.type == "INT":
            self._int(tok)
        return tok

    def violated(self, meta: Any, c: list[Any]) -> Stmt:
        # `violated EXPECTATION [on ENGINE ["RELEASE"]] because "why"`
        inner, because = c[0], c[-1]
        engine, release = (c[2], c[3]) if len(c) == 5 else (None, None)
        span = _span(self.f, meta)
        value = {**inner.value, "violated": True, "because": unquote(str(because))}
        parts = dict(inner.parts)
        if engine is not None:
            value["violated_on"] = [str(engine), unquote(str(release)) if release is not None else None]
            parts["violated_on"] = _tok_span(self.f, engine)
        return Stmt("expect", inner.key, value, span, span, parts)

    # -- file
    def header(self, meta: Any, c: list[Token]) -> tuple[int, Span]:
        return (self._int(c[0]), _tok_span(self.f, c[0]))

    def scenario(self, meta: Any, c: list[Any]) -> tuple[str, str | None, Span, list[Stmt], Span]:
        name = c[0]
        return ("scenario", str(name), _tok_span(self.f, name), self._stmts("", c[1:]), _end(self.f, meta))

    def defaults(self, meta: Any, c: list[Any]) -> tuple[str, str | None, Span, list[Stmt], Span]:
        span = _span(self.f, meta)
        return ("defaults", None, Span(self.f, span.line, span.col), self._stmts("", c), _end(self.f, meta))


def _end(filename: str, meta: Any) -> Span:
    return Span(filename, meta.end_line, max(meta.end_column - 1, 1))


def _reblock(stmt: Stmt, block: str) -> Stmt:
    return Stmt(block, stmt.key, stmt.value, stmt.span, stmt.head, stmt.parts)


class _Dup(Exception):
    """A problem found while transforming (duplicate part, huge number); re-raised as ScenarioError."""

    def __init__(self, span: Span, message: str):
        super().__init__(message)
        self.span = span
        self.message = message


# ---------------------------------------------------------------------------------------- entry


def read_doc(text: str, filename: str = "<input>", *, keep_comments: bool = False) -> Doc:
    """Parse one file's text into a `Doc`. Raises ScenarioError (and nothing else) on bad syntax."""
    sink: list[Comment] = []
    _comments.sink = sink if keep_comments else None
    try:
        tree = parser().parse(text)
    except UnexpectedInput as err:
        raise ScenarioError(_syntax_problem(err, text, filename), sources={filename: text}) from None
    except RecursionError:
        raise ScenarioError(
            Problem(Span(filename, 1, 1), "input nests too deeply"), sources={filename: text}
        ) from None
    finally:
        _comments.sink = None
    try:
        header, (kind, name, name_span, stmts, end) = _Build(filename).transform(tree)
    except _Dup as err:
        raise ScenarioError(Problem(err.span, err.message), sources={filename: text}) from None
    except RecursionError:
        raise ScenarioError(
            Problem(Span(filename, 1, 1), "input nests too deeply"), sources={filename: text}
        ) from None
    version, version_span = header
    return Doc(filename, text, version, version_span, kind, name, name_span, stmts, sink, end)


def _shown(name: str) -> str:
    """A terminal as a human reads it: the keyword in quotes, or a friendly class name."""
    friendly = {
        "IDENT": "a name",
        "INT": "an integer",
        "FLOAT": "a number",
        "DURATION": "a duration (30s, 500ms, 2m)",
        "STRING": 'a "string"',
        "$END": "end of file",
    }
    if name in friendly:
        return friendly[name]
    try:
        pattern = parser().get_terminal(name).pattern
    except KeyError:
        return name.lower()
    return repr(pattern.value) if pattern.type == "str" else name.lower()


def _word(name: str) -> str | None:
    try:
        pattern = parser().get_terminal(name).pattern
    except KeyError:
        return None
    return str(pattern.value) if pattern.type == "str" else None


def _found(tok: Token) -> str:
    if tok.type == "$END":
        return "end of file"
    return repr(str(tok))


def _block_of(words: set[str]) -> str | None:
    """Which block's key set the parser was expecting (the keys are all acceptable there)."""
    best, best_n = None, 0
    for block, keys in BLOCK_KEYS.items():
        ks = set(keys)
        if ks <= words and len(ks) > best_n:
            best, best_n = block, len(ks)
    return best


def _syntax_problem(err: UnexpectedInput, text: str, filename: str) -> Problem:
    line, col = max(err.line, 1) if err.line and err.line > 0 else 1, max(err.column, 1) if err.column else 1
    if isinstance(err, UnexpectedCharacters):
        ch = text[err.pos_in_stream] if 0 <= err.pos_in_stream < len(text) else "?"
        hint = "strings need double quotes" if ch == "'" else None
        return Problem(Span(filename, line, col, line, col + 1), f"unexpected character {ch!r}", hint=hint)
    if not isinstance(err, UnexpectedToken):
        return Problem(Span(filename, line, col), "syntax error")
    tok = err.token
    if tok.type == "$END":
        # Lark reports end of input at the last token's position; point after it instead, where the
        # missing text belongs.
        lines = text.splitlines() or [""]
        line, col = len(lines), len(lines[-1]) + 1
    span = Span(filename, line, col, tok.end_line or line, tok.end_column or col + 1)
    accepts = set(err.accepts or err.expected)
    words = {w for w in (_word(a) for a in accepts) if w is not None}
    block = _block_of(words)
    expected_list = sorted(_shown(a) for a in accepts)
    if block is not None and tok.type not in ("$END", "RBRACE"):
        keys = BLOCK_KEYS[block]
        where = "the scenario" if block == TOP_BLOCK else block
        what = "statement" if block == TOP_BLOCK else ("expectation" if block == "expect" else "key")
        close = did_you_mean(str(tok), keys)
        hint = f"did you mean '{close}'?" if close else None
        if tok.type in ("IDENT",) or _word(tok.type) is not None:
            return Problem(
                span, f"unknown {what} {_found(tok)} in {where}", expected=one_of(keys) + " or '}'", hint=hint
            )
    message = f"unexpected {_found(tok)}"
    if tok.type == "$END":
        message = "unexpected end of file"
    hint = None
    if tok.type == "INT" and "DURATION" in accepts:
        hint = "durations need a unit: 30s, 500ms or 2m"
    elif "IDENT" in accepts and tok.type != "IDENT" and _word(tok.type):
        hint = f"'{tok}' is a reserved word; use another name"
    return Problem(span, message, expected=one_of(expected_list), hint=hint)


__all__ = [
    "BLOCK",
    "Call",
    "Comment",
    "Doc",
    "Duration",
    "Ident",
    "Stmt",
    "Tree",
    "quote",
    "read_doc",
    "unquote",
]
