"""The docker launcher's check of a plan's images before anything starts (`pin_images`), and what a
lock entry with `engine`/`cptest_mount` asks of a container; no engine needed (a stand-in client)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import docker.errors
import pytest

import cptest
from cptest.errors import RunError
from cptest.image.lock import ImageLock
from cptest.plan.model import NodeLaunch, Plan
from cptest.run.container_config import container_config
from cptest.run.docker import DockerLauncher
from cptest.run.preflight import InfrastructureError

REPO = Path(__file__).resolve().parents[2]
SCENARIO = f"""\
cptest 1
scenario docker_pins {{
  extends "{REPO / 'scenarios' / 'defaults' / 'tiny.cps'}"
  engine reference "builtin"
  model synthetic llama {{ layers 2 hidden 128 heads 4 kv_heads 1 head_dim 32 vocab 512 intermediate 256 }}
  topology {{ gpus 2 tp 2 dcp 2 }}
  baseline {{ tp 2 }}
}}
"""
REF = "localhost/cptest-reference:test"
DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


class Images:
    def __init__(self, held: dict[str, str]) -> None:
        self.held = held

    def get(self, ref: str) -> Any:
        if ref not in self.held:
            raise docker.errors.ImageNotFound(f"no such image: {ref}")
        return type("Image", (), {"attrs": {"Id": self.held[ref], "RepoDigests": []}, "id": self.held[ref]})()


class Client:
    def __init__(self, held: dict[str, str]) -> None:
        self.images = Images(held)


def lock(**entry: Any) -> ImageLock:
    return ImageLock.from_data({"lock_version": 1, "images": {REF: {
        "digest": DIGEST, "status": "pinned", "engine": "reference", "cptest_mount": "/opt/cptest",
        **entry}}})


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    """A reference-engine plan (main and baseline), as `cptest compile` makes it."""
    path = tmp_path_factory.mktemp("pins") / "docker_pins.cps"
    path.write_text(SCENARIO)
    done = subprocess.run([sys.executable, "-m", "cptest", "compile", str(path), "--json"], cwd=REPO,
                          capture_output=True, text=True, check=True)
    return Plan.model_validate_json(done.stdout)


def launcher(held: dict[str, str], the_lock: ImageLock | None = None) -> DockerLauncher:
    return DockerLauncher(lock=the_lock or lock(), client=Client(held))  # type: ignore[arg-type]


def causes(fn: Any) -> list[tuple[str, str]]:
    with pytest.raises(InfrastructureError) as err:
        fn()
    assert err.value.exit_code == 3
    return [(c.code, c.line()) for c in err.value.causes]


def test_a_reference_node_naming_no_image_runs_the_locks_reference_image_and_the_pins_record_its_digest(plan):
    pinned = launcher({REF: DIGEST}).pin_images(plan)
    assert {n.image for s in pinned.servers() for n in s.nodes} == {REF}
    assert (pinned.pins.image, pinned.pins.image_digest) == (REF, DIGEST)
    assert pinned.main.nodes[0].argv == plan.main.nodes[0].argv  # nothing else changes


def test_an_image_the_engine_does_not_hold_is_unknown_image_missing_saying_how_to_build_it(plan):
    held_none = launcher({}, lock(build="cptest image build reference"))
    found = causes(lambda: held_none.pin_images(plan))
    assert [c for c, _ in found] == ["image_missing"]
    assert f"pinned {DIGEST}" in found[0][1] and "cptest image build reference" in found[0][1]


def test_an_image_of_another_digest_is_unknown_image_mismatch_naming_both(plan):
    [(code, line)] = causes(lambda: launcher({REF: OTHER}).pin_images(plan))
    assert code == "image_mismatch" and f"pinned {DIGEST}; the engine has {OTHER}" in line


def test_a_lock_with_no_image_for_the_engine_is_unknown_image_unpinned(plan):
    no_default = ImageLock.from_data({"lock_version": 1,
                                      "images": {REF: {"digest": DIGEST, "status": "pinned"}}})
    [(code, line)] = causes(lambda: launcher({REF: DIGEST}, no_default).pin_images(plan))
    assert code == "image_unpinned" and "cptest image build reference --update-lock" in line


def test_a_rerun_of_a_plan_that_ran_another_digest_is_unknown_image_mismatch(plan):
    ran = launcher({REF: OTHER}, lock(digest=OTHER)).pin_images(plan)
    [(code, line)] = causes(lambda: launcher({REF: DIGEST}).pin_images(ran))
    assert code == "image_mismatch" and f"the plan ran {REF} with digest {OTHER}" in line


def test_no_engine_is_unknown_container_engine_down(plan):
    down = DockerLauncher(lock=lock(), base_url="unix:///nonexistent/cptest.sock")
    [(code, _)] = causes(lambda: down.pin_images(plan))
    assert code == "container_engine_down"


def test_a_second_image_for_one_engine_is_refused_when_the_lock_is_read():
    with pytest.raises(RunError, match="a second image for engine 'reference'"):
        ImageLock.from_data({"lock_version": 1, "images": {
            "a:1": {"digest": DIGEST, "status": "pinned", "engine": "reference"},
            "b:1": {"digest": OTHER, "status": "pinned", "engine": "reference"}}})


def node(**kw: Any) -> NodeLaunch:
    return NodeLaunch(**{"node_rank": 0, "image": REF, "gpu_ids": [], "env": {}, "argv": ["python3"],
                         "port": 1, **kw})


def test_an_image_run_from_cptest_gets_the_running_package_read_only_and_pythonpath():
    config = container_config(node(), {}, cptest_mount="/opt/cptest")
    package = str(Path(cptest.__file__).resolve().parent)
    assert config["volumes"][package] == {"bind": "/opt/cptest/cptest", "mode": "ro"}
    assert config["environment"]["PYTHONPATH"] == "/opt/cptest"
    assert "PYTHONPATH" not in container_config(node(), {})["environment"]


def test_the_folder_the_runner_names_for_rank_evidence_is_mounted_read_write(tmp_path: Path):
    config = container_config(node(env={"CPTEST_PROBE_DIR": str(tmp_path)}), {})
    assert config["volumes"] == {str(tmp_path): {"bind": str(tmp_path), "mode": "rw"}}
