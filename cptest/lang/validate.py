"""The semantic pass: `Doc`s (one per file of an `extends` chain) -> a typed, checked `Scenario`.

Contract:
- `resolve(doc, base_dir, read)` follows `extends`, merges the chain (the extending file wins, see
  `merge`), checks types, ranges and cross-field rules, reads a local model's `config.json`, and
  returns a `Scenario`.  It collects *all* problems of the chain and raises one `ScenarioError`
  (sorted by position); nothing else escapes.
- It reads files (the extends targets and `config.json`) only through `read`, so tests can give it
  an in-memory file system.  It never touches the network, the clock or processes.
- It does not know SGLang releases or flag tables: unknown releases and the arity and type of a
  pass-through flag's values are the plan stage's business (`cptest.plan.flags`, which `cptest
  validate` runs too). What needs no table is checked here: a flag value that would be read as an
  option, and the safety tables of `cptest.lang.safety`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from cptest.contracts import CONTRACTS, Declared
from cptest.contracts.graph import MODES as GRAPH_MODES
from cptest.errors import ProblemCollector, ScenarioError, Span, did_you_mean, one_of
from cptest.lang import model_ids, safety
from cptest.lang import tables as T
from cptest.lang.includes import include_problem, outside_tree, scenario_roots
from cptest.lang.syntax import BLOCK, Doc, Stmt, read_doc
from cptest.scenario import (
    Baseline,
    Dist,
    Engine,
    Expect,
    Fault,
    Model,
    ModelFacts,
    Sampling,
    Scenario,
    Serve,
    Topology,
    Workload,
    baseline_topology,
)
from cptest.topology import ADMISSION_CODES, layout_problems
from cptest.values import Call, Duration, Ident, describe

LANGUAGE_VERSION = 1
MISSING: Any = object()

Reader = Callable[[str], str]
"""Reads a file's text by path; raises OSError (or UnicodeDecodeError) when it cannot."""


_PSEUDO = ("/proc/", "/sys/", "/dev/")


def read_path(path: str) -> str:
    """A scenario file's text: a regular file of at most `MAX_SCENARIO_BYTES` (never `/dev/zero`, a
    FIFO or a huge file: reading one would never end or exhaust memory). Raises OSError naming why."""
    if "\0" in path:  # open() would raise ValueError
        raise OSError(errno.EINVAL, "a path cannot contain a NUL character")
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer before fstat can refuse it.
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if os.path.realpath(path).startswith(_PSEUDO):
            # procfs and sysfs files stat as regular files but are the kernel's live state
            # (/proc/self/environ is the process environment): never a scenario.
            raise OSError(errno.EINVAL, "a kernel pseudo-file, not a regular file")
        data = fh.read(T.MAX_SCENARIO_BYTES + 1)
    if len(data) > T.MAX_SCENARIO_BYTES:
        raise OSError(errno.EFBIG, f"larger than {T.MAX_SCENARIO_BYTES:,} bytes")
    return data.decode("utf-8")


# ---------------------------------------------------------------------------------------- extends


class _Chain:
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


def _check_doc(doc: Doc, chain: _Chain) -> None:
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


def _load_chain(doc: Doc, chain: _Chain, base_dir: str, stack: list[str]) -> list[Stmt]:
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
            f"cannot read extended file {stmt.value!r}: {_os_reason(err)}",
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
    parent_stmts = _load_chain(parent, chain, os.path.dirname(path), [*stack, path])
    chain.includes.append(path)
    return merge(parent_stmts, own)


def _os_reason(err: BaseException) -> str:
    if isinstance(err, FileNotFoundError):
        return "no such file"
    if isinstance(err, IsADirectoryError):
        return "it is a directory"
    if isinstance(err, UnicodeDecodeError):
        return "not UTF-8 text"
    return getattr(err, "strerror", None) or type(err).__name__


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


# ---------------------------------------------------------------------------------------- values


class _Values:
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
            close = did_you_mean(v.name, T.DIST_FUNCS)
            self.p.add(
                s.span,
                f"unknown distribution {v.name!r} for {key}",
                expected=one_of(T.DIST_FUNCS),
                hint=f"did you mean '{close}'?" if close else None,
            )
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


# ---------------------------------------------------------------------------------------- build


