"""What the docker launcher asks the engine for, checked without an engine (pure functions)."""

from __future__ import annotations

from pathlib import Path

import docker.types
import pytest

from cptest.errors import RunError
from cptest.image.lock import ImageLock
from cptest.plan.model import NodeLaunch
from cptest.run.container_config import (
    LABEL_LAUNCHER,
    LABEL_NODE,
    container_config,
    container_labels,
    gpu_access_of,
    gpu_device_nodes,
    gpu_device_requests,
)
from cptest.run.docker import _top_pids, exit_status, image_digests

DIGEST = "sha256:" + "ab" * 32


def node(**kw) -> NodeLaunch:
    base = dict(node_rank=1, image="sglang-cptest:0.5.17", gpu_ids=[4, 5, 6, 7],
                env={"CUDA_VISIBLE_DEVICES": "4,5,6,7", "SGLANG_PLUGINS": "cptest_probe"},
                argv=["python3", "-m", "sglang.launch_server", "--tp-size", "4"], port=30000,
                model_mount="/models/llama")
    return NodeLaunch(**{**base, **kw})


def test_gpu_device_request_names_exactly_the_node_gpus_with_the_gpu_capability():
    (request,) = gpu_device_requests([4, 5, 6, 7])
    assert isinstance(request, docker.types.DeviceRequest)
    assert request.device_ids == ["4", "5", "6", "7"]
    assert request.capabilities == [["gpu"]]
    assert request.count in (None, 0)  # count and device_ids are exclusive in the Engine API
    assert request.driver == ""


def test_a_cpu_node_gets_no_device_request():
    assert gpu_device_requests([]) == []
    assert container_config(node(gpu_ids=[]), {})["device_requests"] == []


