"""Plan -> Kubernetes objects: per server one LeaderWorkerSet of `nodes` pods and its leader's Service.

Pure: the plan, the image and the volume names in, dicts out (`yaml_text.dump` writes them).
Both engines, as the docker launcher runs them: SGLang on GPUs from its image (cptest installed in
it); the CPU reference engine from its image with cptest's source on a read-only volume at the image's
`cptest_mount`, on PYTHONPATH (the docker launcher mounts the checkout there), CPU and memory
requested instead of GPUs.
Modelled on SGLang's LWS example (kubernetes-sigs/lws docs/examples/sglang/lws.yaml): a leader and a
worker template running `python3 -m sglang.launch_server` with LWS's environment in its arguments
(`cptest.k8s.argv`), GPUs as `nvidia.com/gpu` limits, a memory-backed `/dev/shm` for NCCL,
`restartPolicy: RecreateGroupOnPodRestart`, and a Service selecting the leader by
`leaderworkerset.sigs.k8s.io/name` and `role: leader`. What cptest adds: the plan's environment and
probe (`CPTEST_PROBE_DIR` on an evidence volume, `--forward-hooks` as planned), the model store as a
read-only volume, a startup probe on `/health` for as long as the plan waits for readiness, a
readiness probe on `/health_generate` (what cptest's own readiness asks), the plan's shutdown
time as the grace period, and labels naming the scenario, the role and the plan's hash.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

from cptest.errors import PlanError, Problem
from cptest.k8s.argv import EVIDENCE_MOUNT, MODELS_MOUNT, common_argv, escape, rendezvous_port
from cptest.k8s.names import DNS_SUBDOMAIN, PREFIX, dns_label, label_value
from cptest.paths import MODELS
from cptest.plan.model import Plan, ServerPlan

API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
"""The label LWS puts on every pod of a LeaderWorkerSet (and what SGLang's example selects on)."""
GPU_RESOURCE = "nvidia.com/gpu"
"""NVIDIA's device plugin's resource name."""
SHM_SIZE = "16Gi"
"""The docker launcher's shm_size (cptest/run/docker.py), as the memory-backed emptyDir's limit."""
PROBE_PERIOD_S = 10
GPU_ENGINES = ("sglang",)
"""Engines whose pods get the node's GPUs (`nvidia.com/gpu`)."""
SOURCE_ENGINES = ("reference",)
"""Engines whose image holds no cptest: the pods mount cptest's source from the source claim
at `Image.cptest_mount` and put it on PYTHONPATH, as the docker launcher does with the checkout.
The reference engine is CPU only: its plan's `gpu_ids` are placement bookkeeping, not devices."""
ENGINES = GPU_ENGINES + SOURCE_ENGINES
CPU_PER_PROCESS = 1
"""Cores requested per process of a reference node: each rank runs torch on one thread
(cptest.reference.server.RANK_THREADS) and the server (or a follower node's parent) is one more."""
MEMORY_PER_PROCESS_GI = 1
"""GiB requested per process of a reference node: a rank's torch import is ~220 MB resident, its
share of a synthetic model and KV pool (65536 tokens) tens to a few hundred MB."""


@dataclass(frozen=True)
class Image:
    """The image every pod runs (`cptest.k8s.image.resolve` chooses it)."""

    reference: str
    pinned: bool
    """True when the reference names a digest (`NAME@sha256:...`): every pod pulls the same bytes."""
    note: str | None = None
    """What the user should know about it (an unpinned or unbuilt image), or None."""
    lock_digest: str | None = None
    """The digest images/lock.json pins for this reference (a local build's image ID: the config's
    sha256, what a node's runtime reports for the image), annotated as `cptest/image-lock-digest`."""
    cptest_mount: str | None = None
    """Where the image expects cptest's source (`SOURCE_ENGINES`; the lock entry's `cptest_mount`)."""


def is_pinned(reference: str) -> bool:
    return "@sha256:" in reference


@dataclass(frozen=True)
class Volumes:
    models_claim: str = "cptest-models"
    """PersistentVolumeClaim holding the model store (`cptest models make`/`add` write one)."""
    evidence_claim: str = "cptest-evidence"
    """PersistentVolumeClaim the probe writes rank files to (ReadWriteMany across nodes)."""
    source_claim: str = "cptest-source"
    """PersistentVolumeClaim holding cptest's source (a folder with `cptest/` at its root), mounted
    read-only where the reference engine's image expects it; unused by SGLang's pods."""


@dataclass(frozen=True)
class Rendered:
    objects: list[dict[str, Any]]
    """LeaderWorkerSet then Service, per server in the plan's order (main, baseline, control)."""
    plan_sha256: str
    notes: list[str] = field(default_factory=list)


def plan_sha256(plan: Plan) -> str:
    """sha256 of the plan's compact JSON (`Plan.model_dump_json()`): names this exact plan, the
    requests' token ids included."""
    return hashlib.sha256(plan.model_dump_json().encode()).hexdigest()


def render(plan: Plan, image: Image, volumes: Volumes | None = None) -> Rendered:
    """Every server of `plan` as a LeaderWorkerSet and a Service. PlanError (exit 2) for what a
    LeaderWorkerSet cannot run: an engine cptest does not know, a model beside the scenario, nodes that
    differ beyond their rank, a volume claim that is not a valid name."""
    vols = volumes or Volumes()
    for claim in (vols.models_claim, vols.evidence_claim, vols.source_claim):
        if len(claim) > 253 or not DNS_SUBDOMAIN.match(claim):
            raise PlanError(Problem(None, f"volume claim {claim!r} is not a valid name",
                                    expected="an RFC 1123 subdomain (lower case, digits, '-', '.')"))
    digest = plan_sha256(plan)
    objects: list[dict[str, Any]] = []
    for server in plan.servers():
        if server.engine not in ENGINES:
            raise PlanError(Problem(None, f"{server.role}: no pod is known for the {server.engine} engine",
                                    expected=", ".join(ENGINES)))
        if server.engine in SOURCE_ENGINES and not image.cptest_mount:
            raise PlanError(Problem(None, f"{server.role}: the {server.engine} engine's image "
                                    f"{image.reference} holds no cptest and no mount point for it is known",
                                    hint="use the image lock's image for the engine (images/lock.json)"))
        objects += _server(plan, server, image, vols, digest)
    notes = [image.note] if image.note else []
    if any(s.engine in SOURCE_ENGINES for s in plan.servers()):
        # The plan's hash covers cptest's version, and the pods run whatever the claim holds.
        notes.append(f"the pods run cptest from PersistentVolumeClaim {vols.source_claim} at "
                     f"{image.cptest_mount} (read-only): copy cptest/ of cptest {plan.pins.cptest_version}, "
                     "the version this plan was made with, to its root")
    return Rendered(objects, digest, notes)


def _server(plan: Plan, server: ServerPlan, image: Image, vols: Volumes, digest: str) -> list[dict[str, Any]]:
    name = dns_label(f"{plan.scenario}-{server.role}")
    nodes = sorted(server.nodes, key=lambda n: n.node_rank)
    argv = common_argv([n.argv for n in nodes], len(nodes))
    http = nodes[0].port
    labels = {f"{PREFIX}scenario": label_value(plan.scenario), f"{PREFIX}role": server.role,
              f"{PREFIX}plan": digest[:16]}
    env = dict(nodes[0].env)
    if server.probe:
        # Laid out as an archive's evidence/<role>/ (store.Layout), one folder per scenario hash.
        run = f"{dns_label(plan.scenario, 63)}-{plan.pins.scenario_sha256[:8]}"
        env["CPTEST_PROBE_DIR"] = f"{EVIDENCE_MOUNT}/{run}/{server.role}"
    source = image.cptest_mount if server.engine in SOURCE_ENGINES else None
    if source:
        env["PYTHONPATH"] = source  # as the docker launcher sets it: the image's Python finds cptest there
    uses_models = any(a == MODELS or a.startswith(MODELS + "/") for a in nodes[0].argv)
    resources = _resources(server)

    def template(role: str) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": server.engine,
            "image": image.reference,
            "command": argv,
            "env": [{"name": k, "value": escape(v)} for k, v in sorted(env.items())],
            "resources": resources,
            "volumeMounts": _mounts(uses_models, server.probe, source),
        }
        if role == "leader":
            ports = [{"name": "http", "containerPort": http, "protocol": "TCP"}]
            if len(nodes) > 1:
                rendezvous = rendezvous_port(argv[argv.index("--dist-init-addr") + 1])
                ports.append({"name": "dist-init", "containerPort": rendezvous, "protocol": "TCP"})
            container["ports"] = ports
            container["startupProbe"] = {
                "httpGet": {"path": "/health", "port": "http"}, "periodSeconds": PROBE_PERIOD_S,
                "failureThreshold": max(1, math.ceil(server.ready_timeout_s / PROBE_PERIOD_S)),
            }
            container["readinessProbe"] = {
                "httpGet": {"path": "/health_generate", "port": "http"},
                "periodSeconds": PROBE_PERIOD_S, "timeoutSeconds": PROBE_PERIOD_S, "failureThreshold": 3,
            }
        return {
            "metadata": {"labels": {**labels, "role": role}},
            "spec": {
                "containers": [container],
                "volumes": _volumes(vols, uses_models, server.probe, source),
                "terminationGracePeriodSeconds": math.ceil(server.shutdown_timeout_s),
            },
        }

    annotations = {f"{PREFIX}plan-sha256": digest, f"{PREFIX}scenario-sha256": plan.pins.scenario_sha256,
                   f"{PREFIX}image-pinned": "true" if image.pinned else "false"}
    if image.lock_digest:
        annotations[f"{PREFIX}image-lock-digest"] = image.lock_digest
    lws = {
        "apiVersion": API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "replicas": 1,
            # LeaderReady would start the workers only once the leader is ready, and an SGLang leader
            # is ready only once every node's ranks have joined: it would never start.
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": len(nodes),
                # One lost rank ends the whole server (SGLang kills its tree): restart the group.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": template("leader"),
                "workerTemplate": template("worker"),
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{name}-leader", "labels": labels},
        "spec": {
            "type": "ClusterIP",
            "selector": {LWS_NAME_LABEL: name, "role": "leader"},
            "ports": [{"name": "http", "port": http, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    return [lws, service]


def _resources(server: ServerPlan) -> dict[str, Any]:
    """SGLang: the node's GPUs as a limit (the device plugin picks them). The reference engine: no
    GPU; a core and `MEMORY_PER_PROCESS_GI` per process of its busiest node (its ranks and the server),
    requested but not limited: a memory limit the model outgrew would OOM-kill a rank, which reads as
    a rank fault (SIGKILL) in a scenario that injects exactly that, and a CPU limit only throttles."""
    if server.engine in GPU_ENGINES:
        return {"limits": {GPU_RESOURCE: str(len(server.nodes[0].gpu_ids))}}
    ranks = max(sum(1 for g in server.geometry if g.node == n.node_rank) for n in server.nodes)
    processes = max(ranks, 1) + 1
    return {"requests": {"cpu": str(processes * CPU_PER_PROCESS),
                         "memory": f"{processes * MEMORY_PER_PROCESS_GI}Gi"}}


def _mounts(models: bool, evidence: bool, source: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if models:
        out.append({"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True})
    if evidence:
        out.append({"name": "evidence", "mountPath": EVIDENCE_MOUNT})
    if source:
        out.append({"name": "cptest-source", "mountPath": source, "readOnly": True})
    return out


def _volumes(vols: Volumes, models: bool, evidence: bool, source: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}]
    if models:
        out.append({"name": "models", "persistentVolumeClaim": {"claimName": vols.models_claim,
                                                                  "readOnly": True}})
    if evidence:
        out.append({"name": "evidence", "persistentVolumeClaim": {"claimName": vols.evidence_claim}})
    if source:
        out.append({"name": "cptest-source", "persistentVolumeClaim": {"claimName": vols.source_claim,
                                                                         "readOnly": True}})
    return out
