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

RENDEZVOUS_PORT_OFFSET = 50
"""Node 0 of a multi-node server hosts the torch.distributed rendezvous at its HTTP port + this."""
NODE_PORT_STEP = 1
"""A co-located server's node k listens on its server's port + k (SGLang's nodes other than 0 bind a
health server on `--port`), below the rendezvous port."""
MAX_COLOCATED_RANKS = 32
"""Ranks of one co-located server: their ports stay below the rendezvous port (port + 50)."""


def node_port(port: int, node_rank: int, colocated: bool) -> int:
    """The HTTP port node `node_rank` of a server on `port` listens on: its own when co-located,
    else the server's (nodes on separate hosts)."""
    return port + NODE_PORT_STEP * node_rank if colocated else port


@dataclass(frozen=True)
class ServerLaunch:
    """One server's launch settings, engine-neutral: what the scenario and the plan decided."""

    model_path: str
    degrees: Degrees
    serve: Serve
    port: int
    host: str = "127.0.0.1"
    eager: bool = False
    """Every CUDA-graph phase disabled: per-step evidence needs eager forwards (docs/sglang.md,
    "CUDA graphs": Python hooks never fire on a replay)."""
    forward_hooks: tuple[Mapping[str, object], ...] = ()
    """The probe's module hooks (`cptest.probe.forward_hooks`), for engines that load them."""
    colocated: bool = False
    """The server's ranks are co-located, one local node process each (`degrees.nodes` of them):
    every node gets its own `--port` (`port + NODE_PORT_STEP * k`) and the placement's flags."""
    mem_fraction: float | None = None
    """Co-located: each rank's memory fraction, in place of the scenario's `mem_fraction`."""
    extra_flags: tuple[str, ...] = ()
    """Switches the placement adds (each at most once, whatever the scenario also passes)."""


@dataclass(frozen=True)
class ColocatedLaunch:
    """What an engine needs to run several ranks of one server on one GPU, each rank its own local
    node process (`cptest.plan.model.Colocation` records it in the plan)."""

    env: Mapping[str, str]
    """Added to every node's environment."""
    host_id_var: str | None
    """A variable that gets a distinct value on each node (NCCL_HOSTID: ranks on distinct "hosts"
    may share a GPU), or None."""
    flags: tuple[str, ...]
    """Added to every node's argv."""
    transport: str
    """How the ranks' collectives travel, in words for the reader."""
    takes_mem_fraction: bool
    """The engine sizes its memory by a fraction of the GPU (`--mem-fraction-static`), which the
    placement then divides among the ranks sharing a GPU."""
    follower_ranks_ended: str | None = None
    """A regular expression of the log line a follower node (any but node 0) prints once its ranks
    have ended; None where the engine's follower does nothing after them."""
    follower_ports_checked: str | None = None
    """A regular expression of the log line a follower node prints once it has checked the ports that
    node 0 then binds on the same host: node 0 starts after every follower printed it (None: all
    nodes start at once)."""


class Engine(Protocol):
    """An engine cptest can plan for (`cptest.engines.engine_for` returns one)."""

    name: str
    """`sglang` or `reference`: the label every verdict carries."""
    release: str
    title_prefix: str
    """Scheduler process titles are `<prefix>[_DP<d>][_PP<p>][_ATTN_CP<c>][_TP<r>]`."""
    server_info_paths: tuple[str, ...]
    """The HTTP paths that answer with the server's resolved arguments and capacity, in the order
    the runner asks them."""

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

    def colocated(self) -> ColocatedLaunch:
        """What co-located ranks of this engine need (`cptest.plan` applies it per node)."""
        ...

    def argv(self, launch: ServerLaunch, node_rank: int, nodes: int) -> list[str]:
        """argv of node `node_rank` of `nodes` (argv[0] is the interpreter, resolved by the
        launcher). Raises PlanError naming every flag or value the engine does not accept."""
        ...
