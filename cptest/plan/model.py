"""The Plan: everything a run needs, as typed, pure JSON-serialisable data (no shell strings anywhere).

`cptest.plan.plan(scenario, ...)` builds it; `cptest.run` executes it; the archive stores it as
`plan.json`; `cptest check` and `cptest rerun` read it back. Nothing here refers to the scenario's
syntax. Every field is typed: the servers' degrees and rank geometry (`cptest.topology`), the
expectations (`cptest.contracts.Expectation`, one parameter model per contract), the pins.

Version 3 (this one) names synthetic prompts instead of storing them, version 2 typed the
expectations; an older `plan.json` is upgraded when read (`cptest.plan.upgrade`), so that archives
made before stay checkable.
"""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cptest.contracts import Expectation
from cptest.engines.sglang.admission import Admission
from cptest.lang.tables import DEFAULT_DEADLINE_S
from cptest.paths import materialize
from cptest.plan.prompts import synthetic_prompt
from cptest.plan.upgrade import PLAN_VERSION, upgrade_v1, upgrade_v2
from cptest.scenario import FaultSpec, ModelFacts, ModelSource, SyntheticGeometry
from cptest.topology import Degrees, PlacementMode, RankGeometry


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NodeLaunch(_Frozen):
    """One engine process tree on one node: what the launcher starts."""

    node_rank: int
    host: str = "127.0.0.1"
    image: str | None = None
    """Image reference for the docker launcher; the digest is checked against images/lock.json."""
    gpu_ids: list[int]
    env: dict[str, str]
    argv: list[str]
    """argv[0] is the interpreter name ("python3"); the launcher resolves it, never a shell."""
    port: int
    model_mount: str | None = None
    """Host path of the model directory (mounted read-only in containers)."""
    cpus: list[int] | None = Field(default=None, exclude_if=lambda v: v is None)
    """The host CPUs the node's processes may run on (None: wherever the OS puts them). Set when a
    suite packs several servers onto one machine: each server its own cores, so that one server's
    busy scheduler threads cannot slow another's steps."""


MAIN_PORT = 30000
BASELINE_PORT = 30100


class Placement(_Frozen):
    """Where on this machine a plan's servers run: the HTTP ports, the physical GPUs, the CPUs, and
    whether ranks have a GPU each or share them.

    The default is what a lone `cptest run` uses (ports 30000/30100, GPUs 0..n-1, any CPU, one rank
    per GPU); a suite that packs scenarios onto shared GPUs gives each its own (`cptest.suite`). The
    plan records the result in every node (port, gpu_ids, cpus) and, for co-located servers, the
    rank->GPU map with everything co-location adds (`Colocation`), so a rerun runs where the run did."""

    main_port: int = Field(default=MAIN_PORT, ge=1, le=65535)
    baseline_port: int = Field(default=BASELINE_PORT, ge=1, le=65535)
    gpus: list[int] | None = None
    """Physical GPU ids; a server of n GPUs per node takes the first n. None: 0..n-1. Co-located:
    the GPUs the ranks are spread over in contiguous blocks (None: all on GPU 0)."""
    cpus: list[int] | None = None
    """Host CPUs for every process of the servers; None: no pinning."""
    mode: PlacementMode = "physical"
    rank_mem_fraction: float | None = Field(default=None, gt=0.0, le=1.0)
    """Co-located only: each rank's `--mem-fraction-static`, stated explicitly. None: the scenario's
    `mem_fraction` divided by the most ranks sharing one GPU, so that the ranks of a GPU together
    take what one rank would have taken alone."""


