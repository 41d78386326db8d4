"""A node's planned argv and environment, as a pod of a LeaderWorkerSet runs them.

The plan's argv is launched on one host: `--host 127.0.0.1`, the model at `<models>/NAME`, node 0's
address in `--dist-init-addr` and each node's rank written out. In a LeaderWorkerSet every pod of the
group is made from one template, and LWS tells each pod where it stands through its environment, as
SGLang's own LWS example maps them (kubernetes-sigs/lws, docs/examples/sglang/lws.yaml):

    --dist-init-addr $(LWS_LEADER_ADDRESS):PORT   the leader pod's DNS name, the plan's rendezvous port
    --nnodes $(LWS_GROUP_SIZE)                    the group's size: the server's nodes
    --node-rank $(LWS_WORKER_INDEX)               0 for the leader, 1.. for the workers

Kubernetes expands `$(NAME)` in a container's command and env values, so every `$` the plan itself
carries is written `$$` (Kubernetes' escape): an argument reaches SGLang exactly as planned.
"""

from __future__ import annotations

from cptest.errors import PlanError, Problem
from cptest.paths import MODELS, SCENARIO

MODELS_MOUNT = "/cptest/models"
"""Where the pod sees the model store (`<models>`): the models volume, read-only."""
EVIDENCE_MOUNT = "/cptest/evidence"
"""Where the pod sees the evidence volume; the probe writes under it (CPTEST_PROBE_DIR)."""
LISTEN_HOST = "0.0.0.0"
"""The pod's server listens on every address: 127.0.0.1 is unreachable from a Service."""

LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
GROUP_SIZE = "$(LWS_GROUP_SIZE)"
WORKER_INDEX = "$(LWS_WORKER_INDEX)"


def escape(value: str) -> str:
    """`value` with Kubernetes' `$(NAME)` expansion disarmed: `$` becomes `$$`."""
    return value.replace("$", "$$")


def model_path(value: str) -> str:
    """A `cptest.paths` token in `value` as the pod's mount; a hub id or anything else as it is.

    A checkpoint beside the scenario (`<scenario>/PATH`) has no place in a cluster: PlanError."""
    if value == MODELS or value.startswith(MODELS + "/"):
        return MODELS_MOUNT + value[len(MODELS):]
    if value == SCENARIO or value.startswith(SCENARIO + "/"):
        raise PlanError(Problem(
            None, f"the model is a checkpoint beside the scenario ({value}): a cluster cannot mount it",
            hint="put it in the model store (`cptest models add DIR`) and name it there, or use a hub id"))
    return value


def pod_argv(argv: list[str], nodes: int) -> list[str]:
    """The pod's command for a node's planned `argv` of a server of `nodes` nodes: the same for
    every node of the server (PlanError names what differs when it is not; see `common_argv`)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        flag = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else None
        if value is not None and flag in ("--host", "--nnodes", "--node-rank", "--dist-init-addr"):
            out += [flag, _mapped(flag, value, nodes)]
            i += 2
            continue
        out.append(model_path(flag) if flag.startswith("<") else escape(flag))
        i += 1
    return out


def _mapped(flag: str, value: str, nodes: int) -> str:
    if flag == "--host":
        return LISTEN_HOST
    if flag == "--nnodes":
        if value != str(nodes):
            raise PlanError(Problem(None, f"--nnodes {value} in a server of {nodes} node(s)"))
        return GROUP_SIZE
    if flag == "--node-rank":
        return WORKER_INDEX
    return f"{LEADER_ADDRESS}:{rendezvous_port(value)}"


def rendezvous_port(addr: str) -> int:
    """The port of a `--dist-init-addr HOST:PORT`."""
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise PlanError(Problem(None, f"--dist-init-addr {addr!r} is not HOST:PORT"))
    return int(port)


def common_argv(argvs: list[list[str]], nodes: int) -> list[str]:
    """The one pod command of all the nodes' planned argvs. A LeaderWorkerSet has a single worker
    template, so nodes that differ in anything but their rank cannot be one: PlanError."""
    mapped = [pod_argv(a, nodes) for a in argvs]
    for k, other in enumerate(mapped[1:], start=1):
        if other != mapped[0]:
            diff = [f"{a!r} / {b!r}" for a, b in zip(mapped[0], other, strict=False) if a != b][:3]
            raise PlanError(Problem(None, f"node {k}'s argv differs from node 0's beyond its rank "
                                    f"({', '.join(diff) or 'length'}): one LWS template cannot run both"))
    return mapped[0]
