"""The values a scenario statement can hold besides numbers, strings and booleans, and how a value
is shown back to the user. The grammar's transformer makes them (`cptest.lang.syntax`); the semantic
pass and the contracts' validators read them, without knowing the grammar.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Ident(str):
    """A bare word (`triton`, `zigzag`), as opposed to a "string"."""

    __slots__ = ()


@dataclass(frozen=True)
class Duration:
    """A number with a unit (`30s`, `500ms`, `2m`), held in seconds."""

    seconds: float


@dataclass(frozen=True)
class Call:
    """`name(arg, ...)`, e.g. `uniform(1024, 8192)`."""

    name: str
    args: tuple[Any, ...]


def describe(value: Any) -> str:
    """A value as the user wrote it, for a problem's `found`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Duration):
        return f"duration {value.seconds:g}s"
    if isinstance(value, Call):
        return f"{value.name}(...)"
    if isinstance(value, Ident):
        return f"word {str(value)!r}"
    if isinstance(value, str):
        return f'string "{value}"'
    return repr(value)
