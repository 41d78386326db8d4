"""The typed scenario model: what a `.cps` file means, independent of its syntax.

`cptest.lang.parse_text` / `parse_file` build these values; nothing else should construct them from
text.  Every node is frozen and keeps where it came from (`span`, and `field_spans` per setting), so
later stages (plan, lint) can point at the exact line of a setting.  Positions are excluded from
`model_dump()`, from the JSON Schema and from equality: formatting a file moves text around, and
`parse(fmt(x)) == parse(x)` must still hold.

Field names are the contract the plan, lint and check stages code against; change them only together.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.json_schema import SkipJsonSchema

from cptest.contracts import CONTRACTS, Contract, Declared
from cptest.node import Node
from cptest.topology import Degrees

SCHEMA_VERSION = 1
"""The `cptest N` header this model implements."""


class Engine(Node):
    kind: Literal["sglang", "reference"]
    release: str
    """SGLang release, a key of `cptest.engines.sglang.releases.KNOWN_RELEASES`; "builtin" for the
    reference engine. Checked by the plan stage."""
    image: str | None = None


class ModelFacts(Node):
    """What later stages need to know about the model, whatever its kind."""

    architecture: str
    """HF architecture class name, e.g. "LlamaForCausalLM"."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    """Query/key head dimension; for MLA, qk_nope_head_dim + qk_rope_head_dim."""
    vocab: int
    is_mla: bool = False
    dsa_indexer: bool | None = Field(default=None, exclude_if=lambda v: v is None)
    """Whether the checkpoint has a DSA indexer (HF `index_topk`), read from its config only for the
    architectures SGLang's DSA test names (`DSA_CANDIDATES`); None: not read, the architecture
    decides. Absent from the dump when None, so that every other model keeps its plan."""


class SyntheticGeometry(BaseModel):
    """A synthetic checkpoint's architecture, geometry and seed: everything `cptest.run.models`
    needs to write the same weights again on any machine (the plan pins it, `ModelPin.synthetic`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    architecture: Literal["llama", "qwen3", "qwen3_moe", "deepseek_mla"] | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    vocab: int | None = None
    intermediate: int | None = None
    seed: int | None = None
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    experts: int | None = Field(default=None, exclude_if=lambda v: v is None)
    """qwen3_moe only: routed experts per layer (HF `num_experts`). This and the two below are absent
    from the dump when unset, so that every other geometry keeps its store name and every scenario
    written before them its hash."""
    experts_per_tok: int | None = Field(default=None, exclude_if=lambda v: v is None)
    """qwen3_moe only: experts each token is routed to (HF `num_experts_per_tok`)."""
    moe_intermediate: int | None = Field(default=None, exclude_if=lambda v: v is None)
    """qwen3_moe only: each expert's intermediate size (HF `moe_intermediate_size`)."""

    def store_name(self) -> str:
        """The checkpoint's name in the model store: its architecture and a key over everything that
        determines its bytes (sorted keys: not the order the fields were declared in)."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return f"{self.architecture}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


class ModelSource(BaseModel):
    """Where a model comes from: a local directory, a hub id at a revision, or synthetic weights
    (the plan pins the same fields, `ModelPin`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["local", "hub", "synthetic"]
    path: str | None = None
    """local: directory, resolved against the scenario file's directory."""
    id: str | None = None
    revision: str | None = None
    sha256: str | None = None


class Model(Node, ModelSource, SyntheticGeometry):
    """The model to serve. The geometry fields (`SyntheticGeometry`) are set for `synthetic` only."""

    facts: ModelFacts

    def synthetic_geometry(self) -> SyntheticGeometry | None:
        if self.kind != "synthetic":
            return None
        return SyntheticGeometry.model_validate({k: getattr(self, k) for k in SyntheticGeometry.model_fields})


class Topology(Node, Degrees):
    """The main server's parallel degrees as written (`cptest.topology.Degrees`, with positions).

    `gpus` is required here; `prefill_cp` defaults to True iff `cp_strategy` is set (resolved by the
    parser).
    """

    gpus: int
    cp_strategy: Literal["zigzag", "interleave"] | None = None


GraphMode = Literal["full", "breakable", "disabled"]


class Serve(Node):
    attention_backend: str | None = None
    cuda_graph_decode: GraphMode | None = None
    cuda_graph_prefill: GraphMode | None = None
    page_size: int | None = None
    max_total_tokens: int | None = None
    mem_fraction: float | None = None
    context_length: int | None = None
    sampling_backend: str | None = None
    skip_tokenizer_init: bool = True
    extra_flags: list[list[str]] = Field(default_factory=list)
    """Pass-through flags with their values, checked against the release flag table by lint/plan."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment of the server processes (e.g. a release's `pcp_force_env` set to 1)."""


class Baseline(Node):
    """Overrides applied to the scenario's topology to get the baseline (parity reference) run."""

    tp: int | None = None
    dcp: int | None = None
    attn_cp: int | None = None
    attn_dp: int | None = None
    prefill_cp: bool | None = None
    cp_strategy: Literal["zigzag", "interleave"] | None = None
    gpus: int | None = None


class Dist(Node):
    """A token-count distribution: fixed(n), uniform(lo, hi) inclusive, or choice(a, b, ...)."""

    kind: Literal["fixed", "uniform", "choice"]
    n: int | None = None
    lo: int | None = None
    hi: int | None = None
    choices: list[int] | None = None

    def bounds(self) -> tuple[int, int]:
        """Smallest and largest value the distribution can produce."""
        if self.kind == "fixed":
            return (self.n or 0, self.n or 0)
        if self.kind == "uniform":
            return (self.lo or 0, self.hi or 0)
        return (min(self.choices or [0]), max(self.choices or [0]))


class Sampling(Node):
    mode: Literal["greedy", "sample"] = "greedy"
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None


class Workload(Node):
    requests: int
    concurrency: int | None = None
    rate: float | None = None
    """Open-loop arrivals per second; exactly one of concurrency and rate is set."""
    seed: int = 0
    prompt_tokens: Dist
    output_tokens: Dist
    sampling: Sampling = Field(default_factory=Sampling)
    logprobs: bool = True
    source: Literal["synthetic", "dataset"] = "synthetic"
    dataset_path: str | None = None
    """When source is "dataset": the file, resolved against the scenario file's directory."""
    timeout_s: float = 120.0
    ignore_eos: bool = True
    fill_drain: float | None = Field(default=None, exclude_if=lambda v: v is None)
    """`fill_drain P`: a closed loop whose concurrency the plan sizes so that the requests in flight
    hold P of the main server's logical KV pool, one more waits at the limit, and the pool drains at
    the end (`cptest.plan.fill_drain`). None: the declared concurrency or rate."""


class FaultSpec(BaseModel):
    """One fault: what is sent to which target, and when (the plan's `FaultPlan` adds the rank's
    process title)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: Literal["kill", "stop", "cont", "sigterm", "sigint"]
    target: Literal["rank", "server"]
    rank: int | None = None
    """World rank, when the target is a rank."""
    at_s: float | None = None
    after_requests: int | None = None
    after_decode_steps: int | None = None
    heal_after_s: float | None = None
    """stop only: send SIGCONT this long after SIGSTOP (`for 5s`)."""


class Fault(Node, FaultSpec):
    """A fault as written in the scenario."""


class _Declared(Node):
    """The declared expectations. Each kind is defined by its contract module (`cptest.contracts`)."""

    def entries(self) -> list[tuple[str, Declared]]:
        """Every declared expectation as (contract name, entry), in the registry's order."""
        out: list[tuple[str, Declared]] = []
        for name in CONTRACTS:
            value = getattr(self, name)
            if isinstance(value, list):
                out += [(name, e) for e in value]
            elif value is not None:
                out.append((name, value))
        return out


def _absent(value: Any) -> bool:
    return value is None or value == []


def _field(contract: Contract[Any, Any]) -> tuple[Any, Any]:
    """One contract's field: a list when it may repeat, else optional. A contract that is not
    `dumped_when_absent` is left out of the dump when not declared (see that flag)."""
    kind: Any = list[contract.expect] if contract.repeatable else contract.expect | None
    default: dict[str, Any] = {"default_factory": list} if contract.repeatable else {"default": None}
    if not contract.dumped_when_absent:
        default["exclude_if"] = _absent
    return kind, Field(**default)


Expect = create_model("Expect", __base__=_Declared, __module__=__name__, __doc__=_Declared.__doc__,
                      **{name: _field(c) for name, c in CONTRACTS.items()})
"""The declared expectations: one field per contract of the registry, by its name, in its order (a
graph is a list, at most one per phase, decode before prefill; a log, any number)."""


class Scenario(Node):
    name: str
    description: str | None = None
    exclusive: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """Why the scenario must have the machine to itself (its contracts judge timing that another
    server on the same GPUs or cores would disturb); a suite then runs it alone. None: it may share."""
    unsafe: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """Why the scenario sets environment or flags that load code or config (`unsafe "reason"`,
    `cptest.lang.safety`); running it then needs `cptest run --allow-unsafe`. None: it sets none."""
    deadline_s: float | None = Field(default=None, exclude_if=lambda v: v is None)
    """The whole run's wall-clock limit as declared (`deadline 2h`); None: the default
    (`cptest.lang.tables.DEFAULT_DEADLINE_S`), which the plan records as `Plan.deadline_s`."""
    includes: list[str] = Field(default_factory=list)
    """Resolved paths of the files pulled in through `extends`, nearest first."""
    engine: Engine
    model: Model
    topology: Topology
    serve: Serve = Field(default_factory=Serve)
    baseline: Baseline | None = None
    workload: Workload
    faults: list[Fault] = Field(default_factory=list)
    expect: Expect = Field(default_factory=Expect)
    source_file: SkipJsonSchema[str] = Field(default="<input>", exclude=True)

    def baseline_topology(self) -> Topology | None:
        """The baseline run's topology (see `baseline_topology`), or None without a baseline."""
        return baseline_topology(self.topology, self.baseline) if self.baseline is not None else None


def baseline_topology(topo: Topology, base: Baseline) -> Topology | None:
    """The baseline's topology: the main topology with CP removed, then the overrides applied.

    Unset overrides mean: tp and pp and nodes from the main topology, dcp 1, attn_cp 1, attn_dp 1,
    no prefill CP, and gpus = tp x pp.  So `baseline { tp 2 }` is a TP-only run on 2 GPUs.
    Returns None when the result is not a valid Topology (the caller reports it).
    """
    tp = base.tp if base.tp is not None else topo.tp
    strategy = base.cp_strategy
    spans = {k: sp for k, sp in base.field_spans.items()}
    try:
        return Topology(
            gpus=base.gpus if base.gpus is not None else tp * topo.pp,
            nodes=topo.nodes if (base.gpus or tp * topo.pp) % topo.nodes == 0 else 1,
            tp=tp, dcp=base.dcp or 1, attn_cp=base.attn_cp or 1, attn_dp=base.attn_dp or 1, pp=topo.pp,
            prefill_cp=base.prefill_cp if base.prefill_cp is not None else strategy is not None,
            cp_strategy=strategy, span=base.span, field_spans=spans,
        )  # fmt: skip
    except ValidationError:
        return None


def json_schema() -> dict[str, Any]:
    """The JSON Schema that `cptest schema` prints."""
    return Scenario.model_json_schema()
