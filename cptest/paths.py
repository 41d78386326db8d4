"""Paths in what cptest writes down: named roots, never an absolute path of the machine that wrote it.

An archive must mean the same on another machine and in another checkout.
So the plan names the places it depends on by token — `<models>/llama-0123abcd` for a model in the
model store, `<scenario>/ckpt` for a checkpoint next to the scenario — and a run materialises the
tokens into this machine's directories only in memory, just before it launches (`materialize`).
Everything cptest itself writes into an archive (manifest, runner records, its own log, JUnit, the
report) passes through `portable`, which turns the absolute roots of this run back into tokens:
the archive, the model store, the scenario's folder, the checkout, the Python environment, the
home directory. Engine logs (`logs/*-node*.log`) are the engine's own words and stay verbatim.

The roots of the run in progress are process-wide (`rooted`): a cptest process runs one scenario
at a time (a suite starts one process per scenario), and the writers that need them sit in
layers that know nothing about runs.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

MODELS = "<models>"
"""The model store (`cptest models`): where runs find models by name and tree hash."""
SCENARIO = "<scenario>"
"""The folder of the scenario file the plan was made from."""
ARCHIVE = "<archive>"
CHECKOUT = "<checkout>"
PYTHON = "<python>"
"""`sys.prefix`: the virtual environment or interpreter installation running cptest."""
HOME = "~"

TOKENS = (MODELS, SCENARIO)
"""What a plan may contain and a run must materialise before launching."""

_roots: dict[str, str] = {}


@lru_cache(maxsize=1)
def checkout() -> Path | None:
    """The source checkout cptest runs from (an editable install), or None for an installed package.
    Cached: this file does not move while the process runs, and resolving it costs about 190 us on
    every record written outside a run's `rooted` block (the fidelity client's)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def default_roots() -> dict[str, str]:
    """The roots every cptest process has: the checkout, the Python environment, the home."""
    out = {PYTHON: sys.prefix, HOME: os.path.expanduser("~")}  # read each time: tests move HOME
    if (root := checkout()) is not None:
        out[CHECKOUT] = str(root)
    return out


@contextmanager
def rooted(roots: Mapping[str, Path | str | None]) -> Iterator[None]:
    """Make `roots` (token -> directory; None entries ignored) the roots `portable` rewrites, on top
    of `default_roots()`, for the duration of the block."""
    global _roots
    saved = _roots
    _roots = {**default_roots(), **{k: str(Path(v).resolve()) for k, v in roots.items() if v}}
    try:
        yield
    finally:
        _roots = saved


def current_roots() -> dict[str, str]:
    return dict(_roots or default_roots())


@lru_cache(maxsize=16)
def _pattern(root_paths: frozenset[str]) -> re.Pattern[str] | None:
    # Built once per set of roots: every runner record passes through `portable`.
    # Longest first, so that the archive inside the checkout is named as the archive. A root matches
    # only as a whole path component: `/work/main` must not eat `/work/mainline`.
    paths = sorted({p for p in root_paths if p and p != "/"}, key=len, reverse=True)
    if not paths:
        return None
    return re.compile("(" + "|".join(re.escape(p) for p in paths) + r")(?=[/\"'\s:,;)\]}]|$)")


def portable(text: str, roots: Mapping[str, str] | None = None) -> str:
    """`text` with every absolute root of this run replaced by its token."""
    roots = current_roots() if roots is None else dict(roots)
    root_paths = frozenset(roots.values())
    pattern = _pattern(root_paths)
    # Most texts hold no root at all (a request's result, a step's record): a substring test per
    # root is ~1 us where the regex scan was ~70 us on a 6.5 KB result line, and the workload
    # driver writes one on its event loop as each request ends.
    if pattern is None or "/" not in text or not any(p in text for p in root_paths if p and p != "/"):
        return text
    by_path: dict[str, str] = {}
    for token, path in roots.items():
        by_path.setdefault(path, token)
    return pattern.sub(lambda m: by_path[m.group(1)], text)


def portable_value(value: object, roots: Mapping[str, str] | None = None) -> object:
    """`portable` applied to every string inside a JSON-like value."""
    if isinstance(value, str):
        return portable(value, roots)
    if isinstance(value, dict):
        return {k: portable_value(v, roots) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [portable_value(v, roots) for v in value]
    return value


def materialize(text: str, roots: Mapping[str, Path | str]) -> str:
    """`text` with a leading token (`<models>/x`) replaced by its directory on this machine.
    Raises KeyError naming the token when `roots` does not give it."""
    for token in TOKENS:
        if text == token:
            return str(roots[token])
        if text.startswith(token + "/"):
            return os.path.join(str(roots[token]), text[len(token) + 1:])
    return text


def is_tokenized(text: str) -> bool:
    return any(text == t or text.startswith(t + "/") for t in TOKENS)
