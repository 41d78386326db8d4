"""Following `extends`: the files of one scenario, loaded parent first and merged (the extending
file wins, see `merge`), with the per-file rules (version header, duplicate statements).

Files are read only through the `Reader` the chain is given; targets outside the scenario tree are
refused (`cptest.lang.includes`). A target that cannot be loaded marks the chain broken: the
problems found later would only be noise.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from cptest.errors import ProblemCollector, ScenarioError, Span
from cptest.lang import tables as T
from cptest.lang.files import Reader, os_reason
from cptest.lang.includes import include_problem
from cptest.lang.syntax import BLOCK, Doc, Stmt, read_doc

LANGUAGE_VERSION = 1


class Chain:
    """The files of one scenario: their texts (for carets) and directories (for relative paths)."""

    def __init__(self, read: Reader, probe_dir: Callable[[str], bool], roots: tuple[str, ...]):
        self.read = read
        self.roots = roots
        """Where extends targets may lie (`cptest.lang.includes`)."""
        self.is_dir = probe_dir
        self.sources: dict[str, str] = {}
        self.dirs: dict[str, str] = {}
        self.problems = ProblemCollector()
        self.includes: list[str] = []
        self.broken = False
        """An extends target could not be loaded: later problems would only be noise."""

    def dir_of(self, span: Span | None) -> str:
        return self.dirs.get(span.file, os.getcwd()) if span else os.getcwd()


def _check_doc(doc: Doc, chain: Chain) -> None:
    """Per-file rules: version header, duplicates (reported at the second occurrence)."""
    p = chain.problems
    if doc.version != LANGUAGE_VERSION:
        p.add(
            doc.version_span,
            f"unsupported language version {doc.version}",
            expected=f"cptest {LANGUAGE_VERSION}",
        )
    seen: dict[tuple[str, str], Stmt] = {}
    for s in doc.stmts:
        slot = (s.block, s.key)
        if slot in T.LIST_KEYS or s.key == "model {":
            continue
        first = seen.get(slot)
        if first is None:
            seen[slot] = s
            continue
        what = (
            f"{s.key} block" if s.value is BLOCK else (f"'{s.key}'" + (f" in {s.block}" if s.block else ""))
        )
        p.add(s.span, f"duplicate {what} (first at line {first.span.line})", hint="merge the two into one")


def load_chain(doc: Doc, chain: Chain, base_dir: str, stack: list[str]) -> list[Stmt]:
    """Statements of `doc` with its extends chain merged in (parents first)."""
    chain.sources[doc.filename] = doc.text
    chain.dirs[doc.filename] = base_dir
    _check_doc(doc, chain)
    ext = [s for s in doc.stmts if s.block == "" and s.key == "extends"]
    own = [s for s in doc.stmts if not (s.block == "" and s.key == "extends")]
    if not ext:
        return own
    stmt = ext[0]
    path = os.path.normpath(os.path.join(base_dir, stmt.value))
    if path in stack:
        cycle = " -> ".join(os.path.basename(x) for x in [*stack[stack.index(path) :], path])
        chain.problems.add(stmt.span, f"extends cycle: {cycle}")
        chain.broken = True
        return own
    refused = include_problem(str(stmt.value), path, chain.roots)
    if refused is not None:
        chain.problems.add(stmt.span, refused[0], hint=refused[1])
        chain.broken = True
        return own
    try:
        text = chain.read(path)
    except (OSError, UnicodeDecodeError) as err:
        chain.problems.add(
            stmt.span,
            f"cannot read extended file {stmt.value!r}: {os_reason(err)}",
            hint=f"paths are relative to {base_dir or '.'}",
        )
        chain.broken = True
        return own
    try:
        parent = read_doc(text, path)
    except ScenarioError as err:
        chain.problems.problems.extend(err.problems)
        chain.sources.update(err.sources)
        chain.broken = True
        return own
    parent_stmts = load_chain(parent, chain, os.path.dirname(path), [*stack, path])
    chain.includes.append(path)
    return merge(parent_stmts, own)


_UNITS: tuple[tuple[Callable[[Stmt], bool], Callable[[Stmt], bool]], ...] = (
    # (the child has a statement like this, then drop every parent statement like that)
    (
        lambda s: s.block == "" and s.key == "model",
        lambda s: s.block in ("model", "facts") or (s.block == "" and s.key in ("model", "facts", "model {")),
    ),
    (
        lambda s: s.block == "" and s.key == "baseline",
        lambda s: s.block == "baseline" or (s.block == "" and s.key == "baseline"),
    ),
    (
        lambda s: s.block == "workload" and s.key == "sampling",
        lambda s: s.block == "sampling" or (s.block == "workload" and s.key == "sampling"),
    ),
)


def merge(parent: list[Stmt], child: list[Stmt]) -> list[Stmt]:
    """The extends rule: the child's statements win, field by field.

    - `model` (with its geometry and `facts`), `baseline` and `sampling` are units: if the child
      writes one, the parent's whole unit is dropped.
    - Repeating statements (`fault`, `flag`, `log`) are lists: if the child writes any, it replaces
      the parent's whole list.
    - Everything else (block settings, expectations, `engine`, `description`) merges key by key.
    """
    drop: list[Callable[[Stmt], bool]] = []
    for has, unit in _UNITS:
        if any(has(s) for s in child):
            drop.append(unit)
    slots = {(s.block, s.key) for s in child if s.value is not BLOCK}
    openers = {s.key for s in child if s.value is BLOCK}
    kept = [
        s
        for s in parent
        if not any(d(s) for d in drop)
        and (s.block, s.key) not in slots
        and not (s.value is BLOCK and s.key in openers)
    ]
    return kept + child
