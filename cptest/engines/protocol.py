"""The engine protocol: what the plan needs from an engine, SGLang or the CPU reference, side by side.

An engine turns a server's launch settings into argv (one list per node, never a shell string),
names its scheduler processes (what a rank fault targets), says which settings it cannot express at
all, and states the facts about itself that contracts are judged with: the log lines it prints,
the exit statuses it ends with. `cptest.plan` asks an engine and never branches on which one it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from cptest.contracts.base import EngineFacts
from cptest.engines.sglang.admission import Admission
from cptest.scenario import Scenario, Serve
from cptest.topology import Degrees


@dataclass(frozen=True)
class ServerLaunch:
    """One server's launch settings, engine-neutral: what the scenario and the plan decided."""

    model_path: str
    degrees: Degrees
    serve: Serve
    port: int
    host: str = "127.0.0.1"
    eager: bool = False
    """Every CUDA-graph phase disabled: per-step evidence needs eager forwards (docs/decisions.md D8)."""
    forward_hooks: tuple[Mapping[str, object], ...] = ()
    """The probe's module hooks (`cptest.probe.forward_hooks`), for engines that load them."""


class Engine(Protocol):
    """An engine cptest can plan for (`cptest.engines.engine_for` returns one)."""

    name: str
    """`sglang` or `reference`: the label every verdict carries."""
    release: str
    title_prefix: str
    """Scheduler process titles are `<prefix>[_DP<d>][_PP<p>][_ATTN_CP<c>][_TP<r>]`."""

    def facts(self) -> EngineFacts:
        """The engine's facts for the contracts (see `EngineFacts`)."""
        ...

    def unexpressible(self, degrees: Degrees) -> list[str]:
        """Settings this engine cannot be told at all (it would silently run something else).

        Not what the engine *rejects*: a rejection is the engine's behaviour, which a scenario may
        expect and the launch contract judges. Empty when everything can be expressed.
        """
        ...

    def admission(self, scenario: Scenario) -> Admission | None:
        """What the engine's release is known to do with this launch (None: nothing is known)."""
        ...

    def argv(self, launch: ServerLaunch, node_rank: int, nodes: int) -> list[str]:
        """argv of node `node_rank` of `nodes` (argv[0] is the interpreter, resolved by the
        launcher). Raises PlanError naming every flag or value the engine does not accept."""
        ...