def resolve(
    doc: Doc,
    base_dir: str,
    *,
    read: Reader = read_path,
    is_dir: Callable[[str], bool] = os.path.isdir,
    tree: tuple[str, ...] | None = None,
) -> Scenario:
    """Check `doc` (and what it extends) and build the Scenario. Raises ScenarioError only.

    `tree` is where extends targets and a local model's config.json may lie (real paths), by
    default the scenario tree of `base_dir` (`cptest.lang.includes.scenario_roots`); a `read` that
    confines reads itself (an archive's) may widen it."""
    chain = _Chain(read, is_dir, tree if tree is not None else scenario_roots(base_dir))
    p = chain.problems
    if doc.kind != "scenario":
        p.add(
            doc.name_span,
            "this is a defaults file, not a scenario",
            hint='a scenario uses it with: extends "<this file>"',
        )
    stmts = _load_chain(doc, chain, base_dir, [os.path.normpath(os.path.join(base_dir, doc.filename))])
    if chain.broken:
        raise ScenarioError(p.problems, sources=chain.sources)
    v = _Values(stmts, p)
    # Admission rules SGLang enforces itself are relaxed when the scenario is *about* admission:
    # it expects the launch to be rejected, or declares the launch contract violated.
    launch = v.stmt("expect", "launch")
    about_admission = bool(launch and (not launch.value.get("accepted") or launch.value.get("violated")))
    where = doc.name_span
    _check_sizes(v, stmts)
    engine = _engine(v, where)
    model = _model(v, where, chain)
    topology = _topology(v, where, about_admission)
    unsafe = _unsafe(v)
    serve = _serve(v, engine, unsafe)
    deadline = _deadline(v)
    baseline = _baseline(v, topology)
    workload = _workload(v, where)
    faults = _faults(v, topology)
    expect = _expect(v, workload, engine)
    exclusive = _exclusive(v)
    _check_evidence_needs(p, expect)
    if p.problems:
        raise ScenarioError(p.problems, sources=chain.sources)
    try:
        return Scenario(
            name=doc.name or "",
            description=_description(v),
            exclusive=exclusive,
            unsafe=unsafe,
            deadline_s=deadline,
            includes=list(chain.includes),
            engine=engine,
            model=model,
            topology=topology,
            serve=serve,
            baseline=baseline,
            workload=workload,
            faults=faults,
            expect=expect,
            source_file=doc.filename,
            span=doc.name_span,
            field_spans={key: st.span for key in ("unsafe", "deadline") if (st := v.stmt("", key))},
        )
    except ValidationError as err:  # a gap in the checks above; still the stage's one error type
        raise ScenarioError(_pydantic_problem(err, where), sources=chain.sources) from None


def _pydantic_problem(err: ValidationError, where: Span) -> Any:
    from cptest.errors import Problem

    first = err.errors()[0]
    loc = ".".join(str(x) for x in first.get("loc", ()))
    return Problem(where, f"invalid value for {loc}: {first.get('msg', 'invalid')}")


def _node(cls: Any, p: ProblemCollector, span: Span | None, **kw: Any) -> Any:
    try:
        return cls(span=span, **kw)
    except ValidationError as err:
        p.problems.append(_pydantic_problem(err, span or Span("<input>", 1, 1)))
        return None


def _description(v: _Values) -> str | None:
    s = v.stmt("", "description")
    return s.value if s else None


def _exclusive(v: _Values) -> str | None:
    s = v.stmt("", "exclusive")
    if s is not None and not s.value.strip():
        v.p.add(s.span, "exclusive needs a reason", expected='exclusive "why this scenario needs the GPUs '
                'to itself"')
        return None
    return s.value if s else None


def _unsafe(v: _Values) -> str | None:
    s = v.stmt("", "unsafe")
    if s is None:
        return None
    if not s.value.strip():
        v.p.add(s.span, "unsafe needs a reason", expected='unsafe "why this scenario loads its own code"')
        return None
    return s.value


def _deadline(v: _Values) -> float | None:
    s = v.stmt("", "deadline")
    if s is None:
        return None
    value = v.check(s, "deadline", T.SETTINGS["scenario"]["deadline"])
    return None if value is MISSING else float(value)


def _check_sizes(v: _Values, stmts: list[Stmt]) -> None:
    """The limits no setting's own range covers: the length of every string, and how many times a
    repeatable statement may appear (cptest/lang/tables.py)."""
    for s in stmts:
        for text in _strings(s.value):
            if len(text) > T.MAX_TEXT_CHARS:
                v.p.add(s.span, f"string of {len(text)} characters is too long",
                        expected=f"at most {T.MAX_TEXT_CHARS} characters")
                break
    for (_block, key), entries in v.many.items():
        if len(entries) > T.MAX_LIST_ENTRIES:
            v.p.add(entries[T.MAX_LIST_ENTRIES].span, f"more than {T.MAX_LIST_ENTRIES} {key} statements",
                    expected=f"at most {T.MAX_LIST_ENTRIES}", found=str(len(entries)))


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for x in value.values() for t in _strings(x)]
    if isinstance(value, list | tuple):
        return [t for x in value for t in _strings(x)]
    return []


