"""cptest/k8s: a plan as LeaderWorkerSets and Services (render, argv, image, names, YAML, the CLI)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cptest.errors import PlanError
from cptest.interface import adapter
from cptest.k8s import argv as pod
from cptest.k8s import image as images
from cptest.k8s.names import dns_label, label_value, name_problems
from cptest.k8s.render import LWS_NAME_LABEL, Image, Volumes, render
from cptest.k8s.validate import validate_all
from cptest.k8s.yaml_text import dump, load
from cptest.lang import parse_file, parse_text
from cptest.plan import plan
from cptest.plan.model import Plan

ROOT = Path(__file__).resolve().parents[2]
TWO_NODES = ROOT / "scenarios" / "tp4_dcp2_two_nodes_sglang.cps"

TEXT = """cptest 1
scenario multi_node_t {
  engine sglang "0.5.17"
  model synthetic llama { layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 vocab 128 intermediate 128 }
  topology { gpus 4 nodes 2 tp 4 dcp 2 }
  serve { env "SGLANG_T" "a$(HOME)b" }
  workload { requests 4 concurrency 2 prompt_tokens 16 output_tokens 4 }
  expect { launch accepted rows kv_owner position % 2 }
}
"""
PINNED = Image("registry.example/sglang-cptest@sha256:" + "ab" * 32, True)


def _plan(text: str = TEXT) -> Plan:
    return plan(parse_text(text, "t.cps"))


def _objects(p: Plan | None = None, **kw: Any) -> list[dict[str, Any]]:
    return render(p or _plan(), PINNED, **kw).objects


def _container(lws: dict[str, Any], key: str) -> dict[str, Any]:
    return lws["spec"]["leaderWorkerTemplate"][key]["spec"]["containers"][0]


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_each_server_is_a_leader_worker_set_of_its_nodes_and_a_service_of_its_leader():
    p = _plan()
    objs = _objects(p)
    assert [(o["kind"], o["metadata"]["labels"]["cptest/role"]) for o in objs] == [
        ("LeaderWorkerSet", "main"), ("Service", "main")]
    lws, svc = objs
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2 and lws["spec"]["replicas"] == 1
    assert lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"  # LeaderReady would never start the workers
    assert svc["spec"]["selector"] == {LWS_NAME_LABEL: lws["metadata"]["name"], "role": "leader"}
    assert lwt["leaderTemplate"]["metadata"]["labels"]["role"] == "leader"
    assert svc["spec"]["ports"] == [{"name": "http", "port": 30000, "targetPort": "http", "protocol": "TCP"}]
    assert validate_all(objs) == []


def test_lws_environment_replaces_what_the_plan_wrote_per_node():
    p = _plan()
    lws = _objects(p)[0]
    leader, worker = _container(lws, "leaderTemplate"), _container(lws, "workerTemplate")
    assert leader["command"] == worker["command"]
    cmd = leader["command"]
    assert _value(cmd, "--nnodes") == "$(LWS_GROUP_SIZE)"
    assert _value(cmd, "--node-rank") == "$(LWS_WORKER_INDEX)"
    rendezvous = _value(p.main.nodes[0].argv, "--dist-init-addr").rsplit(":", 1)[1]
    assert _value(cmd, "--dist-init-addr") == f"$(LWS_LEADER_ADDRESS):{rendezvous}"
    assert _value(cmd, "--host") == "0.0.0.0" and "127.0.0.1" not in json.dumps(lws)
    assert _value(cmd, "--model-path") == "/cptest/models/" + p.main.nodes[0].model_mount.split("/", 1)[1]
    # Everything else is the plan's argv, the probe's hooks verbatim.
    assert _value(cmd, "--forward-hooks") == _value(p.main.nodes[0].argv, "--forward-hooks")
    assert len(cmd) == len(p.main.nodes[0].argv)
    ports = {x["name"]: x["containerPort"] for x in leader["ports"]}
    assert ports == {"http": 30000, "dist-init": int(rendezvous)}
    assert "ports" not in worker and "readinessProbe" not in worker


def test_pods_get_the_gpus_volumes_probes_and_evidence_directory_of_the_plan():
    p = _plan()
    lws = _objects(p, volumes=Volumes("site-models", "site-evidence"))[0]
    leader = _container(lws, "leaderTemplate")
    assert leader["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    env = {e["name"]: e["value"] for e in leader["env"]}
    assert env["CPTEST_PROBE_DIR"] == f"/cptest/evidence/multi-node-t-{p.pins.scenario_sha256[:8]}/main"
    assert env["NCCL_NVLS_ENABLE"] == "0"  # the plan's environment, as planned
    assert env["SGLANG_T"] == "a$$(HOME)b"  # Kubernetes would expand $(HOME): escaped
    mounts = {m["name"]: m for m in leader["volumeMounts"]}
    assert mounts["models"] == {"name": "models", "mountPath": "/cptest/models", "readOnly": True}
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    spec = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["models"]["persistentVolumeClaim"] == {"claimName": "site-models", "readOnly": True}
    assert vols["evidence"]["persistentVolumeClaim"] == {"claimName": "site-evidence"}
    assert vols["dshm"]["emptyDir"]["medium"] == "Memory"
    assert leader["readinessProbe"]["httpGet"]["path"] == "/health_generate"
    probe = leader["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= p.main.ready_timeout_s
    assert spec["terminationGracePeriodSeconds"] == p.main.shutdown_timeout_s


def test_labels_and_annotations_name_the_scenario_the_role_and_the_plan():
    p = _plan()
    out = render(p, PINNED)
    lws = out.objects[0]
    assert lws["metadata"]["labels"] == {"cptest/scenario": "multi_node_t", "cptest/role": "main",
                                         "cptest/plan": out.plan_sha256[:16]}
    assert lws["metadata"]["annotations"]["cptest/scenario-sha256"] == p.pins.scenario_sha256
    assert lws["metadata"]["annotations"]["cptest/image-pinned"] == "true" and out.notes == []


def test_a_single_node_server_is_a_leader_worker_set_of_size_one():
    p = _plan(TEXT.replace("gpus 4 nodes 2 tp 4", "gpus 2 tp 2"))
    lws = _objects(p)[0]
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 1
    cmd = _container(lws, "leaderTemplate")["command"]
    assert not any("LWS_" in a for a in cmd) and "--nnodes" not in cmd
    assert [x["name"] for x in _container(lws, "leaderTemplate")["ports"]] == ["http"]
    assert validate_all(_objects(p)) == []


def test_every_server_of_the_plan_is_rendered_baseline_and_control_included():
    p = plan(parse_file(TWO_NODES))
    objs = render(p, PINNED).objects
    roles = [o["metadata"]["labels"]["cptest/role"] for o in objs if o["kind"] == "LeaderWorkerSet"]
    assert roles == ["main", "baseline", "control"]
    sizes = [o["spec"]["leaderWorkerTemplate"]["size"] for o in objs if o["kind"] == "LeaderWorkerSet"]
    assert sizes == [2, 2, 1]
    assert len({o["metadata"]["name"] for o in objs}) == len(objs)


def _reference_plan() -> Plan:
    return _plan(TEXT.replace('engine sglang "0.5.17"', 'engine reference "builtin"'))


def test_the_reference_engine_runs_its_image_with_cptest_from_the_source_claim_and_no_gpu():
    p = _reference_plan()
    image = Image("localhost/cptest-reference:t", False, "unpinned", "sha256:" + "ef" * 32, "/opt/cptest")
    out = render(p, image, Volumes(source_claim="site-source"))
    lws = out.objects[0]
    assert lws["metadata"]["annotations"]["cptest/image-lock-digest"] == "sha256:" + "ef" * 32
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    for key in ("leaderTemplate", "workerTemplate"):
        c = _container(lws, key)
        assert c["image"] == "localhost/cptest-reference:t" and c["name"] == "reference"
        # As the docker launcher runs it: the checkout's package under <cptest_mount>, on PYTHONPATH.
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["PYTHONPATH"] == "/opt/cptest"
        assert {"name": "cptest-source", "mountPath": "/opt/cptest", "readOnly": True} in c["volumeMounts"]
        spec = lws["spec"]["leaderWorkerTemplate"][key]["spec"]
        assert {"name": "cptest-source", "persistentVolumeClaim": {"claimName": "site-source",
                                                                   "readOnly": True}} in spec["volumes"]
        # CPU only: two ranks per node and the server, a core and 1 GiB each, no limit to OOM-kill a rank.
        assert c["resources"] == {"requests": {"cpu": "3", "memory": "3Gi"}}
    cmd = _container(lws, "leaderTemplate")["command"]
    assert cmd[:3] == ["python3", "-m", "cptest.reference.server"]
    assert _value(cmd, "--nnodes") == "$(LWS_GROUP_SIZE)"
    assert _value(cmd, "--node-rank") == "$(LWS_WORKER_INDEX)"
    rendezvous = _value(p.main.nodes[0].argv, "--dist-init-addr").rsplit(":", 1)[1]
    assert _value(cmd, "--dist-init-addr") == f"$(LWS_LEADER_ADDRESS):{rendezvous}"
    assert _value(cmd, "--host") == "0.0.0.0" and len(cmd) == len(p.main.nodes[0].argv)
    leader = _container(lws, "leaderTemplate")
    assert leader["readinessProbe"]["httpGet"]["path"] == "/health_generate"
    assert leader["startupProbe"]["httpGet"]["path"] == "/health"
    assert "nvidia.com/gpu" not in json.dumps(out.objects)
    assert any("site-source" in n and p.pins.cptest_version in n for n in out.notes)
    assert validate_all(out.objects) == []


def test_an_sglang_pod_has_no_source_volume_and_its_gpus_only():
    lws = _objects()[0]
    c = _container(lws, "leaderTemplate")
    assert "PYTHONPATH" not in {e["name"] for e in c["env"]}
    assert "cptest-source" not in json.dumps(lws) and "cptest/image-lock-digest" not in json.dumps(lws)
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "2"}}


def test_what_a_leader_worker_set_cannot_run_is_refused():
    with pytest.raises(PlanError, match="no mount point for it is known"):
        render(_reference_plan(), PINNED)  # an image without cptest and nowhere to put it
    p = _plan()
    with pytest.raises(PlanError, match="no pod is known for the vllm engine"):
        render(p.model_copy(update={"main": p.main.model_copy(update={"engine": "vllm"})}), PINNED)
    odd = p.main.nodes[1].model_copy(update={"argv": [*p.main.nodes[1].argv, "--odd"]})
    differs = p.model_copy(update={"main": p.main.model_copy(update={"nodes": [p.main.nodes[0], odd]})})
    with pytest.raises(PlanError, match="differs from node 0's beyond its rank"):
        render(differs, PINNED)
    with pytest.raises(PlanError, match="not a valid name"):
        render(p, PINNED, Volumes(models_claim="Models_PVC"))
    with pytest.raises(PlanError, match="not a valid name"):
        render(p, PINNED, Volumes(source_claim="src/"))


def test_a_checkpoint_beside_the_scenario_cannot_be_mounted(tmp_path: Path):
    with pytest.raises(PlanError, match="cannot mount it") as e:
        pod.model_path("<scenario>/ckpt")
    assert "cptest models add" in (e.value.problems[0].hint or "")
    assert pod.model_path("<models>/llama-1") == "/cptest/models/llama-1"
    assert pod.model_path("meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"


def test_dollar_signs_of_the_plan_reach_the_engine_unexpanded():
    assert pod.escape("$(X) $$ $") == "$$(X) $$$$ $$"
    assert pod.pod_argv(["python3", "--x", "a$(B)"], 1) == ["python3", "--x", "a$$(B)"]


def test_image_is_the_override_else_the_lock_name_of_the_release_and_says_when_unpinned():
    p = _plan()
    default = images.resolve(p, None)
    assert default.reference == "sglang-cptest:0.5.17" and not default.pinned
    assert "unbuilt" in (default.note or "") and "--image" in (default.note or "")
    ref = "registry.example/sglang-cptest@sha256:" + "cd" * 32
    assert images.resolve(p, ref) == Image(ref, True)
    assert not images.resolve(p, "registry.example/sglang:latest").pinned
    with pytest.raises(PlanError):
        images.resolve(p, "two words")
    named = _plan(TEXT.replace('engine sglang "0.5.17"', 'engine sglang "0.5.17" image "site/sglang:1"'))
    assert images.resolve(named, None).reference == "site/sglang:1"


def test_the_reference_image_is_the_locks_with_its_digest_and_mount(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch):
    entry = {"digest": "sha256:" + "12" * 32, "status": "pinned", "engine": "reference",
             "cptest_mount": "/srv/c"}
    lock = {"lock_version": 1, "images": {"localhost/ref:1": entry}}
    path = tmp_path / "lock.json"
    path.write_text(json.dumps(lock))
    monkeypatch.setenv("CPTEST_IMAGE_LOCK", str(path))
    p = _reference_plan()
    got = images.resolve(p, None)
    assert (got.reference, got.pinned, got.lock_digest, got.cptest_mount) == (
        "localhost/ref:1", False, "sha256:" + "12" * 32, "/srv/c")
    assert "pins it to sha256:1212" in (got.note or "") and "--image" in (got.note or "")
    # Another image of the engine: the recipe's mount (what `cptest image build reference` lays out).
    ref = "registry.example/ref@sha256:" + "34" * 32
    assert images.resolve(p, ref) == Image(ref, True, cptest_mount="/opt/cptest")
    path.write_text(json.dumps({"lock_version": 1, "images": {}}))
    with pytest.raises(PlanError, match="no image for the reference engine") as e:
        images.resolve(p, None)
    assert "cptest image build reference" in (e.value.problems[0].hint or "")


def test_names_are_dns_labels_and_long_ones_stay_apart():
    assert dns_label("tp4_dcp2_two_nodes_sglang-main") == "tp4-dcp2-two-nodes-sglang-main"
    assert dns_label("9lives") == "s-9lives"
    a, b = dns_label("x" * 60 + "-main"), dns_label("x" * 60 + "-baseline")
    assert a != b and len(a) <= 40 and not name_problems("LeaderWorkerSet", a)
    assert label_value("tp4_dcp2") == "tp4_dcp2"
    assert len(label_value("y" * 80)) <= 63


def test_yaml_has_no_aliases_keeps_long_arguments_on_one_line_and_reads_back():
    objs = _objects()
    text = dump(objs, ["header"])
    assert text.startswith("# header\n---\n")
    assert not re.search(r"[&*]id\d+", text)
    hooks = _value(_container(objs[0], "leaderTemplate")["command"], "--forward-hooks")
    assert any(hooks in line for line in text.splitlines())
    assert load(text) == objs


# ------------------------------------------------------------------------------ the command
def _cptest(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cptest", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_compile_target_lws_json_is_its_documented_schema():
    done = _cptest("compile", "--target", "lws", "--json", TWO_NODES)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    adapter("compile").validate_python(data)
    assert data["target"] == "lws" and load(data["yaml"]) == data["manifests"]
    assert [o["kind"] for o in data["objects"]] == [m["kind"] for m in data["manifests"]]
    assert data["notes"] and "not pinned" in data["notes"][0]


def test_compile_keeps_the_plan_as_its_default_target():
    done = _cptest("compile", "--json", TWO_NODES)
    assert done.returncode == 0, done.stderr
    Plan.model_validate_json(done.stdout)


def test_lws_options_without_the_lws_target_are_a_usage_error():
    done = _cptest("compile", "--image", "x@sha256:" + "0" * 64, TWO_NODES)
    assert done.returncode == 2 and "--target lws" in done.stderr


def test_the_cli_default_claims_are_the_renderers():
    from cptest.cli import LWS_CLAIMS

    assert (Volumes().models_claim, Volumes().evidence_claim, Volumes().source_claim) == LWS_CLAIMS
