"""contracts: every expectation a scenario may declare, one module each (see `base.py` for what a
module defines), and the registry that lists them.

    CONTRACTS["rows"].resolve(expect, ctx) -> RowsParams        at plan time
    CONTRACTS["rows"].check(evidence, params) -> Verdict         at check time

The registry is found, not kept: every module of this package that defines `CONTRACT` is one
contract, and `CONTRACTS` lists them by their `order`. `Expectation` is the plan's discriminated
union of every contract's parameters (`kind` names the contract): what `plan.json` stores under
`expectations`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Annotated, Any, Union

from pydantic import Field

from cptest.contracts.base import Contract, Declared, EngineFacts, Params, PlanContext

# The contracts' models by name, as callers have always imported them from here; a new contract is
# found without a line here.
from cptest.contracts.capacity import CapacityExpect, CapacityParams, LogPatterns
from cptest.contracts.capacity_transitions import CapacityTransitionsExpect, CapacityTransitionsParams
from cptest.contracts.generation import GenerationExpect, GenerationParams
from cptest.contracts.graph import GraphExpect, GraphParams
from cptest.contracts.graph_parity import GraphParityExpect, GraphParityParams
from cptest.contracts.launch import LaunchExpect, LaunchParams
from cptest.contracts.log import LogExpect, LogParams
from cptest.contracts.rows import RowsExpect, RowsParams
from cptest.contracts.serving import ServingExpect, ServingParams
from cptest.contracts.shutdown import ShutdownExpect, ShutdownParams


def _found() -> list[Contract[Any, Any]]:
    """The `CONTRACT` of every module of this package, by order (a tie is a mistake: refused)."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        contract = getattr(importlib.import_module(f"{__name__}.{info.name}"), "CONTRACT", None)
        if isinstance(contract, Contract):
            found.append(contract)
    found.sort(key=lambda c: c.order)
    for a, b in zip(found, found[1:], strict=False):
        if a.order == b.order or a.name == b.name:
            raise RuntimeError(f"contracts {a.name} and {b.name} share an order or a name")
    return found


CONTRACTS: Mapping[str, Contract[Any, Any]] = {c.name: c for c in _found()}
"""Every contract by name, in the order a scenario's verdicts are listed."""

Expectation = Annotated[
    Union[tuple(c.params for c in CONTRACTS.values())],  # type: ignore[valid-type]  # noqa: UP007
    Field(discriminator="kind"),
]
"""One declared contract, resolved: what its checker judges the evidence with."""


def resolve(name: str, expect: Declared, ctx: PlanContext) -> Params:
    """The plan's form of one declared expectation: its contract's parameters, with the scenario's
    `violated` and the expectation's position."""
    params = CONTRACTS[name].resolve(expect, ctx)
    on = None
    if expect.violated:
        engine, release = expect.violated_on or (ctx.engine, None)
        on = engine + (f" {release}" if release else "")
    applies = expect.violation_applies(ctx.engine, ctx.facts.release)
    return params.model_copy(update={"expect_violation": applies, "violated_on": on,
                                     "source": str(expect.span) if expect.span else ""})


__all__ = [
    "CONTRACTS",
    "CapacityExpect",
    "CapacityParams",
    "CapacityTransitionsExpect",
    "CapacityTransitionsParams",
    "Contract",
    "Declared",
    "EngineFacts",
    "Expectation",
    "GenerationExpect",
    "GenerationParams",
    "GraphExpect",
    "GraphParams",
    "GraphParityExpect",
    "GraphParityParams",
    "LaunchExpect",
    "LaunchParams",
    "LogExpect",
    "LogParams",
    "LogPatterns",
    "Params",
    "PlanContext",
    "RowsExpect",
    "RowsParams",
    "ServingExpect",
    "ServingParams",
    "ShutdownExpect",
    "ShutdownParams",
    "resolve",
]
