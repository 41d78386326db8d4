"""What every contract module shares: the declared and resolved bases, the planning context, the
validation vocabulary, and the `Contract` record the registry lists.

A contract module (`cptest/contracts/<name>.py`) defines, once:
- `<Name>Expect(Declared)`: the expectation as the scenario declares it (a scenario node, with
  positions); its validators say what is wrong with a statement, in the user's words;
- `<Name>Params(Params)`: the same expectation resolved against the plan, with every figure its
  checker needs (what `plan.json` stores, discriminated by `kind`);
- `resolve(expect, ctx) -> Params` (pure, at plan time) and `check(evidence, params) -> Verdict`
  (pure, at check time);
- its `Syntax`: which grammar rules of `lang/cps.lark` are its statements, how each is read into the
  expectation's raw values, and how the formatter writes it back;
- `CONTRACT = Contract(...)`: the registry (`cptest.contracts`) finds it there, by importing every
  module of the package, and everything that lists contracts derives from it (the verdict order,
  the scenario's `expect` model, the plan's `Expectation` union, the language's key tables, the
  formatter, the report's checker order).
Adding a contract is: its grammar rule in `lang/cps.lark`, one such module, and its tests.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from cptest.errors import did_you_mean, one_of
from cptest.evidence import Evidence
from cptest.node import Node
from cptest.topology import Degrees, KvHeadsRule
from cptest.values import describe
from cptest.verdict import Verdict

Role = Literal["main", "baseline", "control", "eager"]
ENGINE_NAMES = ("sglang", "reference")


class Declared(Node):
    """An expectation as written. `violated`: the scenario declares the contract broken (a no-go
    is the expected, valid result), `because` says why, `violated_on` on which engine and release
    (written `on sglang "<release>"`; the scenario's own engine and release when not written): on any
    other engine or release the contract is expected to hold."""

    violated: bool = False
    because: str | None = None
    violated_on: tuple[str, str | None] | None = Field(default=None, exclude_if=lambda v: v is None)

    @field_validator("violated_on")
    @classmethod
    def _known_engine(cls, v: tuple[str, str | None] | None) -> tuple[str, str | None] | None:
        if v is not None and v[0] not in ENGINE_NAMES:
            close = did_you_mean(v[0], ENGINE_NAMES)
            raise PydanticCustomError("cptest", "unknown engine {found}",
                                      {"found": repr(v[0]), "expected": one_of(ENGINE_NAMES),
                                       "hint": f"did you mean '{close}'?" if close else None})
        return v

    def violation_applies(self, engine: str, release: str) -> bool:
        """Whether the declared violation is expected on `engine` at `release`."""
        if not self.violated:
            return False
        if self.violated_on is None:
            return True
        want_engine, want_release = self.violated_on
        return want_engine == engine and (want_release is None or want_release == release)


class Params(BaseModel):
    """An expectation resolved by the plan: what its checker judges the evidence with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str
    role: Role = "main"
    """Which server's evidence is judged."""
    expect_violation: bool = False
    """The scenario declares this contract broken on this engine and release: an observed
    violation passes."""
    violated_on: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """Where the scenario declares the contract broken (`sglang <release>`), when it does; with
    `expect_violation` false, the run is elsewhere and the contract is expected to hold."""
    source: str = ""
    """file:line:col of the expectation in the scenario."""


@dataclass(frozen=True)
class EngineFacts:
    """What contracts are judged with that depends on the engine and its release.

    `log_patterns` maps a name to the regular expression a checker applies to each line of the
    engine's log (named groups are the figures): `kv_allocated` (printed per rank: `tp`, `tokens`),
    `max_total_num_tokens` (`tokens`). A name the engine does not print is absent, and the checker
    lists that surface as not seen. Exit statuses are None where the engine documents none.
    """

    release: str
    log_patterns: Mapping[str, str] = field(default_factory=dict)
    sigterm_exit_statuses: frozenset[int] | None = None
    rank_kill_exit_statuses: frozenset[int] | None = None
    kv_heads_rule: KvHeadsRule = "attn_tp"
    max_total_tokens_per_rank: bool = True
    """`--max-total-tokens` caps each rank's pool rows and the logical capacity is rows x dcp (the pinned
    SGLang release, docs/sglang.md §4.2: 65,536 rows per rank and 131,072 slots at TP2/DCP2); False: the flag
    is the logical capacity itself (the reference engine, `cptest.reference.server.pool_rows`). What a
    `fill_drain` workload is sized from (`cptest.plan.fill_drain`)."""


@dataclass(frozen=True)
class PlanContext:
    """What an expectation is resolved against: the main server, the workload, the engine."""

    engine: str
    degrees: Degrees
    """The main server's parallel degrees."""
    requests: int
    """How many requests the workload sends."""
    kills_a_rank: bool
    """A fault of the scenario kills a rank (the engine then ends with other exit statuses)."""
    facts: EngineFacts
    split_unobserved: str | None = None
    """Why the probe cannot see the main server's prefill split (the engine's admission says so:
    a split on a path it does not hook); None where it can."""
    cp_v1: bool = False
    """The main server splits prefill rows on a model's own CP-v1 path (the engine's admission says
    so): each rank's rows are its zigzag shard unpadded, and the MoE gather pads them to the longest."""


E = TypeVar("E", bound=Declared)
P = TypeVar("P", bound=Params)


@dataclass(frozen=True)
class Written:
    """One expectation statement as a contract's reader gives it to the language."""

    key: str
    """The statement's key: the contract's name, or one of its `Syntax.keys` (`graph decode`)."""
    value: dict[str, Any]
    """The raw values its `Declared` model validates."""
    parts: Mapping[str, Any] = field(default_factory=dict)
    """Part name -> the token it was written with: where a complaint about that part points."""


class Misread(Exception):
    """A statement a contract's reader refuses as written (a clause given twice): a syntax problem at
    the statement, raised before any value is validated."""


Reader = Callable[[list[Any]], Any]
"""A grammar rule's children -> the statement (`Written`), or for a clause rule the value its
statement's reader receives. Children are in the rule's order: values already read (numbers,
durations, words, strings, a clause's value), named tokens (IDENT, INT, STRING) as `str` with their
position, a STRING's text unquoted; an optional part not written is None."""

Writer = Callable[[str, Mapping[str, Any], Callable[[Any], str]], str]
"""(key, raw values, how a value is spelled) -> the statement's canonical text, without its
`violated` wrapper: what `cptest fmt` prints, and reads back to the same values."""


@dataclass(frozen=True)
class Syntax:
    """How a contract's statements are written."""

    keyword: str
    """The first word of its statements: what the parser lists among the expectations."""
    rules: Mapping[str, Reader]
    """Grammar rule (its `-> alias` in cps.lark) -> reader; a rule no contract reads is the
    language's own."""
    write: Writer
    keys: tuple[str, ...] = ()
    """Its statement keys in canonical order, when they are not just the contract's name: each may
    be written once (`graph decode`, `graph prefill`)."""


@dataclass(frozen=True)
class Contract(Generic[E, P]):
    """One contract family, as the registry lists it."""

    name: str
    order: int
    """Where its verdicts come in a scenario's list (and its statements in a formatted file):
    ascending."""
    expect: type[E]
    params: type[P]
    resolve: Callable[[E, PlanContext], P]
    check: Callable[[Evidence, P], Verdict]
    syntax: Syntax
    repeatable: bool = False
    """A scenario may declare it more than once (graph: once per phase; log: any number)."""
    needs_eager: bool = False
    """Its evidence can only come from eager forwards: the plan disables every graph phase
    (docs/sglang.md, "CUDA graphs": Python hooks never fire on a replay). No contract needs it, as the
    probe records replays as steps; the flag stays for one whose evidence a replay cannot give at all."""
    absence_based: bool = False
    """Its failures can come from an interrupted run by itself (a hung request and an unrecorded exit
    look alike when cptest was killed): in an unfinished run they become unknown."""
    dumped_when_absent: bool = False
    """The scenario's dump writes it as null (or []) when not declared. Only the contracts whose
    absence has always been written keep it: any other is left out of the dump when not declared, so
    that the value (and `scenario_sha256`) of every scenario written before it stays the same."""
    qualifier: str | None = None
    """For a repeatable contract, the field that tells its entries apart in a name
    (`contract[graph:decode]`)."""
    examples: tuple[str, ...] = ()
    """Statements that parse and validate (in a scenario of 8 requests with a baseline): what the
    language's fuzzer writes, and its tests read back."""

    @property
    def keys(self) -> tuple[str, ...]:
        """Its statement keys, in canonical order."""
        return self.syntax.keys or (self.name,)

    @property
    def listed(self) -> bool:
        """Its one statement key may be written any number of times (`log`)."""
        return self.repeatable and not self.syntax.keys


# ------------------------------------------------------------------------------------ validation
# Declared models validate a statement's raw values (what the grammar's transformer gives) in their
# validators and raise `invalid(...)`: `cptest.lang.expect` turns it into a Problem positioned at
# the field's part of the statement (or the statement), with `expected`, `found` and `hint`.
def invalid(message: str, *, expected: str | None = None, found: str | None = None,
            hint: str | None = None) -> PydanticCustomError:
    ctx = {k: v for k, v in {"expected": expected, "found": found, "hint": hint}.items() if v is not None}
    return PydanticCustomError("cptest", message, ctx)


def number(what: str, x: Any, lo: float, hi: float | None = None, *, lo_open: bool = False) -> float | None:
    """`x` as a float within [lo, hi] ((lo, hi] with `lo_open`); None stays None."""
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise invalid(f"wrong type for {what}", expected="a number", found=describe(x))
    if (x <= lo if lo_open else x < lo) or (hi is not None and x > hi):
        rng = (f"> {lo:g}" if lo_open else f">= {lo:g}") + (f" and <= {hi:g}" if hi is not None else "")
        raise invalid(f"{what} is out of range", expected=rng, found=f"{x:g}")
    return float(x)


def regex(pattern: str | None) -> str | None:
    """`pattern` if it compiles as a Python regular expression."""
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as err:
            raise invalid(f"invalid regular expression: {err}", found=pattern) from None
    return pattern


def choice(what: str, value: Any, choices: Collection[str]) -> str:
    """`value` if it is one of `choices`, else 'unknown <what>' with a did-you-mean hint."""
    text = str(value)
    if text not in choices:
        close = did_you_mean(text, choices)
        raise invalid(f"unknown {what} {text!r}", expected=one_of(choices),
                      hint=f"did you mean '{close}'?" if close else None)
    return text
