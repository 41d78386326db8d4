"""The Plan: everything a run needs, as pure JSON-serialisable data (no shell strings anywhere).

`cptest.plan.plan(scenario, ...)` builds it; `cptest.run` executes it; the archive stores it as
`plan.json`, and `cptest rerun` reads it back. Nothing here refers to the scenario's syntax.
"""

from __future__ import annotations

import base64
import sys
from array import array
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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
    """One request, concrete: its token ids are stored, not a recipe for them.

    The ids are kept as `prompt`, base64 of little-endian uint32 (a 100k-token prompt is 530 KB of
    JSON as a list and 133 KB this way, and encoding is C-speed); `input_ids` decodes them.
    Constructing with `input_ids=[...]` is accepted and encoded.
    """

    index: int
    prompt: str
    """base64 of the token ids as little-endian uint32."""
    max_new_tokens: int
    sampling: dict[str, Any]
    """Exactly what goes into /generate's sampling_params."""
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
        return decode_ids(self.prompt)

    @property
    def prompt_len(self) -> int:
        padding = len(self.prompt) - len(self.prompt.rstrip("="))
        return (len(self.prompt) * 3 // 4 - padding) // 4


def encode_ids(ids: Any) -> str:
    """Token ids -> base64 of little-endian uint32 (ids must be in [0, 2**32))."""
    arr = array("I", ids)
    if sys.byteorder != "little":
        arr.byteswap()
    return base64.b64encode(arr.tobytes()).decode("ascii")


def decode_ids(prompt: str) -> list[int]:
    arr = array("I")
    arr.frombytes(base64.b64decode(prompt))
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tolist()


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