def _missing_block(v: _Values, name: str, where: Span) -> None:
    v.p.add(where, f"the scenario has no {name}", hint=f"add a `{name}` statement (docs/language.md)")


def _engine(v: _Values, where: Span) -> Engine | None:
    s = v.stmt("", "engine")
    if s is None:
        _missing_block(v, "engine", where)
        return None
    kind, release, image = str(s.value["kind"]), s.value["release"], s.value["image"]
    if kind not in T.ENGINE_KINDS:
        close = did_you_mean(kind, T.ENGINE_KINDS)
        v.p.add(
            s.parts["kind"],
            f"unknown engine {kind!r}",
            expected=one_of(T.ENGINE_KINDS),
            hint=f"did you mean '{close}'?" if close else None,
        )
        return None
    if kind == "sglang" and not release:
        v.p.add(s.span, "engine sglang needs a release", expected='engine sglang "0.5.17"')
        return None
    return _node(Engine, v.p, s.span, kind=kind, release=release or "builtin", image=image)


def _model(v: _Values, where: Span, chain: _Chain) -> Model | None:
    s = v.stmt("", "model")
    if s is None:
        _missing_block(v, "model", where)
        return None
    kind, arg = str(s.value["kind"]), s.value["arg"]
    if kind not in T.MODEL_KINDS:
        close = did_you_mean(kind, T.MODEL_KINDS)
        v.p.add(
            s.parts["kind"],
            f"unknown model kind {kind!r}",
            expected=one_of(T.MODEL_KINDS),
            hint=f"did you mean '{close}'?" if close else None,
        )
        return None
    geometry, gspans = v.block("model")
    facts_block, fspans = v.block("facts")
    has_facts = v.stmt("", "facts") is not None
    if "revision" in s.value and kind != "hub":
        v.p.add(s.parts["revision"], "'revision' applies to hub models only")
    if "sha256" in s.value and kind == "synthetic":
        v.p.add(s.parts["sha256"], "'sha256' pins a checkpoint on disk; synthetic weights are made by cptest",
                hint="their sha256 is recorded in the manifest of each run")
    if "sha256" in s.value and (why := model_ids.sha256_problem(s.value["sha256"])) is not None:
        v.p.add(s.parts["sha256"], why, expected='sha256 "<64 hex digits>"')
    fields: dict[str, Any] = {"kind": kind}
    spans: dict[str, Span] = {}
    if kind != "synthetic" and gspans:
        first = min(gspans.values())
        v.p.add(
            first,
            f"a {kind} model takes no geometry block",
            hint="declare what the model is in a `facts { ... }` block",
        )
    if kind in ("local", "hub") and not (isinstance(arg, str) and not isinstance(arg, Ident)):
        v.p.add(
            s.span,
            f"model {kind} needs a quoted {'path' if kind == 'local' else 'id'}",
            expected=f'model {kind} "{"../.tiny-models/llama-kv1" if kind == "local" else "org/name"}"',
        )
        return None
    facts: ModelFacts | None = None
    if kind == "synthetic":
        if has_facts:
            v.p.add(
                v.stmt("", "facts").span,
                "a synthetic model's facts are derived from its geometry",  # type: ignore[union-attr]
                hint="remove the facts block",
            )
        if not isinstance(arg, Ident) or str(arg) not in T.SYNTHETIC_ARCHITECTURES:
            close = did_you_mean(str(arg), T.SYNTHETIC_ARCHITECTURES) if arg is not None else None
            v.p.add(
                s.span,
                "synthetic model needs an architecture",
                expected=one_of(T.SYNTHETIC_ARCHITECTURES),
                found=describe(arg) if arg is not None else "nothing",
                hint=f"did you mean '{close}'?" if close else None,
            )
            return None
        arch = str(arg)
        is_mla = arch == "deepseek_mla"
        is_moe = arch == "qwen3_moe"
        required = ["layers", "hidden", "heads", "kv_heads", "vocab", "intermediate"]
        required += list(T.MLA_KEYS) if is_mla else ["head_dim"]
        required += list(T.MOE_KEYS) if is_moe else []
        absent = [k for k in required if k not in geometry and not _was_written(v, "model", k)]
        if absent:
            v.p.add(
                s.span,
                f"synthetic {arch} model misses {', '.join(absent)}",
                expected="model synthetic " + arch + " { " + " ".join(f"{k} N" for k in required) + " }",
            )
        if not is_mla:
            for k in T.MLA_KEYS:
                if k in gspans:
                    v.p.add(gspans[k], f"{k} applies to deepseek_mla only")
        if not is_moe:
            for k in T.MOE_KEYS:
                if k in gspans:
                    v.p.add(gspans[k], f"{k} applies to qwen3_moe only")
        heads, kv = geometry.get("heads"), geometry.get("kv_heads")
        if heads and kv and heads % kv:
            v.p.add(gspans["kv_heads"], f"heads ({heads}) must be a multiple of kv_heads ({kv})")
        experts, top = geometry.get("experts"), geometry.get("experts_per_tok")
        if is_moe and experts and top and top > experts:
            v.p.add(gspans["experts_per_tok"], f"experts_per_tok ({top}) must be at most experts ({experts})")
        if not all(k in geometry for k in required):
            return None
        params = _synthetic_params(geometry, is_mla, is_moe)
        if params > T.MAX_SYNTHETIC_PARAMS:
            v.p.add(s.span, f"the synthetic model would have about {params:,} parameters",
                    expected=f"at most {T.MAX_SYNTHETIC_PARAMS:,} (cptest writes its weights)",
                    hint="make layers, hidden, intermediate or vocab smaller")
            return None
        fields.update(geometry, architecture=arch)
        fields.setdefault("seed", 0)
        spans.update(gspans)
        head_dim = (
            geometry["qk_nope_head_dim"] + geometry["qk_rope_head_dim"] if is_mla else geometry["head_dim"]
        )
        facts = _node(
            ModelFacts,
            v.p,
            s.span,
            architecture=T.SYNTHETIC_ARCHITECTURES[arch],
            layers=geometry["layers"],
            hidden=geometry["hidden"],
            heads=geometry["heads"],
            kv_heads=geometry["kv_heads"],
            head_dim=head_dim,
            vocab=geometry["vocab"],
            is_mla=is_mla,
        )
    elif kind == "hub":
        fields["id"] = arg
        if (why := model_ids.hub_id_problem(arg)) is not None:
            v.p.add(s.span, why, expected='model hub "org/name" (no path, no "..", no "~")',
                    hint="a checkpoint on disk is `model local`, inside the scenario tree or the model store")
        if "revision" not in s.value:
            v.p.add(s.span, "a hub model needs a pinned revision", expected='revision "<commit>"')
        elif (why := model_ids.revision_problem(s.value["revision"])) is not None:
            v.p.add(s.parts["revision"], why, expected='revision "<commit hash or tag>"')
        fields["revision"] = s.value.get("revision")
        fields["sha256"] = s.value.get("sha256")
        if not has_facts:
            v.p.add(
                s.span,
                "a hub model needs a facts block (cptest never downloads to find out)",
                expected='facts { architecture "..." layers N hidden N heads N kv_heads N '
                "head_dim N vocab N }",
            )
            return None
        facts = _declared_facts(v, facts_block, s.span)
    else:
        path = os.path.normpath(os.path.join(chain.dir_of(s.span), arg))
        fields["path"] = path
        fields["sha256"] = s.value.get("sha256")  # the checkpoint's tree hash (cptest.run.preflight)
        facts = _local_facts(v, s, path, facts_block, fspans, has_facts, chain)
    if facts is None:
        return None
    return _node(Model, v.p, s.span, field_spans=spans, facts=facts, **fields)


