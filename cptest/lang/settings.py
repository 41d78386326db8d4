"""Typed access to a scenario's merged statements: each setting checked against its entry in
`cptest.lang.tables.SETTINGS` (type, range, choices, distribution), a problem added for every bad
value, and the helpers the statement checks share (building a node, a missing block)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from cptest.errors import Problem, ProblemCollector, Span, did_you_mean, one_of
from cptest.lang import tables as T
from cptest.lang.syntax import Stmt
from cptest.scenario import Dist
from cptest.values import Call, Duration, describe

MISSING: Any = object()
"""What a check returns for a value it refused (its problem is already added)."""


class Values:
    """Typed access to the merged statements, adding a problem for every bad value."""

    def __init__(self, stmts: list[Stmt], p: ProblemCollector):
        self.p = p
        self.one: dict[tuple[str, str], Stmt] = {}
        self.many: dict[tuple[str, str], list[Stmt]] = {}
        for s in stmts:
            if (s.block, s.key) in T.LIST_KEYS:
                self.many.setdefault((s.block, s.key), []).append(s)
            else:
                self.one[(s.block, s.key)] = s

    def stmt(self, block: str, key: str) -> Stmt | None:
        return self.one.get((block, key))

    def block(self, block: str, spec_block: str | None = None) -> tuple[dict[str, Any], dict[str, Span]]:
        """Every setting of `block` checked against SETTINGS: (field -> value, field -> span)."""
        specs = T.SETTINGS[spec_block or block]
        values: dict[str, Any] = {}
        spans: dict[str, Span] = {}
        for (b, key), s in self.one.items():
            if b != block or key not in specs:
                continue
            spec = specs[key]
            v = self.check(s, key, spec)
            if v is not MISSING:
                values[spec.field] = v
                spans[spec.field] = s.span
        return values, spans

    def check(self, s: Stmt, key: str, spec: T.Setting) -> Any:
        v = s.value
        kind = spec.kind
        if kind == "int":
            if isinstance(v, bool) or not isinstance(v, int):
                return self._bad(s, key, "an integer", v)
            return self._range(s, key, v, spec)
        if kind == "float":
            if isinstance(v, bool) or not isinstance(v, int | float):
                return self._bad(s, key, "a number", v)
            return self._range(s, key, float(v), spec)
        if kind == "bool":
            if not isinstance(v, bool):
                return self._bad(s, key, "true or false", v)
            return v
        if kind == "duration":
            if isinstance(v, int | float) and not isinstance(v, bool):
                self.p.add(
                    s.span, f"{key} needs a unit", expected=f"a duration such as {v}s or {v}ms", found=repr(v)
                )
                return MISSING
            if not isinstance(v, Duration):
                return self._bad(s, key, "a duration (30s, 500ms, 2m)", v)
            return self._range(s, key, v.seconds, spec)
        if kind == "word":
            if not isinstance(v, str) or str(v) not in spec.choices:
                close = did_you_mean(str(v), spec.choices) if isinstance(v, str) else None
                self.p.add(
                    s.span,
                    f"invalid {key}",
                    expected=one_of(spec.choices),
                    found=describe(v),
                    hint=f"did you mean '{close}'?" if close else None,
                )
                return MISSING
            return str(v)
        if kind == "text":
            if not isinstance(v, str):
                return self._bad(s, key, "a name or a string", v)
            return str(v)
        if kind == "dist":
            return self._dist(s, key, v, spec)
        raise AssertionError(kind)

    def _bad(self, s: Stmt, key: str, expected: str, v: Any) -> Any:
        self.p.add(s.span, f"wrong type for {key}", expected=expected, found=describe(v))
        return MISSING

    def _range(self, s: Stmt, key: str, v: float, spec: T.Setting) -> Any:
        lo_ok = spec.min is None or (v > spec.min if spec.min_exclusive else v >= spec.min)
        hi_ok = spec.max is None or v <= spec.max
        if lo_ok and hi_ok:
            return v
        op = ">" if spec.min_exclusive else ">="
        lo = "" if spec.min is None else f"{op} {_num(spec.min)}"
        hi = "" if spec.max is None else f"<= {_num(spec.max)}"
        self.p.add(
            s.span,
            f"{key} is out of range",
            expected=" and ".join(x for x in (lo, hi) if x),
            found=f"{v:g}" if isinstance(v, float) else str(v),
        )
        return MISSING

    def _dist(self, s: Stmt, key: str, v: Any, spec: T.Setting) -> Any:
        lo = int(spec.min or 1)
        hi = int(spec.max) if spec.max is not None else None
        if isinstance(v, int) and not isinstance(v, bool):
            if v < lo or (hi is not None and v > hi):
                self.p.add(s.span, f"{key} is out of range",
                           expected=f">= {lo}" + (f" and <= {hi}" if hi is not None else ""), found=str(v))
                return MISSING
            return Dist(kind="fixed", n=v, span=s.span)
        if not isinstance(v, Call):
            return self._bad(s, key, "a token count: 128, uniform(lo, hi) or choice(a, b, ...)", v)
        if v.name not in T.DIST_FUNCS:
            unknown_word(self.p, s.span, f"unknown distribution {v.name!r} for {key}", v.name, T.DIST_FUNCS)
            return MISSING
        if not all(isinstance(a, int) and not isinstance(a, bool) for a in v.args):
            self.p.add(
                s.span, f"{v.name}() takes integer token counts", found=", ".join(map(describe, v.args))
            )
            return MISSING
        args = list(v.args)
        if len(args) > T.MAX_CHOICES:
            self.p.add(s.span, f"{v.name}() has {len(args)} values", expected=f"at most {T.MAX_CHOICES}")
            return MISSING
        if any(a < lo or (hi is not None and a > hi) for a in args):
            self.p.add(
                s.span,
                f"{key} is out of range",
                expected=f"token counts >= {lo}" + (f" and <= {hi}" if hi is not None else ""),
                found=", ".join(map(str, args)),
            )
            return MISSING
        if v.name == "uniform":
            if len(args) != 2:
                self.p.add(
                    s.span,
                    "uniform() takes two bounds",
                    expected="uniform(lo, hi)",
                    found=f"{len(args)} arguments",
                )
                return MISSING
            if args[0] > args[1]:
                self.p.add(s.span, f"uniform({args[0]}, {args[1]}) has lo > hi", expected="lo <= hi")
                return MISSING
            return Dist(kind="uniform", lo=args[0], hi=args[1], span=s.span)
        if not args:
            self.p.add(s.span, "choice() needs at least one value", expected="choice(a, b, ...)")
            return MISSING
        return Dist(kind="choice", choices=args, span=s.span)


def _num(x: float) -> str:
    """A bound as the user would write it: integers in full (9223372036854775807), else `:g`."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e20 else f"{x:g}"


