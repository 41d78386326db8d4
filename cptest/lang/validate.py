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

This module composes the checks, one module for each thing validated: the `extends` chain
(`extends`), typed settings (`settings`), the model (`model_block`), topology and baseline
(`layout`), serve (`serve`), workload (`workload`), faults (`faults`) and expectations (`expect`);
the scenario-wide statements (engine, description, exclusive, unsafe, deadline, sizes) are here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from cptest.engines.sglang.releases import PINNED_RELEASE
from cptest.errors import ScenarioError, Span
from cptest.lang import tables as T
from cptest.lang.expect import check_evidence_needs, expect_block
from cptest.lang.extends import LANGUAGE_VERSION, Chain, load_chain, merge
from cptest.lang.faults import fault_statements
from cptest.lang.files import Reader, read_path
from cptest.lang.includes import scenario_roots
from cptest.lang.layout import baseline_block, topology_block
from cptest.lang.model_block import facts_from_config, model_statement
from cptest.lang.serve import serve_block
from cptest.lang.settings import MISSING, Values, missing_block, node, pydantic_problem, unknown_word
from cptest.lang.syntax import Doc, Stmt
from cptest.lang.workload import workload_block
from cptest.scenario import Engine, Scenario

__all__ = ["LANGUAGE_VERSION", "MISSING", "Reader", "facts_from_config", "merge", "read_path", "resolve"]


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
    chain = Chain(read, is_dir, tree if tree is not None else scenario_roots(base_dir))
    p = chain.problems
    if doc.kind != "scenario":
        p.add(
            doc.name_span,
            "this is a defaults file, not a scenario",
            hint='a scenario uses it with: extends "<this file>"',
        )
    stmts = load_chain(doc, chain, base_dir, [os.path.normpath(os.path.join(base_dir, doc.filename))])
    if chain.broken:
        raise ScenarioError(p.problems, sources=chain.sources)
    v = Values(stmts, p)
    # Admission rules SGLang enforces itself are relaxed when the scenario is *about* admission:
    # it expects the launch to be rejected, or declares the launch contract violated.
    launch = v.stmt("expect", "launch")
    about_admission = bool(launch and (not launch.value.get("accepted") or launch.value.get("violated")))
    where = doc.name_span
    _check_sizes(v, stmts)
    engine = _engine(v, where)
    model = model_statement(v, where, chain)
    topology = topology_block(v, where, about_admission)
    unsafe = _unsafe(v)
    serve = serve_block(v, engine, unsafe)
    deadline = _deadline(v)
    baseline = baseline_block(v, topology)
    workload = workload_block(v, where)
    faults = fault_statements(v, topology)
    expect = expect_block(v, workload, engine)
    exclusive = _exclusive(v)
    check_evidence_needs(p, expect)
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
        raise ScenarioError(pydantic_problem(err, where), sources=chain.sources) from None


def _description(v: Values) -> str | None:
    s = v.stmt("", "description")
    return s.value if s else None


def _exclusive(v: Values) -> str | None:
    s = v.stmt("", "exclusive")
    if s is not None and not s.value.strip():
        v.p.add(s.span, "exclusive needs a reason", expected='exclusive "why this scenario needs the GPUs '
                'to itself"')
        return None
    return s.value if s else None


def _unsafe(v: Values) -> str | None:
    s = v.stmt("", "unsafe")
    if s is None:
        return None
    if not s.value.strip():
        v.p.add(s.span, "unsafe needs a reason", expected='unsafe "why this scenario loads its own code"')
        return None
    return s.value


def _deadline(v: Values) -> float | None:
    s = v.stmt("", "deadline")
    if s is None:
        return None
    value = v.check(s, "deadline", T.SETTINGS["scenario"]["deadline"])
    return None if value is MISSING else float(value)


def _check_sizes(v: Values, stmts: list[Stmt]) -> None:
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


def _engine(v: Values, where: Span) -> Engine | None:
    s = v.stmt("", "engine")
    if s is None:
        missing_block(v, "engine", where)
        return None
    kind, release, image = str(s.value["kind"]), s.value["release"], s.value["image"]
    if kind not in T.ENGINE_KINDS:
        unknown_word(v.p, s.parts["kind"], f"unknown engine {kind!r}", kind, T.ENGINE_KINDS)
        return None
    if kind == "sglang" and not release:
        v.p.add(s.span, "engine sglang needs a release", expected=f'engine sglang "{PINNED_RELEASE.name}"')
        return None
    return node(Engine, v.p, s.span, kind=kind, release=release or "builtin", image=image)
