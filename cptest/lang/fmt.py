"""Canonical text of a `.cps` file: `cptest fmt`.

Contract: `format_text(format_text(x)) == format_text(x)` and `parse(format_text(x)) == parse(x)`
for every file that parses.  The formatter works on one file's statements as written (it does not
follow `extends` or check meaning), so it also formats defaults files and files whose model is not
generated yet.  It raises ScenarioError only for syntax errors.

Canonical form: fixed statement order (tables.BLOCK_KEYS / EXPECT_ORDER; repeated statements such as
faults keep their source order), fixed key order inside blocks, 2-space indent, one setting per
line, normalised numbers and durations (whole seconds as `30s`, fractions as `500ms`).  Comments are
kept: a comment on the line where a statement starts stays at its end; other comments move with the
statement that follows them, or stay before the closing brace of their block.
"""

from __future__ import annotations

import decimal
from dataclasses import dataclass, field
from typing import Any

from cptest.contracts import CONTRACTS
from cptest.lang import tables as T
from cptest.lang.syntax import BLOCK, Comment, Doc, Stmt, quote, read_doc
from cptest.values import Call, Duration, Ident

INDENT = "  "


def format_text(text: str, filename: str = "<input>") -> str:
    """The canonical form of `text`. Raises ScenarioError if it does not parse."""
    return format_doc(read_doc(text, filename, keep_comments=True))


# ---------------------------------------------------------------------------------------- values


def render_value(v: Any) -> str:
    """One value in canonical spelling (the inverse of the parser's value rules)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Ident):
        return str(v)
    if isinstance(v, str):
        return quote(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, Duration):
        return render_duration(v.seconds)
    if isinstance(v, Call):
        return f"{v.name}({', '.join(render_value(a) for a in v.args)})"
    raise TypeError(f"no canonical spelling for {v!r}")


def _plain(x: float) -> str:
    # Shortest round-tripping decimal, without an exponent (the DURATION token has none).
    text = format(decimal.Decimal(repr(x)), "f")
    return text[:-2] if text.endswith(".0") else text


def render_duration(seconds: float) -> str:
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    ms = seconds * 1000.0
    if float(ms).is_integer() and int(ms) / 1000.0 == seconds:
        return f"{int(ms)}ms"
    return f"{_plain(seconds)}s"


# ---------------------------------------------------------------------------------------- tree


@dataclass
class _Node:
    stmt: Stmt | None
    children: list[_Node] = field(default_factory=list)
    leading: list[str] = field(default_factory=list)
    trailing: str | None = None
    closing: list[str] = field(default_factory=list)


def _start(s: Stmt) -> tuple[int, int]:
    return (s.span.line, s.span.col)


def _contains(outer: Stmt, line: int, col: int) -> bool:
    return _start(outer) < (line, col) < (outer.span.end_line, outer.span.end_col)


def _can_contain(s: Stmt) -> bool:
    return s.value is BLOCK or (s.block, s.key) in (("", "model"), ("workload", "sampling"))


def _tree(doc: Doc) -> tuple[_Node, list[str], list[str]]:
    """Statements nested by position, with comments attached. Returns (root, before, after)."""
    stmts = [s for s in doc.stmts if s.key != "model {"]
    nodes = {id(s): _Node(s) for s in stmts}
    root = _Node(None)
    containers = [s for s in stmts if _can_contain(s)]

    def parent_of(line: int, col: int, exclude: Stmt | None = None) -> _Node:
        best: Stmt | None = None
        for s in containers:
            if s is exclude or not _contains(s, line, col):
                continue
            if best is None or _start(s) > _start(best):
                best = s
        return nodes[id(best)] if best is not None else root

    for s in stmts:
        parent_of(s.span.line, s.span.col, exclude=s).children.append(nodes[id(s)])
    body_start = (doc.name_span.line, doc.name_span.col)
    body_end = (doc.end.line, doc.end.col)
    before: list[str] = []
    after: list[str] = []
    for c in doc.comments:
        at = (c.line, c.col)
        if at < body_start:
            before.append(c.text)
            continue
        if c.line == doc.name_span.line and root.trailing is None:
            root.trailing = c.text  # on the `scenario NAME {` line
            continue
        if at > body_end:
            after.append(c.text)
            continue
        owner = _trailing_owner(stmts, c)
        if owner is not None and nodes[id(owner)].trailing is None:
            nodes[id(owner)].trailing = c.text
            continue
        container = parent_of(c.line, c.col)
        following = [n for n in container.children if n.stmt is not None and _start(n.stmt) > at]
        if following:
            min(following, key=lambda n: _start(n.stmt)).leading.append(c.text)  # type: ignore[arg-type]
        else:
            container.closing.append(c.text)
    return root, before, after


def _trailing_owner(stmts: list[Stmt], c: Comment) -> Stmt | None:
    """The last statement whose first line ends on the comment's line before the comment."""
    owner: Stmt | None = None
    for s in stmts:
        on_line = s.head.end_line == c.line and _start(s) < (c.line, c.col)
        if on_line and (owner is None or _start(s) > _start(owner)):
            owner = s
    return owner