def pydantic_problem(err: ValidationError, where: Span) -> Problem:
    """A pydantic complaint the checks did not foresee, as the stage's own problem at `where`."""
    first = err.errors()[0]
    loc = ".".join(str(x) for x in first.get("loc", ()))
    return Problem(where, f"invalid value for {loc}: {first.get('msg', 'invalid')}")


def node(cls: Any, p: ProblemCollector, span: Span | None, **kw: Any) -> Any:
    """`cls(span=span, **kw)`, or None with a problem added when pydantic refuses it."""
    try:
        return cls(span=span, **kw)
    except ValidationError as err:
        p.problems.append(pydantic_problem(err, span or Span("<input>", 1, 1)))
        return None


def unknown_word(p: ProblemCollector, span: Span, message: str, word: str, choices: Iterable[str]) -> None:
    """A word that is none of `choices`: `message` at `span`, naming the choices and the closest one."""
    close = did_you_mean(word, choices)
    p.add(span, message, expected=one_of(choices), hint=f"did you mean '{close}'?" if close else None)


def missing_block(v: Values, name: str, where: Span) -> None:
    v.p.add(where, f"the scenario has no {name}", hint=f"add a `{name}` statement (docs/language.md)")


def was_written(v: Values, block: str, key: str) -> bool:
    """Whether `block` sets `key` at all (a refused value was written: its problem is enough)."""
    return (block, key) in v.one
