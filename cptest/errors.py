"""One error hierarchy for every stage, with source positions.

Each stage raises its own type (`ScenarioError`, `PlanError`, `RunError`, `EvidenceError`), all
under `CptestError`. An error carries structured entries (`Problem`: span, message, expected,
found, hint) beside its rendered text, so that a whole file's problems can be reported at once
and tests can assert on fields instead of strings. Raw Lark, pydantic or Docker exceptions are
converted at the stage boundary and never reach the user.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

MAX_SHOWN = 20
"""How many problems of one file are rendered before "... and K more"."""


@dataclass(frozen=True, order=True)
class Span:
    """Where a node came from: 1-based line and column, end exclusive."""

    file: str
    line: int
    col: int
    end_line: int = 0
    end_col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: where, what, what was expected, what to do next."""

    span: Span | None
    message: str
    expected: str | None = None
    found: str | None = None
    hint: str | None = None

    def sort_key(self) -> tuple:
        s = self.span
        return (s.file, s.line, s.col) if s else ("", 0, 0)


class CptestError(Exception):
    """Base of every error cptest reports to a user. `exit_code` is what the CLI returns."""

    exit_code = 2

    def __init__(self, problems: Problem | str | Sequence[Problem], *, sources: dict[str, str] | None = None):
        if isinstance(problems, str):
            problems = [Problem(None, problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = sorted(problems, key=Problem.sort_key)
        self.sources = dict(sources or {})
        super().__init__(self.render())

    def render(self) -> str:
        shown = self.problems[:MAX_SHOWN]
        parts = [render_problem(p, self.sources.get(p.span.file) if p.span else None) for p in shown]
        rest = len(self.problems) - len(shown)
        if rest > 0:
            parts.append(f"... and {rest} more")
        return "\n".join(parts)


class ScenarioError(CptestError):
    """A scenario file (or a file it includes) is malformed or impossible. Exit code 2."""


class PlanError(CptestError):
    """A valid scenario cannot be turned into a plan (e.g. unknown engine release). Exit code 2."""


class RunError(CptestError):
    """Infrastructure failed while running (launcher, container engine, GPU). Exit code 3."""

    exit_code = 3


class EvidenceError(CptestError):
    """An archive or evidence file is unreadable or does not match its hashes. Exit code 3."""

    exit_code = 3


def render_problem(problem: Problem, source: str | None) -> str:
    """`file:line:col: message`, the source line with a caret, then expected / found / hint."""
    head = f"{problem.span}: {problem.message}" if problem.span else problem.message
    lines = [head]
    if problem.span and source is not None:
        text_lines = source.splitlines() or [""]
        idx = min(max(problem.span.line, 1), len(text_lines)) - 1
        raw = text_lines[idx]
        # Expand tabs in the prefix too: the line is shown tab-expanded, so a caret counted in
        # characters would drift left of the column it names.
        pad = len(raw[: max(problem.span.col - 1, 0)].expandtabs())
        width = 1
        if problem.span.end_line == problem.span.line and problem.span.end_col > problem.span.col:
            width = len(raw[problem.span.col - 1 : problem.span.end_col - 1].expandtabs()) or 1
        lines.append(f"  {raw.expandtabs()}")
        lines.append(f"  {' ' * pad}{'^' * width}")
    if problem.expected:
        lines.append(f"  expected: {problem.expected}")
    if problem.found:
        lines.append(f"  found: {problem.found}")
    if problem.hint:
        lines.append(f"  hint: {problem.hint}")
    return "\n".join(lines)


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """The closest known spelling of `word`, or None when nothing is close."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def one_of(choices: Iterable[str]) -> str:
    """Human list of valid values: `a, b or c`."""
    items = [str(c) for c in choices]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]


@dataclass
class ProblemCollector:
    """Collects problems of one stage so that all are reported together, sorted by position."""

    problems: list[Problem] = field(default_factory=list)

    def add(self, span: Span | None, message: str, **kw: str | None) -> None:
        self.problems.append(Problem(span, message, **kw))

    def raise_if_any(self, error_type: type[CptestError], sources: dict[str, str] | None = None) -> None:
        if self.problems:
            raise error_type(self.problems, sources=sources)
