"""cptest/k8s/validate.py: the offline checks can fail, and need no network.

Each case breaks one rendered manifest the way a renderer bug would (a wrong type, a missing
required field, an unknown field where the schema forbids one, a value out of its enum or range, a
name the API server would refuse) and asserts the message names the place.
"""

from __future__ import annotations

import copy
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cptest.k8s import validate
from cptest.k8s.render import Image, render
from cptest.lang import parse_file
from cptest.plan import plan

ROOT = Path(__file__).resolve().parents[2]
OBJECTS = render(plan(parse_file(ROOT / "scenarios" / "tp4_dcp2_two_nodes_sglang.cps")),
                 Image("r.example/sglang@sha256:" + "ab" * 32, True)).objects
LWS, SVC = 0, 1


def _lwt(o: list[dict[str, Any]]) -> dict[str, Any]:
    return o[LWS]["spec"]["leaderWorkerTemplate"]


def _container(o: list[dict[str, Any]], key: str = "leaderTemplate") -> dict[str, Any]:
    return _lwt(o)[key]["spec"]["containers"][0]


def _set(path: Callable[[list[dict[str, Any]]], dict[str, Any]], key: str, value: Any):
    def edit(o: list[dict[str, Any]]) -> None:
        path(o)[key] = value
    return edit


def _drop(path: Callable[[list[dict[str, Any]]], dict[str, Any]], key: str):
    def edit(o: list[dict[str, Any]]) -> None:
        del path(o)[key]
    return edit


CASES = [
    # LeaderWorkerSet, against its v1 structural schema
    ("lws size of the wrong type",
     _set(_lwt, "size", "two"),
     "spec.leaderWorkerTemplate.size: 'two' is not of type 'integer'"),
    ("lws size beyond int32",
     _set(_lwt, "size", 2**31),
     "spec.leaderWorkerTemplate.size: 2147483648 is greater than the maximum"),
    ("lws restart policy outside its enum",
     _set(_lwt, "restartPolicy", "Sometimes"),
     "'Sometimes' is not one of"),
    ("lws without a worker template",
     _drop(_lwt, "workerTemplate"),
     "'workerTemplate' is a required property"),
    ("lws unknown spec field",
     _set(lambda o: o[LWS]["spec"], "replica", 1),
     "spec: Additional properties are not allowed ('replica' was unexpected)"),
    ("lws unknown template metadata field",
     _set(lambda o: _lwt(o)["workerTemplate"]["metadata"], "generateName", "x"),
     "workerTemplate.metadata: Additional properties are not allowed ('generateName'"),
    ("lws of another api version",
     _set(lambda o: o[LWS], "apiVersion", "leaderworkerset.x-k8s.io/v2"),
     "expected leaderworkerset.x-k8s.io/v1/LeaderWorkerSet"),
    ("lws metadata as ObjectMeta",
     _set(lambda o: o[LWS]["metadata"], "labels", {"a": 1}),
     "metadata.labels.a: 1 is not of type 'string'"),
    # the pod templates, against core v1 PodTemplateSpec
    ("container without a name",
     _drop(_container, "name"),
     "leaderTemplate.spec.containers[0]: 'name' is a required property"),
    ("container unknown field",
     _set(lambda o: _container(o, "workerTemplate"), "gpus", 2),
     "workerTemplate.spec.containers[0]: Additional properties are not allowed ('gpus' was unexpected)"),
    ("probe port of the wrong type",
     _set(lambda o: _container(o)["readinessProbe"]["httpGet"], "port", ["http"]),
     "leaderTemplate.spec.containers[0].readinessProbe.httpGet.port"),
    ("pod spec without containers",
     _drop(lambda o: _lwt(o)["leaderTemplate"]["spec"], "containers"),
     "'containers' is a required property"),
    # Service, against core v1
    ("service port of the wrong type",
     _set(lambda o: o[SVC]["spec"]["ports"][0], "port", "http"),
     "Service/tp4-dcp2-two-nodes-sglang-main-leader: spec.ports[0].port: 'http' is not of type 'integer'"),
    ("service port without its number",
     _drop(lambda o: o[SVC]["spec"]["ports"][0], "port"),
     "'port' is a required property"),
    ("service unknown field",
     _set(lambda o: o[SVC]["spec"], "headless", True),
     "Additional properties are not allowed ('headless' was unexpected)"),
    # what the schemas type as strings only
    ("service name with an underscore",
     _set(lambda o: o[SVC]["metadata"], "name", "a_b"),
     "Service name 'a_b' is not an RFC 1035 label"),
    ("lws name too long",
     _set(lambda o: o[LWS]["metadata"], "name", "x" * 41),
     "is not an RFC 1035 label of at most 40"),
    ("label value with a slash",
     _set(lambda o: o[LWS]["metadata"]["labels"], "cptest/role", "a/b"),
     "label cptest/role value 'a/b' is not a label value"),
    ("unknown kind",
     _set(lambda o: o[SVC], "kind", "Deployment"),
     "no schema for kind 'Deployment'"),
]


