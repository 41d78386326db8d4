"""The `expect` block: each expectation statement validated as its contract's declared model
(`cptest.contracts`), with the contract's complaints positioned at the part they are about, and the
expectations that cannot share one run."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from cptest.contracts import CONTRACTS, Declared
from cptest.errors import ProblemCollector, Span
from cptest.lang.settings import Values, node
from cptest.lang.syntax import Stmt
from cptest.lang.tables import EXPECT_ORDER, contract_of
from cptest.scenario import Engine, Expect, Workload


def check_evidence_needs(p: ProblemCollector, expect: Expect) -> None:
    """Expectations whose evidence cannot come from one run: per-step records need eager decode
    (Python hooks do not fire on CUDA-graph replay), so decode graphs cannot
    also be expected to be captured in the same scenario."""
    eager = [name for name, _ in expect.entries() if CONTRACTS[name].needs_eager]
    if not eager:
        return
    for g in expect.graph:
        if g.phase == "decode" and g.mode == "captured" and not g.violated:
            p.add(g.span, f"decode CUDA graphs cannot be expected here: the {eager[0]} expectation needs "
                  "eager decode (hooks do not fire on graph replay)",
                  hint="put the graph expectation in a scenario of its own")  # fmt: skip


def expect_block(v: Values, workload: Workload | None, engine: Engine | None) -> Expect:
    opener = v.stmt("", "expect")
    fields: dict[str, Any] = {}
    spans: dict[str, Span] = {}
    stmts = [s for (b, _k), s in v.one.items() if b == "expect"]
    stmts += [s for (b, _k), many in v.many.items() if b == "expect" for s in many]
    # A contract's entries in the order of its keys (a graph's decode before prefill), each key's in
    # source order.
    stmts.sort(key=lambda s: _key_rank(s.key))
    for s in stmts:
        name = contract_of(s.key)
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
    return (
        node(Expect, v.p, opener.span if opener else None, field_spans=spans, **fields)
        or Expect()
    )


EXPECT_RANK = {key: i for i, key in enumerate(EXPECT_ORDER)}


def _key_rank(key: str) -> int:
    """Where a statement key comes in the canonical order; a key no contract lists comes last."""
    return EXPECT_RANK.get(key, len(EXPECT_RANK))


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
