"""Reading an archived plan beside this cptest's re-plan of the same scenario.

An archive is never rewritten, so its plan.json keeps what the planner of its day decided.
`cptest.plan.upgrade` brings an older file's *schema* to the current Plan; this module is the one
place that knows what an older *planner* decided differently, and reads an archived plan and its
re-plan in the form in which the two can be compared (`comparable`). The comparisons
(`cptest.plan.compare`) see two `Reading`s and know nothing of planner generations.

A generation is recognised from the archived plan alone (`generation_of`); a new planner change
that would make an old archive read as tampered adds a generation here, with the archives it keeps
valid, rather than a branch where plans are compared.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from cptest import paths
from cptest.plan.build import EXPLICIT_MEM_FRACTION
from cptest.plan.model import Placement, Plan
from cptest.plan.workload import prompt_sha256


@dataclass(frozen=True)
class Generation:
    """What a planner wrote that the current one writes differently, as the comparison needs it."""

    name: str
    model_by_path: bool
    """The plan names the model directory by an absolute path where a plan now says
    `<models>/NAME`: the directory is read as `<model>` wherever it stands, and which model it is,
    the pinned tree hash decides."""
    extra_flags: tuple[tuple[str, str], ...]
    """Flag pairs this planner put into argv that the current one leaves to the engine; each only
    disables something. Every other argv difference is tampering or a planner change to list here."""
    eager_label: bool
    """The server's `eager` label means what it means now (this planner did not set it whenever
    decode graphs were off)."""
    same_prompts: bool
    """This planner generated the same prompts as the current one."""


ABSOLUTE_MOUNTS = Generation("absolute model mounts", model_by_path=True,
                             extra_flags=(("--cuda-graph-backend-prefill", "disabled"),),
                             eager_label=False, same_prompts=False)
"""The planner before model mounts were written as `<models>/NAME`: every mount of its plans is an
absolute path of the machine that ran it."""

CURRENT = Generation("current", model_by_path=False, extra_flags=(), eager_label=True, same_prompts=True)


def generation_of(archived: Plan) -> Generation:
    """The planner generation that made `archived`: the older one when every model mount is an
    absolute path (and there is one), else the current one."""
    mounts = [n.model_mount for s in archived.servers() for n in s.nodes if n.model_mount]
    return ABSOLUTE_MOUNTS if mounts and all(os.path.isabs(m) for m in mounts) else CURRENT


METADATA = ("source", "violated_on")
"""Fields of an expectation that say where it was written or what it annotates, never how evidence
is judged: the oldest archives hold absolute sources, and some no `violated_on`."""


@dataclass(frozen=True)
class Reading:
    """A plan read as the archive's planner generation can be compared: each view leaves out what
    that generation decided differently from the current planner, and what legitimately differs
    between the run and now (the image digest and model hash pinned at run time, where each
    expectation was written)."""

    plan: Plan
    generation: Generation

    def expectations(self) -> list[dict[str, Any]]:
        """Each expectation as it decides a verdict: its kind and parameters, without `METADATA` (and
        without its log patterns' `source` note)."""
        out = []
        for e in self.plan.expectations:
            d = {k: v for k, v in e.model_dump(mode="json").items() if k not in METADATA}
            if isinstance(d.get("log_patterns"), dict):
                d["log_patterns"] = {k: v for k, v in d["log_patterns"].items() if k != "source"}
            out.append(d)
        return out

    def servers(self) -> list[dict[str, Any]]:
        """Each server's role, engine, release, size, degrees, node count and probe."""
        return [{"role": s.role, "engine": s.engine, "release": s.release, "world_size": s.world_size,
                 "degrees": s.topology.model_dump(mode="json"), "nodes": len(s.nodes), "probe": s.probe}
                for s in self.plan.servers()]  # fmt: skip

    def executed(self) -> dict[str, list[dict[str, Any]]]:
        """What each server's nodes execute, by role: argv, environment, image (without the digest a
        run pins), model mount, GPU ids, host. The model directory is `<model>` wherever it stands
        when the generation names it by path, and for a model given by its path (`model local`),
        which a plan writes relative to the scenario's folder: the archived scenario lies in another
        folder than the one the run was planned from, so the same model has another relative path
        there."""

        def node(n: Any) -> dict[str, Any]:
            by_path = bool(n.model_mount) and n.model_mount.startswith(paths.SCENARIO + "/")
            model = n.model_mount if self.generation.model_by_path or by_path else None
            return {"argv": ["<model>" if model and a == model else a for a in n.argv], "env": dict(n.env),
                    "image": n.image.split("@", 1)[0] if n.image else None,
                    "model_mount": "<model>" if model else n.model_mount, "gpu_ids": list(n.gpu_ids),
                    "host": n.host}

        return {s.role: [node(n) for n in s.nodes] for s in self.plan.servers()}

    def launch(self) -> dict[str, dict[str, Any]]:
        """By role: what each node executes (`executed`, without the generation's extra flags) and
        the serve options of the server that are not argv (its `eager` label where the generation's
        means what it means now)."""
        executed = self.executed()
        out = {}
        for s in self.plan.servers():
            nodes = [n | {"argv": self._without_extra_flags(n["argv"])} for n in executed[s.role]]
            serve = {"ready_timeout_s": s.ready_timeout_s, "shutdown_timeout_s": s.shutdown_timeout_s,
                     "process_title_prefix": s.process_title_prefix, "probe": s.probe,
                     "geometry": [g.model_dump(mode="json") for g in s.geometry],
                     "colocation": s.colocation.model_dump(mode="json") if s.colocation else None}
            if self.generation.eager_label:
                serve["eager"] = s.eager
            out[s.role] = {"nodes": nodes, "serve": serve}
        return out

    def workload(self) -> dict[str, Any]:
        """The workload as it decides what is sent: every field, each prompt as the hash of its token
        ids however the plan holds them (stored, or named in the synthetic stream, as plans of
        version 3 do), and no prompt at all where the generation's prompts differ from this
        planner's."""
        w = self.plan.workload.model_dump(mode="json")
        requests = w.pop("requests")
        for planned, r in zip(self.plan.workload.requests, requests, strict=True):
            r.pop("prompt")
            if self.generation.same_prompts:
                r["prompt_sha256"] = prompt_sha256(planned.input_ids)
        return w | {"requests": requests}

    def _without_extra_flags(self, argv: list[str]) -> list[str]:
        out, i = [], 0
        while i < len(argv):
            if tuple(argv[i:i + 2]) in self.generation.extra_flags:
                i += 2
                continue
            out.append(argv[i])
            i += 1
        return out


def comparable(archived: Plan, planned: Plan) -> tuple[Reading, Reading]:
    """The archived plan and this cptest's re-plan of its scenario, both read as the archive's
    planner generation can be compared."""
    generation = generation_of(archived)
    return Reading(archived, generation), Reading(planned, generation)


def placement_of(archived: Plan) -> Placement:
    """Where the archived run's servers ran: the same ports and GPUs (CPUs only where this machine
    has them all, else unpinned)."""
    node = archived.main.nodes[0]
    # The baseline's port is also the control's and the eager twin's (their runs never overlap); a
    # plan may have the twin without a baseline (`graph parity vs eager free_running topk K`).
    second = next((s for s in (archived.baseline, archived.control, archived.eager) if s is not None), None)
    base = second.nodes[0].port if second is not None else Placement().baseline_port
    cpus = node.cpus
    if cpus and not set(cpus) <= set(os.sched_getaffinity(0)):
        cpus = None
    colocated = [s.colocation for s in archived.servers() if s.colocation is not None]
    if colocated:
        # The GPUs the ranks were spread over, in the order the widest server took them.
        widest = max(colocated, key=lambda c: len(c.rank_gpus))
        gpus = list(dict.fromkeys(widest.rank_gpus))
        explicit = widest.mem_fraction if widest.mem_fraction_basis == EXPLICIT_MEM_FRACTION else None
        return Placement(main_port=node.port, baseline_port=base, gpus=gpus, cpus=cpus, mode="colocated",
                         rank_mem_fraction=explicit)
    return Placement(main_port=node.port, baseline_port=base, gpus=list(node.gpu_ids) or None, cpus=cpus)