class Colocation(_Frozen):
    """How a co-located server's ranks share GPUs: each world rank is a local node process (SGLang's
    `--nnodes N --node-rank k`), and what the placement adds to make that work. None of it can be
    set from a scenario's `serve { env ... }` (`cptest.lang.safety.PLACEMENT_ENV`)."""

    rank_gpus: list[int]
    """World rank -> the physical GPU it runs on (node k runs world rank k)."""
    ranks_per_gpu: int
    """The most ranks sharing one GPU."""
    transport: str
    """How the ranks' collectives travel (the engine's words: NCCL over sockets on loopback)."""
    env: dict[str, str]
    """What the placement adds to every node's environment (each node's host id apart)."""
    node_env: list[dict[str, str]]
    """Per node: what differs between nodes (each its own host id, so that NCCL treats the ranks as
    separate hosts and allows two on one GPU)."""
    flags: list[str]
    """What the placement adds to every node's argv (custom all-reduce off: it needs one process
    per GPU and CUDA IPC between them)."""
    mem_fraction: float | None
    """Each rank's `--mem-fraction-static`; None where the engine takes no such flag."""
    mem_fraction_basis: str
    """How that figure was reached, for the reader: divided, or stated explicitly."""
    cannot_judge: list[str] = Field(default_factory=lambda: list(COLOCATED_CANNOT_JUDGE))
    """What evidence from co-located ranks says nothing about (docs/placement.md)."""


COLOCATED_CANNOT_JUDGE = (
    "speed: throughput and latency figures (ranks share one GPU's SMs, collectives go over sockets)",
    "NVLink, custom all-reduce and symmetric-memory paths (turned off)",
    "per-GPU memory accounting (device totals mix the ranks that share a GPU)",
)


class ServerPlan(_Frozen):
    """One server (main, baseline, control or the eager twin): its nodes and what rank geometry it
    should have."""

    role: Literal["main", "baseline", "control", "eager"]
    engine: Literal["sglang", "reference"]
    release: str
    nodes: list[NodeLaunch]
    base_url: str
    world_size: int
    topology: Degrees
    """The server's parallel degrees (resolved)."""
    geometry: list[RankGeometry] = Field(default_factory=list)
    """Per world rank: ranks, groups and process title (`cptest.topology`); empty when the degrees
    cannot be laid out (a scenario that expects the engine to reject the launch)."""
    probe: bool = True
    eager: bool = False
    """True when per-step evidence is needed and CUDA graphs are disabled for this server."""
    ready_timeout_s: float = 600.0
    shutdown_timeout_s: float = 60.0
    process_title_prefix: str = "sglang::scheduler"
    colocation: Colocation | None = Field(default=None, exclude_if=lambda v: v is None)
    """How the ranks share GPUs when the plan co-locates this server; None: one rank per GPU."""

    @property
    def colocated(self) -> bool:
        return self.colocation is not None


def _absent(value: object) -> bool:
    return value is None


class SamplingParams(_Frozen):
    """Exactly what goes into /generate's `sampling_params` (besides `max_new_tokens`): a setting
    that is None is not sent, so the engine's default applies."""

    temperature: float | None = Field(default=None, exclude_if=_absent)
    top_p: float | None = Field(default=None, exclude_if=_absent)
    top_k: int | None = Field(default=None, exclude_if=_absent)
    sampling_seed: int | None = Field(default=None, exclude_if=_absent)
    ignore_eos: bool | None = Field(default=None, exclude_if=_absent)


class SyntheticPrompt(_Frozen):
    """A prompt the plan names instead of storing: `tokens` token ids of the synthetic stream of
    `seed`, from its token `at`, each in [3, vocab) (`cptest.plan.prompts`). The stream is stable
    across machines and numpy versions, so this pins the ids as exactly as storing them would, in a
    few bytes instead of 4 bytes a token; they are regenerated where they are sent."""

    seed: int
    vocab: int = Field(ge=1)
    at: int = Field(ge=0)
    tokens: int = Field(ge=0)

    def ids(self) -> bytes:
        """The token ids as little-endian uint32 bytes."""
        return synthetic_prompt(self.seed, self.vocab, self.at, self.tokens)


