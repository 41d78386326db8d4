"""Plan -> Kubernetes objects: per server one LeaderWorkerSet of `nodes` pods and its leader's Service.

Pure: the plan, the image and the volume names in, dicts out (`yaml_text.dump` writes them).
Modelled on SGLang's LWS example (kubernetes-sigs/lws docs/examples/sglang/lws.yaml): a leader and a
worker template running `python3 -m sglang.launch_server` with LWS's environment in its arguments
(`cptest.k8s.argv`), GPUs as `nvidia.com/gpu` limits, a memory-backed `/dev/shm` for NCCL,
`restartPolicy: RecreateGroupOnPodRestart`, and a Service selecting the leader by
`leaderworkerset.sigs.k8s.io/name` and `role: leader`. What cptest adds: the plan's environment and
probe (`CPTEST_PROBE_DIR` on an evidence volume, `--forward-hooks` as planned), the model store as a
read-only volume, a startup probe on `/health` for as long as the plan waits for readiness, a
readiness probe on `/health_generate` (what cptest's own readiness asks, D47), the plan's shutdown
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
ENGINES = ("sglang",)
"""Engines whose image carries what a pod needs. The reference engine's image has no cptest in it:
the docker launcher mounts the running checkout into it (D44), and a cluster has no checkout."""


@dataclass(frozen=True)
class Image:
    """The image every pod runs (`cptest.k8s.image.resolve` chooses it)."""

    reference: str
    pinned: bool
    """True when the reference names a digest (`NAME@sha256:...`): every pod pulls the same bytes."""
    note: str | None = None
    """What the user should know about it (an unpinned or unbuilt image), or None."""


def is_pinned(reference: str) -> bool:
    return "@sha256:" in reference


@dataclass(frozen=True)
class Volumes:
    models_claim: str = "cptest-models"
    """PersistentVolumeClaim holding the model store (`cptest models make`/`add` write one)."""
    evidence_claim: str = "cptest-evidence"
    """PersistentVolumeClaim the probe writes rank files to (ReadWriteMany across nodes)."""


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
    LeaderWorkerSet cannot run: another engine than SGLang, a model beside the scenario, nodes that
    differ beyond their rank, a volume claim that is not a valid name."""
    vols = volumes or Volumes()
    for claim in (vols.models_claim, vols.evidence_claim):
        if len(claim) > 253 or not DNS_SUBDOMAIN.match(claim):
            raise PlanError(Problem(None, f"volume claim {claim!r} is not a valid name",
                                    expected="an RFC 1123 subdomain (lower case, digits, '-', '.')"))
    digest = plan_sha256(plan)
    objects: list[dict[str, Any]] = []
    for server in plan.servers():
        if server.engine not in ENGINES:
            raise PlanError(Problem(None, f"{server.role}: the {server.engine} engine cannot run in a "
                                    "cluster: its image runs cptest mounted from this checkout (D44)",
                                    hint="--target lws renders SGLang servers; run the reference engine "
                                         "with --launcher process or docker"))
        objects += _server(plan, server, image, vols, digest)
    return Rendered(objects, digest, [image.note] if image.note else [])


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
    uses_models = any(a == MODELS or a.startswith(MODELS + "/") for a in nodes[0].argv)
    gpus = len(nodes[0].gpu_ids)

    def template(role: str) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": server.engine,
            "image": image.reference,
            "command": argv,
            "env": [{"name": k, "value": escape(v)} for k, v in sorted(env.items())],
            "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
            "volumeMounts": _mounts(uses_models, server.probe),
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
                "volumes": _volumes(vols, uses_models, server.probe),
                "terminationGracePeriodSeconds": math.ceil(server.shutdown_timeout_s),
            },
        }

    annotations = {f"{PREFIX}plan-sha256": digest, f"{PREFIX}scenario-sha256": plan.pins.scenario_sha256,
                   f"{PREFIX}image-pinned": "true" if image.pinned else "false"}
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


def _mounts(models: bool, evidence: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if models:
        out.append({"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True})
    if evidence:
        out.append({"name": "evidence", "mountPath": EVIDENCE_MOUNT})
    return out


def _volumes(vols: Volumes, models: bool, evidence: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}]
    if models:
        out.append({"name": "models", "persistentVolumeClaim": {"claimName": vols.models_claim,
                                                                  "readOnly": True}})
    if evidence:
        out.append({"name": "evidence", "persistentVolumeClaim": {"claimName": vols.evidence_claim}})
    return out