# ---------------------------------------------------------------------------------------- order


def _order(node: _Node, block: str) -> list[_Node]:
    if block == "expect":
        keys: tuple[str, ...] = T.EXPECT_ORDER
    else:
        keys = T.BLOCK_KEYS.get(block, ())
    rank = {k: i for i, k in enumerate(keys)}
    return sorted(node.children, key=lambda n: rank.get(n.stmt.key if n.stmt else "", len(rank)))


def _child_block(s: Stmt) -> str:
    """Name of the block a container statement opens (for ordering its children)."""
    if s.key == "model":
        return "model"
    if s.block == "workload" and s.key == "sampling":
        return "sampling"
    return s.key


# ---------------------------------------------------------------------------------------- render


def _head(s: Stmt) -> str:
    v = s.value
    if v is BLOCK:
        return f"{s.key} {{"
    if s.block == "":
        if s.key in ("description", "exclusive", "unsafe", "extends"):
            return f"{s.key} {quote(v)}"
        if s.key == "engine":
            out = f"engine {v['kind']}"
            if v["release"] is not None:
                out += f" {quote(v['release'])}"
            if v["image"] is not None:
                out += f" image {quote(v['image'])}"
            return out
        if s.key == "model":
            out = f"model {v['kind']}"
            if v["arg"] is not None:
                out += f" {render_value(v['arg'])}"
            for opt in ("revision", "sha256"):
                if opt in v:
                    out += f" {opt} {quote(v[opt])}"
            return out
        if s.key == "baseline":
            return f"baseline {v}"
        if s.key == "fault":
            return _fault(v)
    if s.block == "serve" and s.key == "flag":
        return "flag " + " ".join(quote(x) for x in v)
    if s.block == "serve" and s.key == "env":
        return f"env {quote(v[0])} {quote(v[1])}"
    if s.block == "workload" and s.key == "sampling":
        return f"sampling {v}"
    if s.block == "workload" and s.key == "source":
        kind, path = v
        return f"source {kind}" + (f" {quote(path)}" if path is not None else "")
    if s.block == "expect":
        return _expectation(s.key, v)
    return f"{s.key} {render_value(v)}"


def _fault(v: dict[str, Any]) -> str:
    out = f"fault {v['action']} " + (f"rank {v['rank']}" if v["target"] == "rank" else "server")
    if "after_requests" in v:
        out += f" after {v['after_requests']} requests"
    elif "after_decode_steps" in v:
        out += f" after {v['after_decode_steps']} decode_steps"
    else:
        out += f" at {render_value(v['at'])}"
    if v["for"] is not None:
        out += f" for {render_value(v['for'])}"
    return out


def _expectation(key: str, v: dict[str, Any]) -> str:
    body = CONTRACTS[T.contract_of(key)].syntax.write(key, v, render_value)
    if v.get("violated"):
        on = v.get("violated_on")
        scope = ""
        if on:
            scope = f" on {on[0]}" + (f" {quote(on[1])}" if on[1] is not None else "")
        return f"violated {body}{scope} because {quote(v['because'])}"
    return body


def _emit(node: _Node, depth: int, out: list[str], block: str, top: bool = False) -> None:
    pad = INDENT * depth
    first = True
    for child in _order(node, block):
        s = child.stmt
        assert s is not None
        if top and child.leading and not first:
            out.append("")
        first = False
        out.extend(pad + c for c in child.leading)
        head = _head(s)
        opens = s.value is BLOCK or bool(child.children) or bool(child.closing)
        if opens and s.value is not BLOCK:
            head += " {"
        trailing = f"  {child.trailing}" if child.trailing else ""
        if opens and not child.children and not child.closing:
            out.append(f"{pad}{head}}}{trailing}")
            continue
        out.append(f"{pad}{head}{trailing}")
        if opens:
            _emit(child, depth + 1, out, _child_block(s))
            out.append(pad + "}")
    out.extend(INDENT * depth + c for c in node.closing)


def format_doc(doc: Doc) -> str:
    root, before, after = _tree(doc)
    out: list[str] = list(before)
    out.append(f"cptest {doc.version}")
    opener = f"scenario {doc.name} {{" if doc.kind == "scenario" else "defaults {"
    out.append(opener + (f"  {root.trailing}" if root.trailing else ""))
    _emit(root, 1, out, T.TOP_BLOCK, top=True)
    out.append("}")
    out.extend(after)
    return "\n".join(out) + "\n"