def test_inside_the_container_gpus_are_renumbered_from_zero():
    assert container_config(node(), {})["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_a_cpu_node_keeps_its_environment_unchanged():
    env = {"CUDA_VISIBLE_DEVICES": "", "X": "1"}
    assert container_config(node(gpu_ids=[], env=env), {})["environment"] == env


def test_container_runs_the_argv_list_never_a_shell_string():
    config = container_config(node(), {})
    assert config["command"] == ["python3", "-m", "sglang.launch_server", "--tp-size", "4"]
    assert "entrypoint" not in config


def test_container_uses_host_network_host_ipc_an_init_and_detaches():
    config = container_config(node(), {})
    assert (config["network_mode"], config["ipc_mode"], config["init"], config["detach"]) == (
        "host", "host", True, True)


def test_shm_size_applies_only_with_a_private_ipc_namespace():
    assert "shm_size" not in container_config(node(), {}, ipc_mode="host", shm_size="16g")
    assert container_config(node(), {}, ipc_mode="private", shm_size="16g")["shm_size"] == "16g"


def test_model_is_mounted_read_only_and_probe_dir_read_write_at_the_same_paths(tmp_path: Path):
    volumes = container_config(node(), {}, probe_dir=tmp_path)["volumes"]
    assert volumes == {"/models/llama": {"bind": "/models/llama", "mode": "ro"},
                       str(tmp_path): {"bind": str(tmp_path), "mode": "rw"}}


def test_labels_add_the_node_rank_and_the_launcher_to_the_callers():
    labels = container_labels("r1", "baseline", "dcp4")
    assert container_config(node(), labels)["labels"] == {
        **labels, LABEL_NODE: "1", LABEL_LAUNCHER: "docker"}


def test_a_node_without_an_image_is_a_run_error_naming_the_process_launcher():
    with pytest.raises(RunError, match="process launcher"):
        container_config(node(image=None), {})


@pytest.mark.parametrize(("code", "status"), [(0, 0), (1, 1), (128, 128), (137, -9), (143, -15),
                                              (192, -64), (193, 193), (None, None)])
def test_exit_codes_above_128_read_as_signal_deaths_like_subprocess(code, status):
    assert exit_status(code) == status


def test_top_pids_read_docker_columns_and_podman_whole_lines():
    docker_top = {"Titles": ["UID", "PID", "PPID", "CMD"],
                  "Processes": [["root", "9383", "9370", "/sbin/docker-init"], ["root", "9390", "9383", "x"]]}
    podman_top = {"Titles": ["PID   USER     COMMAND"],
                  "Processes": [["1 root     /run/podman-init -- sh"], ["6 root     sleep 1000"]]}
    assert _top_pids(docker_top) == [9383, 9390]
    assert _top_pids(podman_top) == [1, 6]
    assert _top_pids({}) == []


def test_image_digests_are_the_id_then_each_repo_digest():
    attrs = {"Id": DIGEST, "RepoDigests": ["localhost/x@sha256:" + "cd" * 32]}
    assert image_digests(attrs) == [DIGEST, "sha256:" + "cd" * 32]


def lock_of(images: dict, version: int = 1) -> ImageLock:
    return ImageLock.from_data({"lock_version": version, "images": images}, "lock.json")


def test_a_pinned_entry_needs_a_sha256_digest():
    with pytest.raises(RunError) as err:
        lock_of({"a:1": {"digest": "sha256:short"}, "b:1": {"status": "pinned"}})
    assert len(err.value.problems) == 2
    assert all(p.expected == "sha256:<64 hex digits>" for p in err.value.problems)


def test_an_unbuilt_entry_must_not_carry_a_digest_and_an_unknown_status_is_named():
    with pytest.raises(RunError) as err:
        lock_of({"a:1": {"digest": DIGEST, "status": "unbuilt"}, "b:1": {"digest": None, "status": "built"}})
    found = {p.found for p in err.value.problems}
    assert found == {repr(DIGEST), "'built'"}


def test_an_unknown_lock_version_is_refused():
    with pytest.raises(RunError, match="lock_version"):
        lock_of({}, version=2)


def test_lock_entry_of_an_unpinned_reference_suggests_the_closest_one():
    lock = lock_of({"sglang-cptest:0.5.17": {"digest": DIGEST}})
    assert lock.entry("sglang-cptest:0.5.17").digest == DIGEST
    with pytest.raises(RunError, match="did you mean 'sglang-cptest:0.5.17'"):
        lock.entry("sglang-cptest:0.5.71")


def test_an_unbuilt_entry_is_refused_with_its_build_instruction():
    lock = lock_of({"x:1": {"digest": None, "status": "unbuilt", "build": "run make-image"}})
    with pytest.raises(RunError) as err:
        lock.entry("x:1")
    assert "unbuilt" in str(err.value) and "run make-image" in str(err.value) and '"pinned"' in str(err.value)


def test_a_missing_lock_file_is_a_run_error(tmp_path: Path):
    with pytest.raises(RunError, match="does not exist"):
        ImageLock.load(tmp_path / "lock.json")


def test_an_unknown_lock_entry_key_is_refused_with_the_closest_known_key():
    with pytest.raises(RunError, match="did you mean 'digest'"):
        lock_of({"a:1": {"digset": DIGEST}})


def _devdir(tmp_path: Path, *names: str) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    for n in names:
        (dev / n).write_text("")
    return dev


def test_gpu_device_nodes_name_each_gpus_minor_and_the_control_nodes_present(tmp_path: Path):
    dev = _devdir(tmp_path, "nvidia0", "nvidia3", "nvidia7", "nvidiactl", "nvidia-uvm")
    got = gpu_device_nodes([5, 6], {5: 3, 6: 7}, dev)  # minors need not equal the indices
    assert got == [f"{dev}/nvidia3:{dev}/nvidia3:rwm", f"{dev}/nvidia7:{dev}/nvidia7:rwm",
                   f"{dev}/nvidiactl:{dev}/nvidiactl:rwm", f"{dev}/nvidia-uvm:{dev}/nvidia-uvm:rwm"]
    assert gpu_device_nodes([], {}, dev) == []


def test_a_missing_gpu_device_node_is_refused_before_any_container(tmp_path: Path):
    dev = _devdir(tmp_path, "nvidia0", "nvidiactl")
    with pytest.raises(RunError, match="nvidia1 not found"):
        gpu_device_nodes([0, 1], {0: 0, 1: 1}, dev)


def test_device_nodes_replace_the_device_request_and_bring_the_driver_mounts():
    devices = ["/dev/nvidia4:/dev/nvidia4:rwm", "/dev/nvidiactl:/dev/nvidiactl:rwm"]
    cfg = container_config(node(gpu_ids=[4]), {}, device_nodes=devices, driver_mounts=("/usr/local/nvidia",))
    assert cfg["devices"] == devices and cfg["device_requests"] == []
    assert cfg["volumes"]["/usr/local/nvidia"] == {"bind": "/usr/local/nvidia", "mode": "ro"}
    assert cfg["environment"]["CUDA_VISIBLE_DEVICES"] == "0"
    plain = container_config(node(gpu_ids=[4]), {}, driver_mounts=("/usr/local/nvidia",))
    assert "devices" not in plain and "/usr/local/nvidia" not in plain["volumes"]  # Docker: the hook's job


def test_podman_is_told_apart_from_docker_by_its_version_answer():
    # the components of each engine's /version answer, as each returns them
    podman = {"Components": [{"Name": "Podman Engine", "Version": "4.3.1"},
                             {"Name": "Conmon", "Version": "conmon version 2.1.6"}]}
    moby = {"Components": [{"Name": "Engine", "Version": "27.3.1"}, {"Name": "containerd"},
                           {"Name": "runc"}, {"Name": "docker-init"}]}
    assert gpu_access_of(podman) == "device_nodes"
    assert gpu_access_of(moby) == "device_requests"
    assert gpu_access_of({}) == "device_requests"


def test_the_lock_reads_driver_mounts_and_refuses_relative_ones():
    entry = {"digest": DIGEST, "status": "pinned", "driver_mounts": ["/usr/local/nvidia"]}
    lock = ImageLock.from_data({"lock_version": 1, "images": {"x:1": entry}})
    assert lock.entries["x:1"].driver_mounts == ("/usr/local/nvidia",)
    with pytest.raises(RunError, match="driver_mounts must be a list of absolute host paths"):
        ImageLock.from_data({"lock_version": 1, "images": {"x:1": {**entry, "driver_mounts": ["usr/lib"]}}})


def test_a_node_without_gpus_asks_for_none_whatever_ids_it_models():
    cfg = container_config(node(gpu_ids=[0, 1]), {}, device_nodes=["/dev/nvidia0:/dev/nvidia0:rwm"],
                           driver_mounts=("/usr/local/nvidia",), gpus=False)
    assert cfg["device_requests"] == [] and "devices" not in cfg
    assert "/usr/local/nvidia" not in cfg["volumes"]
