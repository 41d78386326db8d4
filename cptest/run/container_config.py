"""What a container of a planned node is made of: labels, GPUs, environment, mounts (pure: tested
without an engine). The docker launcher (`cptest.run.docker`) creates containers from these."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker.types

from cptest.errors import Problem, RunError
from cptest.image.lock import cptest_volume
from cptest.plan.model import NodeLaunch

LABEL_RUN = "cptest.run"
LABEL_ROLE = "cptest.role"
LABEL_NODE = "cptest.node"
LABEL_SCENARIO = "cptest.scenario"
LABEL_LAUNCHER = "cptest.launcher"
"""Always `docker`: `.ci/container-engine.sh stop` and `sweep` find our containers by it."""


def container_labels(run_id: str, role: str, scenario: str, node_rank: int | None = None) -> dict[str, str]:
    """The labels the supervisor passes to `start` and `sweep` (node is added by `start`)."""
    labels = {LABEL_RUN: run_id, LABEL_ROLE: role, LABEL_SCENARIO: scenario}
    if node_rank is not None:
        labels[LABEL_NODE] = str(node_rank)
    return labels


def gpu_device_requests(gpu_ids: list[int]) -> list[docker.types.DeviceRequest]:
    """The device request for exactly these GPUs; no request at all for a CPU node."""
    if not gpu_ids:
        return []
    return [docker.types.DeviceRequest(device_ids=[str(g) for g in gpu_ids], capabilities=[["gpu"]])]


GPU_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
"""The driver's device nodes every CUDA process opens besides its GPUs' (`nvidia-modeset` where present)."""


def gpu_device_nodes(gpu_ids: list[int], minors: Mapping[int, int], dev: Path = Path("/dev")) -> list[str]:
    """Docker `devices` entries (`HOST:CONTAINER:rwm`) for exactly these GPUs: `/dev/nvidia<minor>`
    of each and the control nodes present; RunError when a GPU's node is missing (an infrastructure
    fault: the run is `unknown`, never an engine failure)."""
    if not gpu_ids:
        return []
    nodes = [dev / f"nvidia{minors[g]}" for g in gpu_ids]
    missing = [str(n) for n in nodes if not n.exists()]
    if missing:
        raise RunError(Problem(None, f"GPU device node(s) {', '.join(missing)} not found on this host",
                               hint="the GPUs the plan names must exist here (nvidia-smi -L)"))
    nodes += [dev / n for n in GPU_CONTROL_NODES if (dev / n).exists()]
    return [f"{n}:{n}:rwm" for n in nodes]


def gpu_access_of(version: Mapping[str, Any]) -> str:
    """`engine_gpu_access` from the engine's /version answer: Podman names itself in a component."""
    components = version.get("Components") or []
    names = [str(c.get("Name", "")) for c in components if isinstance(c, dict)]
    return "device_nodes" if any("podman" in n.lower() for n in names) else "device_requests"


def container_env(node: NodeLaunch) -> dict[str, str]:
    """The node's env; with GPUs, CUDA_VISIBLE_DEVICES renumbered as the container sees them (0..n-1)."""
    env = dict(node.env)
    if node.gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(node.gpu_ids)))
    return env


def container_config(
    node: NodeLaunch,
    labels: Mapping[str, str],
    *,
    probe_dir: Path | None = None,
    ipc_mode: str = "host",
    shm_size: str | None = "16g",
    init: bool = True,
    cptest_mount: str | None = None,
    device_nodes: list[str] | None = None,
    driver_mounts: tuple[str, ...] = (),
    gpus: bool = True,
) -> dict[str, Any]:
    """Keyword arguments for `client.containers.create` of this node (image checked elsewhere).

    `cptest_mount`: the image runs cptest from there (its lock entry says so): the running cptest
    package is mounted read-only under it and PYTHONPATH points at it. `device_nodes` (an engine
    that ignores device requests: `gpu_device_nodes`): the GPUs go in as these devices, with
    `driver_mounts` bound read-only, instead of a device request. `gpus` False: no GPU at all (a
    reference-engine node, which models GPUs on the CPU)."""
    if node.image is None:
        raise RunError(Problem(None, f"node {node.node_rank} has no image; the docker launcher needs one",
                               hint="give the scenario's engine an image, or use the process launcher"))
    volumes: dict[str, dict[str, str]] = {}
    if node.model_mount:
        volumes[node.model_mount] = {"bind": node.model_mount, "mode": "ro"}
    if probe_dir is None and node.env.get("CPTEST_PROBE_DIR"):
        # The runner tells the ranks where to write their evidence: it must be the host's folder.
        probe_dir = Path(node.env["CPTEST_PROBE_DIR"])
    if probe_dir is not None:
        volumes[str(probe_dir)] = {"bind": str(probe_dir), "mode": "rw"}
    env = container_env(node)
    if cptest_mount:
        volumes.update(cptest_volume(cptest_mount))
        env["PYTHONPATH"] = cptest_mount
    if device_nodes and gpus:
        for m in driver_mounts:
            volumes[m] = {"bind": m, "mode": "ro"}
    config: dict[str, Any] = {
        "image": node.image,
        "command": list(node.argv),
        "environment": env,
        "labels": {**labels, LABEL_NODE: str(node.node_rank), LABEL_LAUNCHER: "docker"},
        "network_mode": "host",
        "ipc_mode": ipc_mode,
        "init": init,
        "volumes": volumes,
        "detach": True,
        "device_requests": [] if device_nodes or not gpus else gpu_device_requests(node.gpu_ids),
    }
    if device_nodes and gpus:
        config["devices"] = list(device_nodes)
    if node.cpus:  # a suite's placement: the container runs on these host CPUs only
        config["cpuset_cpus"] = ",".join(str(c) for c in node.cpus)
    # With the host's IPC namespace /dev/shm is the host's: Docker ignores shm_size there and
    # Podman refuses the pair ("cannot set shmsize when running in the host IPC Namespace").
    if shm_size and ipc_mode != "host":
        config["shm_size"] = shm_size
    return config
