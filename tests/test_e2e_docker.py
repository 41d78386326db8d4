"""End to end in real containers: `cptest run --launcher docker` of a reference-engine scenario against
a Docker-API engine (Podman's service in CI), on the image `cptest image build reference` makes from
images/lock.json's pinned inputs, its digest checked before any container starts and recorded in
the archive.

Skipped, with the reason, only when no engine answers; CI starts one (`.ci/container-engine.sh
start`, which sets CPTEST_REQUIRE_ENGINE=1), and there a missing engine fails instead. The image is
built once per session (`reference_image`: about 30 s and 740 MB on 2 cores, nothing at all when
the engine already holds the pinned digest); the run itself takes about 15 s.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cptest.testing.archives import archived_text

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "images" / "lock.json"
ENGINE_DIR = Path(os.environ.get("CPTEST_ENGINE_DIR", "/tmp/cptest-engine"))
BASE_URL = os.environ.get("DOCKER_HOST") or f"unix://{ENGINE_DIR / 'podman.sock'}"

SCENARIO = """\
cptest 1
scenario docker_reference_dcp2 {{
  description "DCP2 on TP2 on the reference engine, in a container"
  extends "{defaults}"
  engine reference "builtin"
  model synthetic llama {{
    layers 2
    hidden 128
    heads 4
    kv_heads 1
    head_dim 32
    vocab 512
    intermediate 256
    seed 7
  }}
  topology {{ gpus 2 tp 2 dcp 2 }}
  baseline none
  workload {{ requests 6 concurrency 3 prompt_tokens uniform(16, 96) output_tokens 6 }}
  expect {{
    rows kv_owner position % 2
    capacity logical == 2 * physical
  }}
}}
"""


def _engine() -> tuple[Any, str]:
    try:
        import docker

        client = docker.DockerClient(base_url=BASE_URL, timeout=30)
        client.ping()
    except Exception as e:  # noqa: BLE001 - any failure means: no engine here
        return None, (f"no container engine answers at {BASE_URL} ({type(e).__name__}); "
                      "run: set -a; eval \"$(.ci/container-engine.sh start)\"; set +a")
    return client, ""


CLIENT, WHY = _engine()
if CLIENT is None and os.environ.get("CPTEST_REQUIRE_ENGINE") == "1":
    raise RuntimeError(WHY)  # CI: an engine was started, so not reaching it is a failure
pytestmark = pytest.mark.skipif(CLIENT is None, reason=WHY)


def _cptest(*args: str, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cptest", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "DOCKER_HOST": BASE_URL, **(env or {})})


def _pinned() -> tuple[str, str]:
    """(reference, digest) of the lock's reference-engine image."""
    images = json.loads(LOCK.read_text())["images"]
    ref, entry = next((r, e) for r, e in images.items() if e.get("engine") == "reference")
    return ref, entry["digest"]


def _ports() -> str:
    socks = [socket.socket() for _ in range(2)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = ",".join(str(s.getsockname()[1]) for s in socks)
    for s in socks:
        s.close()
    return ports


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "docker_reference_dcp2.cps"
    path.write_text(SCENARIO.format(defaults=REPO / "scenarios" / "defaults" / "tiny.cps"))
    return path


def _ours(scenario: str) -> list[str]:
    found = CLIENT.containers.list(all=True, filters={"label": f"cptest.scenario={scenario}"})
    return [c.short_id for c in found]


@pytest.fixture(scope="session")
def reference_image() -> dict[str, Any]:
    """The pinned reference image in the engine (built and loaded when absent), as the build reports it."""
    done = _cptest("image", "build", "reference", "--json")
    assert done.returncode == 0, f"cptest image build reference failed:\n{done.stdout}\n{done.stderr}"
    built = json.loads(done.stdout)
    assert (built["reference"], built["digest"]) == _pinned()
    return built


def test_a_reference_scenario_runs_end_to_end_in_a_container_and_the_archive_records_the_digest(
        reference_image: dict[str, Any], tmp_path: Path) -> None:
    ref, digest = _pinned()
    assert CLIENT.images.get(ref).id == digest
    done = _cptest("run", str(_scenario(tmp_path)), "--launcher", "docker", "--results",
                   str(tmp_path / "results"), "--ports", _ports(), "--json")
    try:
        verdict = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"no JSON verdict (exit {done.returncode}):\n{done.stdout}\n{done.stderr}") \
            from None
    reasons = [(v["checker"], v["status"], v["reason"]) for v in verdict["verdicts"] if v["status"] != "pass"]
    assert (done.returncode, verdict["status"]) == (0, "pass"), (reasons, done.stderr[-3000:])
    assert verdict["engine"] == "reference"
    archive = Path(verdict["archive"])
    manifest = json.loads((archive / "manifest.json").read_text())
    plan = json.loads((archive / "plan.json").read_text())
    assert (manifest["pins"]["image"], manifest["pins"]["image_digest"]) == (ref, digest)
    assert (plan["pins"]["image"], plan["pins"]["image_digest"]) == (ref, digest)
    assert all(n["image"] == ref for n in plan["main"]["nodes"])
    # It ran in the container's pid namespace: the engine's own pid is not the host pid the runner saw.
    log = archived_text(archive / "logs" / "main-node0.log")
    inside = int(re.search(r"cptest reference engine .* pid (\d+)", log).group(1))
    runner = archived_text(archive / "evidence" / "main" / "runner.jsonl")
    samples = [json.loads(line) for line in runner.splitlines()]
    host = {p["pid"] for s in samples if s.get("kind") == "processes" for p in s["procs"]
            if p.get("scope") == "tree" and p["title"] == "cptest-ref::server"}
    assert host and inside not in host
    assert _ours("docker_reference_dcp2") == []  # every container of the run was removed
    assert _cptest("verify", str(archive)).returncode == 0


def test_an_image_of_another_digest_than_the_lock_is_unknown_before_anything_starts_or_is_archived(
        reference_image: dict[str, Any], tmp_path: Path) -> None:
    lock = json.loads(LOCK.read_text())
    ref, _ = _pinned()
    lock["images"][ref]["digest"] = "sha256:" + "0" * 64
    other = tmp_path / "lock.json"
    other.write_text(json.dumps(lock))
    results = tmp_path / "results"
    done = _cptest("run", str(_scenario(tmp_path)), "--launcher", "docker", "--results", str(results),
                   "--ports", _ports(), env={"CPTEST_IMAGE_LOCK": str(other)})
    assert done.returncode == 3, done.stderr
    line = next(ln for ln in done.stderr.splitlines() if ln.startswith("unknown ("))
    assert line.startswith("unknown (image_mismatch): image 'localhost/cptest-reference:")
    assert f"pinned sha256:{'0' * 64}; the engine has {reference_image['digest']}" in line
    assert "cptest image build reference" in line  # the remedy: the lock entry's build instruction
    assert not results.exists() or not any(results.rglob("manifest.json"))
    assert _ours("docker_reference_dcp2") == []