def test_the_rendered_manifests_are_valid():
    assert validate.validate_all(OBJECTS) == []
    assert validate.warnings(OBJECTS) == []  # pinned by digest


@pytest.mark.parametrize(("edit", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_broken_manifest_is_rejected_with_the_place_named(edit: Callable[[list[dict[str, Any]]], None],
                                                             message: str):
    broken = copy.deepcopy(OBJECTS)
    edit(broken)
    found = validate.validate_all(broken)
    assert any(message in p for p in found), found


def test_an_image_without_a_digest_is_a_warning_not_a_problem():
    loose = copy.deepcopy(OBJECTS)
    _container(loose)["image"] = "sglang-cptest:0.5.17"
    assert validate.validate_all(loose) == []
    assert validate.warnings(loose) == [
        "LeaderWorkerSet/tp4-dcp2-two-nodes-sglang-main: leaderTemplate image 'sglang-cptest:0.5.17' names "
        "no digest"]


def test_validation_needs_no_network(monkeypatch: pytest.MonkeyPatch):
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("validation tried the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    validate.lws_document.cache_clear()
    validate._lws_validator.cache_clear()
    broken = copy.deepcopy(OBJECTS)
    _lwt(broken)["size"] = "two"
    assert validate.validate_all(OBJECTS) == [] and validate.validate_all(broken)


def test_the_lws_schema_records_its_source_and_what_it_elides():
    doc = validate.lws_document()
    assert doc["source"]["repository"] == "kubernetes-sigs/lws" and len(doc["source"]["commit"]) == 40
    assert doc["source"]["commit"] in doc["source"]["url"] and "Apache-2.0" in doc["source"]["license"]
    assert doc["kind"] == "LeaderWorkerSet"
    assert f"{doc['group']}/{doc['version']}" == "leaderworkerset.x-k8s.io/v1"
    for core, paths in doc["elided"].items():
        for path in paths:
            node = doc["openAPIV3Schema"]
            for part in path.split("."):
                items = part.endswith("[]")
                node = node["properties"][part.removesuffix("[]")]
                if items:
                    node = node["items"]
            assert node["x-cptest-elided"] == core and node["x-kubernetes-preserve-unknown-fields"]


def test_strict_forbids_unknown_fields_except_where_the_schema_preserves_them():
    s = validate.strict({"type": "object", "properties": {
        "a": {"type": "object", "properties": {"b": {"type": "integer", "format": "int32"}}},
        "c": {"type": "object", "properties": {}, "x-kubernetes-preserve-unknown-fields": True},
        "d": {"type": "object", "additionalProperties": {"type": "string"}}}})
    assert s["additionalProperties"] is False and s["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in s["properties"]["c"]
    assert s["properties"]["d"]["additionalProperties"] == {"type": "string"}
    assert s["properties"]["a"]["properties"]["b"]["maximum"] == 2**31 - 1


def test_a_published_crd_transcribes_to_the_vendored_schema_and_a_change_is_named():
    from cptest.k8s.crd import differences

    # A stand-in for the published file: the vendored schema with prose and a PodSpec put back.
    full = copy.deepcopy(validate.lws_document()["openAPIV3Schema"])
    full["description"] = "LeaderWorkerSet is the Schema for the leaderworkersets API"
    lwt = full["properties"]["spec"]["properties"]["leaderWorkerTemplate"]["properties"]
    for key in ("leaderTemplate", "workerTemplate"):
        lwt[key]["properties"]["spec"] = {"type": "object", "required": ["containers"], "description": "x",
                                          "properties": {"containers": {"type": "array"}}}
    lwt["volumeClaimTemplates"]["items"] = {"type": "object", "properties": {"spec": {"type": "object"}}}
    crd = {"spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": full}}]}}
    assert differences(crd) == []
    lwt["size"]["format"] = "int64"
    lwt["resizePolicy"] = {"type": "string"}
    at = ".properties.spec.properties.leaderWorkerTemplate.properties"
    assert differences(crd) == [f"{at}.resizePolicy: only in the CRD",
                                f"{at}.size.format: CRD 'int64', vendored 'int32'"]
