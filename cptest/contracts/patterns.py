"""Regular expressions a scenario writes (`log contains/absent "..."`, `launch rejected matching
"..."`), compiled and searched with a time limit.

A scenario's pattern is searched in engine logs of any size. Python's `re` backtracks without
bound: `(a+)+$` against a long line of `a`s never finishes, and a check would hang. The `regex`
module (mrab-regex, the engine `re` was once to be replaced with) takes a `timeout` per call and
raises `TimeoutError` when it is exceeded, and it accepts `re`'s syntax (its VERSION0 mode), so
every pattern written so far means what it meant. A search that times out is not a match and not
a non-match: the checker says `unknown`, with the pattern and the limit.
"""

from __future__ import annotations

import functools

import regex

SEARCH_TIMEOUT_S = 2.0
"""CPU time one search of one log may take (the regex module counts the process's CPU time, so a
loaded machine stretches the wall clock, not the verdict). A whole engine log is a few MB: a sane
pattern needs milliseconds."""
MAX_PATTERN_CHARS = 4096
"""Longest pattern a scenario may write."""


class PatternTimeout(Exception):
    """A search ran out of time: the pattern backtracks catastrophically on this text."""

    def __init__(self, pattern: str, timeout_s: float):
        super().__init__(f"the pattern {pattern!r} did not finish within {timeout_s:g} s of CPU time "
                         "(catastrophic backtracking?); rewrite it without nested repeats")
        self.pattern = pattern
        self.timeout_s = timeout_s


def check(pattern: str) -> str | None:
    """None when `pattern` is acceptable, else what is wrong with it (too long, does not compile)."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"regular expression of {len(pattern)} characters is too long (at most {MAX_PATTERN_CHARS})"
    try:
        compiled(pattern)
    except (regex.error, OverflowError, RecursionError, ValueError) as err:
        return f"invalid regular expression: {err}"
    return None


@functools.lru_cache(maxsize=256)
def compiled(pattern: str) -> regex.Pattern[str]:
    """`pattern` compiled as `re` would read it (VERSION0), multi-line. Raises `regex.error`."""
    return regex.compile(pattern, regex.MULTILINE | regex.VERSION0)


def search(pattern: str, text: str, timeout_s: float = SEARCH_TIMEOUT_S) -> regex.Match[str] | None:
    """The first match of `pattern` in `text`, or None. Raises `PatternTimeout` past `timeout_s`."""
    try:
        return compiled(pattern).search(text, timeout=timeout_s)
    except TimeoutError:
        raise PatternTimeout(pattern, timeout_s) from None
