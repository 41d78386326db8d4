"""The Plan: everything a run needs, as pure JSON-serialisable data (no shell strings anywhere).

`cptest.plan.plan(scenario, ...)` builds it; `cptest.run` executes it; the archive stores it as
`plan.json`, and `cptest rerun` reads it back. Nothing here refers to the scenario's syntax.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PLAN_VERSION = 1


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


class ServerPlan(_Frozen):
    """One server (main or baseline): its nodes and what rank geometry it should have."""

    role: Literal["main", "baseline"]
    engine: Literal["sglang", "reference"]
    release: str
    nodes: list[NodeLaunch]
    base_url: str
    world_size: int
    topology: dict[str, Any]
    """tp, dcp, attn_cp, attn_dp, cp_strategy, prefill_cp, gpus, nodes (resolved)."""
    geometry: list[dict[str, Any]]
    """Per world rank: tp/dcp/attn_cp/attn_tp/attn_dp ranks and groups (cptest.topology)."""
    probe: bool = True
    eager: bool = False
    """True when per-step evidence is needed and CUDA graphs are disabled for this server."""
    ready_timeout_s: float = 600.0
    shutdown_timeout_s: float = 60.0
    process_title_prefix: str = "sglang::scheduler"


class PlannedRequest(_Frozen):
    index: int
    input_ids: list[int]
    max_new_tokens: int
    sampling: dict[str, Any]
    """Exactly what goes into /generate's sampling_params."""
    return_logprob: bool = True
    send_after_s: float | None = None
    """Open-loop arrival time (rate mode); None in closed-loop concurrency mode."""


class WorkloadPlan(_Frozen):
    seed: int
    concurrency: int | None
    rate_per_s: float | None
    timeout_s: float
    requests: list[PlannedRequest]


class FaultPlan(_Frozen):
    index: int
    action: Literal["kill", "stop", "cont", "sigterm", "sigint"]
    target: Literal["rank", "server"]
    rank: int | None = None
    """World rank, when target is a rank."""
    process_title: str | None = None
    """Process title that identifies the rank (`sglang::scheduler_TP<r>`)."""
    at_s: float | None = None
    after_requests: int | None = None
    after_decode_steps: int | None = None
    heal_after_s: float | None = None
    """For stop: send SIGCONT this long after SIGSTOP."""


class Expectation(_Frozen):
    """One declared contract, with every figure the checker needs already resolved."""

    checker: str
    """launch, rows, capacity, generation, graph, serving, shutdown, log."""
    params: dict[str, Any] = Field(default_factory=dict)
    expect_violation: bool = False
    """The scenario declares this contract is broken (a no-go is a valid result)."""
    source: str = ""
    """file:line:col of the expectation in the scenario."""


class Pins(_Frozen):
    engine: str
    release: str
    image: str | None = None
    image_digest: str | None = None
    model: dict[str, Any]
    """kind, path or id, revision, sha256 (weights), architecture facts."""
    cptest_version: str
    scenario_sha256: str
    """sha256 of the canonical scenario (not the raw text: formatting does not change it)."""


class Plan(_Frozen):
    plan_version: int = PLAN_VERSION
    scenario: str
    description: str = ""
    main: ServerPlan
    baseline: ServerPlan | None = None
    workload: WorkloadPlan
    faults: list[FaultPlan] = Field(default_factory=list)
    expectations: list[Expectation] = Field(default_factory=list)
    pins: Pins
    model_facts: dict[str, Any] = Field(default_factory=dict)
    """architecture, layers, hidden, heads, kv_heads, head_dim, vocab, is_mla."""
    contracts: dict[str, Any] = Field(default_factory=dict)
    """Derived layout contracts (cptest.topology): capacity multiplier, kv owner rule, splits."""