def _synthetic_params(g: dict[str, int], is_mla: bool, is_moe: bool = False) -> int:
    """A synthetic model's parameter count, roughly (embeddings, attention and MLP of every layer):
    enough to refuse one whose weights would not fit on a disk. A MoE layer's MLP is its router and
    every expert (every qwen3_moe layer is sparse)."""
    hidden, layers = g["hidden"], g["layers"]
    head = (g["qk_nope_head_dim"] + g["qk_rope_head_dim"]) if is_mla else g["head_dim"]
    attention = hidden * head * (2 * g["heads"] + 2 * g["kv_heads"])
    mlp = 3 * hidden * g["intermediate"]
    if is_moe:
        mlp = g["experts"] * (hidden + 3 * hidden * g["moe_intermediate"])
    return 2 * g["vocab"] * hidden + layers * (attention + mlp)


def _was_written(v: _Values, block: str, key: str) -> bool:
    return (block, key) in v.one


def _declared_facts(v: _Values, facts: dict[str, Any], where: Span) -> ModelFacts | None:
    need = ["architecture", "layers", "hidden", "heads", "kv_heads", "head_dim", "vocab"]
    absent = [k for k in need if k not in facts and not _was_written(v, "facts", k)]
    fs = v.stmt("", "facts")
    if absent:
        v.p.add(fs.span if fs else where, f"facts block misses {', '.join(absent)}")
        return None
    if any(k not in facts for k in need):
        return None
    return _node(ModelFacts, v.p, fs.span if fs else where, **{"is_mla": False, **facts})


