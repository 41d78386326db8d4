"""contracts: every expectation a scenario may declare, one module each (see `base.py` for what a
module defines), and the registry that lists them.

    CONTRACTS["rows"].resolve(expect, ctx) -> RowsParams        at plan time
    CONTRACTS["rows"].check(evidence, params) -> Verdict         at check time

`Expectation` is the plan's discriminated union of every contract's parameters (`kind` names the
contract): what `plan.json` stores under `expectations`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field

from cptest.contracts import capacity, generation, graph, graph_parity, launch, log, rows, serving, shutdown
from cptest.contracts.base import Contract, Declared, EngineFacts, Params, PlanContext
from cptest.contracts.capacity import CapacityExpect, CapacityParams, LogPatterns
from cptest.contracts.capacity_transitions import CONTRACT as CAPACITY_TRANSITIONS
from cptest.contracts.capacity_transitions import CapacityTransitionsExpect, CapacityTransitionsParams
from cptest.contracts.generation import GenerationExpect, GenerationParams
from cptest.contracts.graph import GraphExpect, GraphParams
from cptest.contracts.graph_parity import GraphParityExpect, GraphParityParams
from cptest.contracts.launch import LaunchExpect, LaunchParams
from cptest.contracts.log import LogExpect, LogParams
from cptest.contracts.rows import RowsExpect, RowsParams
from cptest.contracts.serving import ServingExpect, ServingParams
from cptest.contracts.shutdown import ShutdownExpect, ShutdownParams

CONTRACTS: Mapping[str, Contract[Any, Any]] = {
    c.name: c
    for c in (launch.CONTRACT, rows.CONTRACT, capacity.CONTRACT, CAPACITY_TRANSITIONS, generation.CONTRACT,
              graph.CONTRACT, graph_parity.CONTRACT, serving.CONTRACT, shutdown.CONTRACT, log.CONTRACT)
}  # fmt: skip
"""Every contract by name, in the order a scenario's verdicts are listed."""

Expectation = Annotated[
    LaunchParams | RowsParams | CapacityParams | CapacityTransitionsParams
    | GenerationParams | GraphParams | GraphParityParams
    | ServingParams | ShutdownParams | LogParams,
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
    "CapacityTransitionsExpect",
    "Contract",
    "Declared",
    "EngineFacts",
    "Expectation",
    "GenerationExpect",
    "GraphExpect",
    "GraphParityExpect",
    "LaunchExpect",
    "LogExpect",
    "LogPatterns",
    "Params",
    "PlanContext",
    "RowsExpect",
    "ServingExpect",
    "ShutdownExpect",
    "resolve",
]
