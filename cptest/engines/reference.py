"""The CPU reference engine behind the engine protocol, which engine `cptest run` uses, and the CPU
profile of scenarios too big for the reference engine.

`ReferenceEngine` plans `cptest.reference.server` (the engine's own argv module builds and parses
its flags); its scheduler processes are titled like SGLang's with another prefix, so that a fault
never hits the wrong engine.

Pure: the caller says whether a GPU is present. The decision is never silent: every change to the
scenario comes back with a one-line `note` the CLI prints, and the CPU profile is also written into
the plan (its description and the synthetic model's pinned geometry), so the archive says what ran.

- `--engine reference`, or `engine reference` in the scenario: the reference engine.
- `engine sglang` with no GPU (no nvidia-smi): the reference engine, with a note.
- The CPU profile (`CPU_PROFILE`) applies only on the reference engine, only to a *synthetic* model
  whose size exceeds it (Llama-3.1-8B geometry, hidden 4096, would take hours on 2 CPU cores): the
  hidden and MLP widths shrink, the attention geometry (heads, KV heads, head_dim, layers, vocab) and
  the topology stay, and prompts longer than `prompt_max` are capped. The contracts the reference
  checks (row ownership, capacity, generation against its baseline, faults, shutdown) depend on the
  attention geometry and the layout, not on the hidden width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cptest.contracts.base import EngineFacts
from cptest.engines.protocol import RENDEZVOUS_PORT_OFFSET, ColocatedLaunch, ServerLaunch, node_port
from cptest.reference.layout import unsupported
from cptest.reference.server_args import TITLE_PREFIX, ReferenceConfig, build_argv
from cptest.scenario import Scenario
from cptest.topology import Degrees

REFERENCE_RELEASE = "builtin"

LOG_PATTERNS = {
    # cptest/reference/server.py prints it once, for the server: "KV pool: <rows> rows per rank, ...,
    # logical capacity max_total_num_tokens=<rows x dcp>".
    "max_total_num_tokens": r"logical capacity max_total_num_tokens=(?P<tokens>\d+)$",
}


@dataclass(frozen=True)
class ReferenceEngine:
    name: str = "reference"
    release: str = REFERENCE_RELEASE
    title_prefix: str = TITLE_PREFIX
    server_info_paths: tuple[str, ...] = ("/server_info", "/get_server_info")
    """Both, as the SGLang it stands in for (`cptest.reference.server` answers either)."""

    def facts(self) -> EngineFacts:
        # No documented exit statuses: the shutdown contract checks them only when declared.
        return EngineFacts(release=self.release, log_patterns=LOG_PATTERNS, max_total_tokens_per_rank=False)

    def admission(self, scenario: Scenario) -> None:
        return None  # what it refuses, it refuses at launch (reference/layout.reference_problems)

    def unexpressible(self, degrees: Degrees) -> list[str]:
        return unsupported(degrees)

    def colocated(self) -> ColocatedLaunch:
        # Its ranks run on CPU and talk over gloo on loopback whatever the placement: co-location is
        # one node process per rank, nothing else.
        return ColocatedLaunch(env={}, host_id_var=None, flags=(),
                               transport="gloo over TCP on loopback (CPU)", takes_mem_fraction=False)

    def argv(self, launch: ServerLaunch, node_rank: int, nodes: int) -> list[str]:
        serve = launch.serve
        port = node_port(launch.port, node_rank, launch.colocated)
        return build_argv(ReferenceConfig(
            model_path=launch.model_path, degrees=launch.degrees, host=launch.host, port=port,
            page_size=serve.page_size or 1, max_total_tokens=serve.max_total_tokens,
            context_length=serve.context_length, node_rank=node_rank,
            # Node 0 hosts the rendezvous, where SGLang's does (a launcher may put node 0's address there).
            dist_init_addr=f"{launch.host}:{launch.port + RENDEZVOUS_PORT_OFFSET}" if nodes > 1 else None,
        ))  # fmt: skip

CPU_PROFILE: dict[str, int] = {"hidden": 512, "intermediate": 1024, "prompt_max": 256, "prompt_min": 64}
"""Limits of the reference CPU profile (see the module docstring)."""


@dataclass(frozen=True)
class Choice:
    scenario: Scenario
    engine: str
    notes: tuple[str, ...] = ()
    profile: dict[str, Any] | None = None
    """What the CPU profile changed ({field: [declared, used]}), or None."""


def choose(scenario: Scenario, requested: str | None, gpu_present: bool) -> Choice:
    """The scenario to plan and the engine to run it on (see the module docstring)."""
    notes: list[str] = []
    engine = requested or scenario.engine.kind
    if requested is None and engine == "sglang" and not gpu_present:
        engine = "reference"
        notes.append("cptest: no GPU here (nvidia-smi not found): running the CPU reference engine; "
                     "results are labelled `engine: reference` and never count as SGLang qualification")
    if engine == "sglang":
        return Choice(scenario, "sglang")
    s = scenario
    if s.engine.kind != "reference":
        s = s.model_copy(update={"engine": s.engine.model_copy(update={"kind": "reference",
                                                                       "release": REFERENCE_RELEASE,
                                                                       "image": None})})
    s, profile = cpu_profile(s)
    if profile:
        changed = ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in profile.items())
        notes.append(f"cptest: reference CPU profile applied ({changed}); recorded in plan.json")
    return Choice(s, "reference", tuple(notes), profile or None)


def cpu_profile(s: Scenario) -> tuple[Scenario, dict[str, Any]]:
    """The scenario under the CPU profile, and what changed (empty when nothing did)."""
    m = s.model
    changed: dict[str, Any] = {}
    if m.kind != "synthetic":
        return s, changed
    mupd: dict[str, Any] = {}
    fupd: dict[str, Any] = {}
    if (m.hidden or 0) > CPU_PROFILE["hidden"]:
        changed["hidden"] = [m.hidden, CPU_PROFILE["hidden"]]
        mupd["hidden"] = CPU_PROFILE["hidden"]
        fupd["hidden"] = CPU_PROFILE["hidden"]
    if (m.intermediate or 4 * (m.hidden or 0)) > CPU_PROFILE["intermediate"]:
        changed["intermediate"] = [m.intermediate, CPU_PROFILE["intermediate"]]
        mupd["intermediate"] = CPU_PROFILE["intermediate"]
    if not changed:
        return s, changed
    model = m.model_copy(update={**mupd, "facts": m.facts.model_copy(update=fupd)})
    w = s.workload
    pt = w.prompt_tokens
    wupd: dict[str, Any] = {}
    cap, floor = CPU_PROFILE["prompt_max"], CPU_PROFILE["prompt_min"]
    if pt.kind == "uniform" and (pt.hi or 0) > cap:
        new = pt.model_copy(update={"lo": min(pt.lo or 0, floor), "hi": cap})
        changed["prompt_tokens"] = [f"uniform({pt.lo}, {pt.hi})", f"uniform({new.lo}, {new.hi})"]
        wupd["prompt_tokens"] = new
    elif pt.kind == "fixed" and (pt.n or 0) > cap:
        changed["prompt_tokens"] = [f"fixed({pt.n})", f"fixed({cap})"]
        wupd["prompt_tokens"] = pt.model_copy(update={"n": cap})
    elif pt.kind == "choice" and max(pt.choices or [0]) > cap:
        new_choices = sorted({min(int(c), cap) for c in pt.choices or []})
        changed["prompt_tokens"] = [f"choice{tuple(pt.choices or [])}", f"choice{tuple(new_choices)}"]
        wupd["prompt_tokens"] = pt.model_copy(update={"choices": new_choices})
    label = "reference CPU profile: " + ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in changed.items())
    desc = f"[{label}] {s.description or ''}".strip()
    return s.model_copy(update={"model": model, "workload": w.model_copy(update=wupd),
                                "description": desc}), changed