_CONFIG_KEYS = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "vocab": "vocab_size",
}


def facts_from_config(config: dict[str, Any]) -> dict[str, Any]:
    """ModelFacts fields from a Hugging Face config.json. Raises KeyError/TypeError/ValueError."""
    out: dict[str, Any] = {"architecture": str(config["architectures"][0])}
    for fact, key in _CONFIG_KEYS.items():
        out[fact] = int(config[key])
    out["kv_heads"] = int(config.get("num_key_value_heads") or out["heads"])
    out["is_mla"] = "kv_lora_rank" in config
    if out["is_mla"]:
        out["head_dim"] = int(config["qk_nope_head_dim"]) + int(config["qk_rope_head_dim"])
    else:
        out["head_dim"] = int(config.get("head_dim") or out["hidden"] // out["heads"])
    return out


def _local_facts(
    v: _Values,
    s: Stmt,
    path: str,
    declared: dict[str, Any],
    fspans: dict[str, Span],
    has_facts: bool,
    chain: _Chain,
) -> ModelFacts | None:
    config_path = os.path.join(path, "config.json")
    if not chain.is_dir(path) or outside_tree(path, chain.roots):
        # Outside the scenario tree config.json is not read: its values would be quoted in the
        # problems below. The run finds the checkpoint in the model store or refuses it (preflight).
        if has_facts:
            return _declared_facts(v, declared, s.span)
        v.p.add(
            s.span,
            f"model directory {path!r} "
            + ("lies outside the scenario tree" if chain.is_dir(path) else "does not exist")
            + " and no facts block declares the model",
            hint="generate it (make-tiny-models) or add facts { ... }",
        )
        return None
    try:
        config = json.loads(chain.read(config_path))
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
        found = facts_from_config(config)
    except (OSError, UnicodeDecodeError) as err:
        v.p.add(s.span, f"cannot read {config_path}: {_os_reason(err)}")
        return None
    except (ValueError, KeyError, TypeError, IndexError) as err:
        v.p.add(
            s.span,
            f"malformed {config_path}: {type(err).__name__} {err}",
            expected="a Hugging Face config.json with architectures, num_hidden_layers, hidden_size, ...",
        )
        return None
    for field, value in declared.items():
        if found.get(field) != value:
            v.p.add(
                fspans[field],
                f"facts say {field} {value} but config.json says {found.get(field)}",
                hint=f"see {config_path}",
            )
    return _node(ModelFacts, v.p, s.span, **found)


def _topology(v: _Values, where: Span, about_admission: bool) -> Topology | None:
    opener = v.stmt("", "topology")
    if opener is None:
        _missing_block(v, "topology", where)
        return None
    values, spans = v.block("topology")
    for key in ("gpus", "tp"):
        if key not in values and not _was_written(v, "topology", key):
            v.p.add(opener.span, f"topology needs {key}")
    if (
        "gpus" not in values
        or "tp" not in values
        or len(values) < len([k for (b, k) in v.one if b == "topology"])
    ):
        return None
    values.setdefault("prefill_cp", values.get("cp_strategy") is not None)
    topo = _node(Topology, v.p, opener.span, field_spans=spans, **values)
    if topo is None:
        return None
    _check_geometry(v.p, topo, "topology", about_admission)
    return topo


def _check_geometry(p: ProblemCollector, t: Topology, label: str, about_admission: bool) -> None:
    """The layout rules of `cptest.topology`, positioned at the setting to change. Those SGLang also
    enforces itself are left to the engine when the scenario is about that rejection
    (docs/decisions.md D5)."""
    hint = 'a scenario about this rejection declares: expect { launch rejected matching "..." }'
    for problem in layout_problems(t):
        admission = problem.code in ADMISSION_CODES
        if admission and about_admission:
            continue
        p.add(t.where(problem.field), f"{label}: {problem.message}", expected=problem.expected,
              hint=hint if admission else None)


def _serve(v: _Values, engine: Engine | None, unsafe: str | None) -> Serve:
    """The serve block. Every `env` and `flag` is judged by the engine release's safety table
    (`cptest.lang.safety`): one that loads code or config is an error at its statement unless the
    scenario declares `unsafe "reason"`; one the machine or cptest owns is an error regardless."""
    opener = v.stmt("", "serve")
    values, spans = v.block("serve")
    policy = safety.policy_for(engine.kind, engine.release) if engine else safety.LATEST
    escaped: list[Stmt] = []

    def judge(s: Stmt, verdict: safety.Verdict | None) -> None:
        if verdict is None:
            return
        if verdict.escapable and unsafe is not None:
            escaped.append(s)
            return
        hint = ('declare it: unsafe "why this scenario needs it", and run with --allow-unsafe'
                if verdict.escapable else "remove it: the scenario cannot change this")
        v.p.add(s.span, f"{'unsafe' if verdict.escapable else 'not allowed'}: {verdict.reason}", hint=hint)

    flags: list[list[str]] = []
    for i, s in enumerate(v.many.get(("serve", "flag"), [])):
        if not s.value[0].startswith("--"):
            v.p.add(s.span, f"flag {s.value[0]!r} must start with --", expected='flag "--name" ["value"]')
        else:
            judge(s, safety.flag_verdict(policy, s.value[0]))
        # Never escapable: a value read as an option sets a flag no table judged (the gate above
        # sees only the statement's first word), and a scenario that wants a flag writes its own.
        for k, value in enumerate(s.value[1:], 1):
            if safety.option_like(value):
                v.p.add(s.parts.get(str(k), s.span),
                        f"flag {s.value[0]}: the value {value!r} would be read as an option, not as a value",
                        expected="a value that does not start with - (a negative number does)",
                        hint="each flag is a statement of its own")
        flags.append(list(s.value))
        spans[f"flag:{i}"] = s.span
        spans.update({f"flag:{i}:{k}": span for k, span in s.parts.items()})
    env: dict[str, str] = {}
    for s in v.many.get(("serve", "env"), []):
        name, value = s.value
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            v.p.add(s.span, f"invalid environment variable name {name!r}", expected='env "NAME" "value"')
        elif name in env:
            v.p.add(s.span, f"duplicate env {name!r}")
        else:
            judge(s, safety.env_verdict(policy, name, value))
        env[name] = value
        spans[f"env:{name}"] = s.span
    declared = v.stmt("", "unsafe")
    if declared is not None and unsafe is not None and not escaped:
        v.p.add(declared.span, "unsafe is declared but the scenario sets no unsafe env or flag",
                hint="remove the unsafe statement")
    return (
        _node(
            Serve,
            v.p,
            opener.span if opener else None,
            field_spans=spans,
            extra_flags=flags,
            env=env,
            **values,
        )
        or Serve()
    )


def _baseline(v: _Values, topo: Topology | None) -> Baseline | None:
    s = v.stmt("", "baseline")
    if s is None:
        return None
    if s.value is not BLOCK:
        if str(s.value) != "none":
            v.p.add(
                s.span,
                f"unknown baseline {str(s.value)!r}",
                expected="baseline none or baseline { tp N ... }",
            )
        return None
    values, spans = v.block("baseline")
    base = _node(Baseline, v.p, s.span, field_spans=spans, **values)
    if base is not None and topo is not None:
        resolved = baseline_topology(topo, base)
        if resolved is not None:
            _check_geometry(v.p, resolved, "baseline", about_admission=False)
    return base


def _workload(v: _Values, where: Span) -> Workload | None:
    opener = v.stmt("", "workload")
    if opener is None:
        _missing_block(v, "workload", where)
        return None
    values, spans = v.block("workload")
    ok = True
    for key, field in (
        ("requests", "requests"),
        ("prompt_tokens", "prompt_tokens"),
        ("output_tokens", "output_tokens"),
    ):
        if field not in values:
            ok = False
            if not _was_written(v, "workload", key):
                v.p.add(opener.span, f"workload needs {key}")
    conc, rate = v.stmt("workload", "concurrency"), v.stmt("workload", "rate")
    if conc and rate:
        later = max(conc, rate, key=lambda s: (s.span.file, s.span.line, s.span.col))
        v.p.add(
            later.span,
            "workload sets both concurrency and rate",
            hint="closed loop: concurrency N; open loop: rate R (requests per second)",
        )
        ok = False
    elif not conc and not rate and not v.stmt("workload", "fill_drain"):
        v.p.add(opener.span, "workload needs concurrency (closed loop) or rate (open loop)")
        ok = False
    fill = v.stmt("workload", "fill_drain")
    overridden = 0
    if fill and (conc or rate):
        other = conc or rate
        assert other is not None
        if other is conc and conc.span.file != where.file and fill.span.file == where.file:
            # An extends file's concurrency gives way to the scenario's fill_drain (the extending file
            # wins, as everywhere in a chain); written beside it, or against an inherited fill_drain,
            # it is a contradiction.
            values.pop("concurrency", None)
            overridden = 1
        else:
            v.p.add(fill.span, "fill_drain sets the workload's concurrency itself (from the KV pool's size)",
                    hint=f"remove {'concurrency' if other is conc else 'rate'}")
            ok = False
    samp = v.stmt("workload", "sampling")
    if samp is not None:
        mode = str(samp.value)
        body, bspans = v.block("sampling")
        if mode not in ("greedy", "sample"):
            close = did_you_mean(mode, ("greedy", "sample"))
            v.p.add(
                samp.parts["mode"],
                f"unknown sampling {mode!r}",
                expected="greedy or sample { ... }",
                hint=f"did you mean '{close}'?" if close else None,
            )
        elif mode == "greedy" and any(b == "sampling" for (b, _k) in v.one):
            v.p.add(
                samp.span,
                "greedy sampling takes no settings",
                hint="write: sampling sample { temperature ... }",
            )
        else:
            sampling = _node(Sampling, v.p, samp.span, field_spans=bspans, mode=mode, **body)
            if sampling is not None:
                values["sampling"] = sampling
                spans["sampling"] = samp.span
    src = v.stmt("workload", "source")
    if src is not None:
        kind, path = src.value
        if str(kind) == "synthetic" and path is None:
            values["source"] = "synthetic"
        elif str(kind) == "dataset" and path is not None:
            values["source"] = "dataset"
            values["dataset_path"] = os.path.normpath(os.path.join(os.path.dirname(src.span.file), path))
            problem = _dataset_problem(values["dataset_path"])
            if problem is not None:
                v.p.add(src.span, problem,
                        expected=f"a JSON-lines file of at most {T.MAX_DATASET_BYTES:,} bytes")
        else:
            v.p.add(src.span, "invalid source", expected='source synthetic or source dataset "path.jsonl"')
        spans["source"] = src.span
    if not ok or len(values) + overridden < len(
        [k for (b, k) in v.one if b == "workload" and k not in ("sampling", "source")]
    ):
        return None
    if values.get("source") != "dataset":
        biggest = values["prompt_tokens"].bounds()[1]
        if values["requests"] * biggest > T.MAX_PLAN_TOKENS:
            v.p.add(spans.get("requests", opener.span),
                    f"the workload asks for up to {values['requests'] * biggest:,} prompt tokens "
                    f"({values['requests']:,} requests x {biggest:,}); the plan stores every one",
                    expected=f"requests x the largest prompt_tokens <= {T.MAX_PLAN_TOKENS:,}")
            return None
    return _node(Workload, v.p, opener.span, field_spans=spans, **values)


def _dataset_problem(path: str) -> str | None:
    """Why the dataset at `path` cannot be read into a plan, from its metadata alone (the plan stage
    reads it): not a regular file (`/dev/zero`, a FIFO, a folder) or too large. A file that does not
    exist yet is the plan's business."""
    if "\0" in path:
        return "a dataset path cannot contain a NUL character"
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return f"dataset {path} is not a regular file"
    if st.st_size > T.MAX_DATASET_BYTES:
        return f"dataset {path} is larger than {T.MAX_DATASET_BYTES:,} bytes"
    return None


def _faults(v: _Values, topo: Topology | None) -> list[Fault]:
    out: list[Fault] = []
    seen: dict[tuple[Any, ...], Stmt] = {}
    world = topo.gpus if topo else None
    for s in v.many.get(("", "fault"), []):
        d = s.value
        action = str(d["action"])
        bad = False
        if action not in T.FAULT_ACTIONS:
            close = did_you_mean(action, T.FAULT_ACTIONS)
            v.p.add(
                s.parts["action"],
                f"unknown fault action {action!r}",
                expected=one_of(T.FAULT_ACTIONS),
                hint=f"did you mean '{close}'?" if close else None,
            )
            bad = True
        if action in T.SERVER_ONLY_ACTIONS and d["target"] == "rank":
            v.p.add(
                s.parts["rank"],
                f"{action} is sent to the server, not to a rank",
                expected=f"fault {action} server ...",
            )
            bad = True
        rank = d["rank"]
        if rank is not None and (rank < 0 or (world is not None and rank >= world)):
            v.p.add(
                s.parts["rank"],
                f"fault rank {rank} is outside the world",
                expected=f"0 <= rank < {world}" if world else "rank >= 0",
            )
            bad = True
        fields: dict[str, Any] = {"action": action, "target": d["target"], "rank": rank}
        if "at" in d:
            at = d["at"]
            if isinstance(at, int | float) and not isinstance(at, bool):
                v.p.add(s.parts["trigger"], "fault time needs a unit", expected=f"at {at}s", found=str(at))
                bad = True
            elif not isinstance(at, Duration) or not 0 <= at.seconds <= T.MAX_TIMEOUT_S:
                v.p.add(
                    s.parts["trigger"],
                    "invalid fault time",
                    expected=f"a duration from 0 to {T.MAX_TIMEOUT_S:g}s (at 10s)",
                    found=describe(at),
                )
                bad = True
            else:
                fields["at_s"] = at.seconds
        for trig in ("after_requests", "after_decode_steps"):
            if trig in d:
                if d[trig] < 1:
                    v.p.add(s.parts["trigger"], f"{trig.replace('_', ' ')} must be >= 1", found=str(d[trig]))
                    bad = True
                fields[trig] = d[trig]
        heal = d["for"]
        if heal is not None:
            if action != "stop":
                v.p.add(s.parts["for"], f"'for' applies to stop faults only, not {action}")
                bad = True
            elif not isinstance(heal, Duration) or not 0 < heal.seconds <= T.MAX_TIMEOUT_S:
                v.p.add(
                    s.parts["for"],
                    "invalid stop duration",
                    expected="a duration > 0 (for 5s)",
                    found=describe(heal),
                )
                bad = True
            else:
                fields["heal_after_s"] = heal.seconds
        key = (
            d["target"],
            rank,
            *(sorted((k, str(d[k])) for k in ("at", "after_requests", "after_decode_steps") if k in d)),
        )
        if key in seen:
            v.p.add(
                s.span,
                f"fault conflicts with the fault at line {seen[key].span.line} (same target, same trigger)",
            )
            bad = True
        seen.setdefault(key, s)
        if not bad:
            f = _node(Fault, v.p, s.span, field_spans=dict(s.parts), **fields)
            if f is not None:
                out.append(f)
    return out


def _check_evidence_needs(p: ProblemCollector, expect: Expect) -> None:
    """Expectations whose evidence cannot come from one run: per-step records need eager decode
    (Python hooks do not fire on CUDA-graph replay, docs/decisions.md D8), so decode graphs cannot
    also be expected to be captured in the same scenario."""
    eager = [name for name, _ in expect.entries() if CONTRACTS[name].needs_eager]
    if not eager:
        return
    for g in expect.graph:
        if g.phase == "decode" and g.mode == "captured" and not g.violated:
            p.add(g.span, f"decode CUDA graphs cannot be expected here: the {eager[0]} expectation needs "
                  "eager decode (hooks do not fire on graph replay)",
                  hint="put the graph expectation in a scenario of its own")  # fmt: skip


def _expect(v: _Values, workload: Workload | None, engine: Engine | None) -> Expect:
    opener = v.stmt("", "expect")
    fields: dict[str, Any] = {}
    spans: dict[str, Span] = {}
    stmts = [s for (b, _k), s in v.one.items() if b == "expect"] + v.many.get(("expect", "log"), [])
    for s in stmts:
        name = s.key.split()[0]  # "graph decode" is a graph expectation
        entry = _entry(v.p, s, CONTRACTS[name].expect, workload)
        if entry is None:
            continue
        if entry.violated and entry.violated_on is None and engine is not None:
            # An unscoped `violated` is about the engine and release the scenario names: on any
            # other (the CPU reference engine, another release) the contract is expected to hold.
            entry = entry.model_copy(update={"violated_on": (engine.kind, engine.release)})
        if CONTRACTS[name].repeatable:
            fields.setdefault(name, []).append(entry)
        else:
            fields[name] = entry
            spans[name] = s.span
    if "graph" in fields:
        fields["graph"].sort(key=lambda g: list(GRAPH_MODES).index(g.phase))
    return (
        _node(Expect, v.p, opener.span if opener else None, field_spans=spans, **fields)
        or Expect()
    )


def _entry(p: ProblemCollector, s: Stmt, cls: type[Declared], workload: Workload | None) -> Declared | None:
    """One expectation statement as its contract's declared model; its validators' complaints are
    positioned at the part of the statement they are about (or the statement)."""
    data = {**s.value, "span": s.span, "field_spans": dict(s.parts)}
    try:
        return cls.model_validate(data, context={"requests": workload.requests if workload else None})
    except ValidationError as err:
        for e in err.errors():
            field = str(e["loc"][0]) if e["loc"] else None
            where = s.parts.get(field, s.span) if field else s.span
            if e["type"] == "cptest":
                ctx = e.get("ctx") or {}
                p.add(where, e["msg"], **{k: ctx.get(k) for k in ("expected", "found", "hint")})
            else:
                p.add(where, f"invalid value for {field or s.key}: {e['msg']}")
        return None