class PlannedRequest(_Frozen):
    """One request, concrete: its token ids are pinned, stored or named in the synthetic stream.

    `prompt` is either the ids themselves, base64 of little-endian uint32 (a dataset's prompts,
    which no seed regenerates, and every prompt of a version 2 plan; a 100k-token prompt is 530 KB
    of JSON as a list and 133 KB this way), or a `SyntheticPrompt` that regenerates them.
    `input_ids` gives the ids either way. Constructing with `input_ids=[...]` is accepted and
    encoded.
    """

    index: int
    prompt: SyntheticPrompt | str
    """base64 of the token ids as little-endian uint32, or where they lie in the synthetic stream."""
    max_new_tokens: int
    sampling: SamplingParams
    return_logprob: bool = True
    send_after_s: float | None = None
    """Open-loop arrival time (rate mode); None in closed-loop concurrency mode."""

    @model_validator(mode="before")
    @classmethod
    def _encode_ids(cls, data: Any) -> Any:
        if isinstance(data, dict) and "input_ids" in data:
            data = dict(data)
            data["prompt"] = encode_ids(data.pop("input_ids"))
        return data

    @property
    def input_ids(self) -> list[int]:
        if isinstance(self.prompt, SyntheticPrompt):
            return _ids_from_bytes(self.prompt.ids())
        return decode_ids(self.prompt)

    @property
    def prompt_len(self) -> int:
        if isinstance(self.prompt, SyntheticPrompt):
            return self.prompt.tokens
        padding = len(self.prompt) - len(self.prompt.rstrip("="))
        return (len(self.prompt) * 3 // 4 - padding) // 4


def encode_ids(ids: Any) -> str:
    """Token ids -> base64 of little-endian uint32 (ids must be in [0, 2**32))."""
    arr = array("I", ids)
    if sys.byteorder != "little":
        arr.byteswap()
    return base64.b64encode(arr.tobytes()).decode("ascii")


def decode_ids(prompt: str) -> list[int]:
    return _ids_from_bytes(base64.b64decode(prompt))


def _ids_from_bytes(data: bytes) -> list[int]:
    arr = array("I")
    arr.frombytes(data)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tolist()


class WorkloadPlan(_Frozen):
    seed: int
    concurrency: int | None
    rate_per_s: float | None
    timeout_s: float
    requests: list[PlannedRequest]
    top_logprobs: int = Field(default=0, exclude_if=lambda v: v == 0)
    """`top_logprobs_num` of every free-running request (the free-running comparison's top-k)."""
    score_topk: int = Field(default=0, exclude_if=lambda v: v == 0)
    """> 0: after its workload each server scores the baseline's sequences (each prompt followed by
    the baseline's output for it) with prompt logprobs and this many top logprobs per position
    (`cptest.run.scoring`); 0: no teacher-forced scoring."""


class FaultPlan(FaultSpec):
    """A scenario's fault, numbered, with the process title of the rank it targets."""

    index: int
    process_title: str | None = None
    """Process title that identifies the rank (`sglang::scheduler_TP<r>`)."""
    node: int | None = Field(default=None, exclude_if=lambda v: v is None)
    """The node process the rank runs in, when the server is co-located (node k runs world rank k):
    the fault acts on that node's process tree only."""


class ModelPin(ModelSource):
    """The model a plan runs: by path, hub id and revision, or synthetic geometry and seed."""

    architecture: str
    """The HF architecture class (`LlamaForCausalLM`)."""
    synthetic: SyntheticGeometry | None = Field(default=None, exclude_if=_absent)


class LayoutContracts(_Frozen):
    """What the degrees imply for the layout contracts (`cptest.topology`), for the reader of a
    plan; `layout` "impossible" when the degrees cannot be laid out (then only `eager` is set)."""

    layout: Literal["possible", "impossible"] = "possible"
    capacity_multiplier: float | None = None
    kv_owner: str | None = None
    kv_replicated_in_dcp_group: bool | None = None
    pcp_split: str | None = None
    min_prompt_for_split: int | None = None
    eager: str | None = None
    """Why every CUDA-graph phase is disabled (per-step evidence), or None."""


class Pins(_Frozen):
    engine: str
    release: str
    image: str | None = None
    image_digest: str | None = None
    model: ModelPin
    cptest_version: str
    scenario_sha256: str
    """sha256 of the canonical scenario (not the raw text: formatting does not change it)."""


class UnsafeDeclaration(_Frozen):
    """A scenario's `unsafe "reason"` and what it covers: the env and flags its release's safety
    table refuses (`cptest.lang.safety`). A plan that has one runs only with `--allow-unsafe`."""

    reason: str
    source: str
    """`file:line:col` of the declaration, relative to the scenario's folder."""
    covers: list[str]
    """Each unsafe entry as written: `env NAME`, `flag --name`."""


class Plan(_Frozen):
    plan_version: int = PLAN_VERSION
    scenario: str
    description: str = ""
    main: ServerPlan
    baseline: ServerPlan | None = None
    control: ServerPlan | None = Field(default=None, exclude_if=lambda v: v is None)
    """The noise-floor control: the baseline's model at another TP degree, scoring the baseline's
    sequences like the main server does (docs/language.md "Generation parity"); None when no bound
    is relative."""
    eager: ServerPlan | None = Field(default=None, exclude_if=lambda v: v is None)
    """The eager twin of `graph parity vs eager`: the main topology and serve options with every
    CUDA-graph phase disabled, no faults (docs/language.md "Graph parity"); None without that contract."""
    workload: WorkloadPlan
    faults: list[FaultPlan] = Field(default_factory=list)
    expectations: list[Expectation] = Field(default_factory=list)
    pins: Pins
    model_facts: ModelFacts | None = None
    contracts: LayoutContracts = Field(default_factory=LayoutContracts)
    """Derived layout contracts (cptest.topology): capacity multiplier, kv owner rule, splits."""
    deadline_s: float = Field(default=DEFAULT_DEADLINE_S, exclude_if=lambda v: v == DEFAULT_DEADLINE_S)
    """Wall-clock limit of the whole run, from the first launch to the last teardown: the scenario's
    `deadline`, else `DEFAULT_DEADLINE_S` (an hour; not written to plan.json when it is the default).
    The runner stops every server when it is reached, tears down as on Ctrl-C and judges the run
    `unknown` (deadline exceeded): a run never hangs without end. Per-request and shutdown timeouts
    stay as they are, within it."""
    unsafe: UnsafeDeclaration | None = Field(default=None, exclude_if=lambda v: v is None)
    """The scenario's `unsafe` declaration; None (and absent from plan.json) when it has none."""
    admission: Admission | None = None
    """What the engine's release table predicts for the main server's launch (accepted, or the
    stage and message of its rejection) and the silent problems it knows of; None where the engine
    states nothing. A record for the reader and for comparing prediction with evidence."""

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("plan_version") == 1:
            data = upgrade_v1(data)  # archives made before the expectations were typed
        if isinstance(data, dict) and data.get("plan_version") == 2:
            data = upgrade_v2(data)  # archives that store every prompt
        return data

    @property
    def placement(self) -> PlacementMode:
        """`colocated` when any server's ranks share GPUs (the whole archive is then labelled so)."""
        return "colocated" if any(s.colocated for s in self.servers()) else "physical"

    def servers(self) -> list[ServerPlan]:
        """The main server, then the baseline, the control and the eager twin where planned."""
        return [self.main] + [s for s in (self.baseline, self.control, self.eager) if s is not None]

    def materialized(self, roots: Mapping[str, Path | str]) -> Plan:
        """This plan with its `cptest.paths` tokens (`<models>/x` in argv and model mounts) replaced
        by `roots`' directories on this machine: what the run launches. The archive keeps the plan
        as made. Raises KeyError naming a token `roots` lacks."""
        return self._map_nodes(lambda n: n.model_copy(update={
            "argv": [materialize(a, roots) for a in n.argv],
            "model_mount": materialize(n.model_mount, roots) if n.model_mount else n.model_mount,
        }))  # fmt: skip

    def with_model_location(self, old: str, new: str) -> Plan:
        """This plan with the model directory `old` replaced by `new` wherever a server names it (a
        rerun that found the archived checkpoint in the model store by its hash)."""
        moved = self._map_nodes(lambda n: n.model_copy(update={
            "argv": [new if a == old else a for a in n.argv],
            "model_mount": new if n.model_mount == old else n.model_mount,
        }))  # fmt: skip
        model = self.pins.model.model_copy(update={"path": new})
        return moved.model_copy(update={"pins": self.pins.model_copy(update={"model": model})})

    def _map_nodes(self, fn: Callable[[NodeLaunch], NodeLaunch]) -> Plan:
        def server(s: ServerPlan | None) -> ServerPlan | None:
            return None if s is None else s.model_copy(update={"nodes": [fn(n) for n in s.nodes]})

        return self.model_copy(update={"main": server(self.main), "baseline": server(self.baseline),
                                       "control": server(self.control), "eager": server(self.eager)})
