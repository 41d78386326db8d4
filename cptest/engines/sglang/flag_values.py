"""Whether one scenario value is what an SGLang flag takes: the value types of the flag tables.

`flags-<release>.json` gives each flag the type of one value (`type`), mapped from the converter
SGLang's own argparse declares (`tools/extract_sglang_flags.py`, `VALUE_TYPES`). Each type here
accepts the strings that converter accepts, so a value cptest passes is one SGLang parses as a value
of that flag, and one SGLang would refuse is refused at the scenario's statement instead of by a
launcher on the GPU machine. Pure functions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cptest.errors import one_of

INVALID: Any = object()
"""What a converter returns for a text that is not a value of its type."""


def _int(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return INVALID


def _float(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return INVALID


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return INVALID


def _json_object(text: str) -> Any:
    value = _json(text)
    return value if isinstance(value, dict) else INVALID


# sglang/srt/utils/common.py `human_readable_int`: an integer, or a number with an SI suffix (decimals
# allowed) or an IEC suffix (integers only); suffixes are case-sensitive.
_SIZE = re.compile(r"\d+(?:\.\d+)?(?:k|M|G|T)|\d+(?:Ki|Mi|Gi|Ti)")


def _size(text: str) -> Any:
    return text if _SIZE.fullmatch(text.strip()) else _int(text.strip())


VALUE_TYPES: Mapping[str, tuple[str, Callable[[str], Any]]] = {
    "str": ("a string", lambda text: text),
    "int": ("an integer", _int),
    "float": ("a number", _float),
    "json": ("JSON", _json),
    "json-object": ("a JSON object", _json_object),
    "size": ("an integer, optionally with a suffix (1k, 1M, 1Ki)", _size),
}
"""Type name -> (what it is, in words; its converter, which returns `INVALID` for a non-value)."""


def value_problem(flag: str, entry: Mapping[str, Any], text: str) -> str | None:
    """Why `text` cannot be a value of `flag` (its table `entry`); None when it can."""
    type_name = entry.get("type") or "str"
    if type_name not in VALUE_TYPES:
        return f"{flag}: cptest cannot check a value of SGLang's type {type_name!r}, so it passes none"
    what, convert = VALUE_TYPES[type_name]
    value = convert(text)
    if value is INVALID:
        return f"{flag}: {text!r} is not {what}"
    choices: Sequence[Any] | None = entry.get("choices")
    if choices is not None and value not in choices and text not in [str(c) for c in choices]:
        return f"{flag} {text}: expected {one_of(str(c) for c in choices)}"
    return None


__all__ = ["INVALID", "VALUE_TYPES", "value_problem"]
