"""Specifications of `plan.compare.plan_changes`: what a rerun compares between the archived plan and
the plan this cptest makes of the archived scenario (the tamper suite, tests/test_tamper.py, runs
the whole command)."""

from __future__ import annotations

from typing import Any

from cptest.plan.compare import plan_changes
from cptest.plan.model import Plan
from cptest.testing.archives import make_plan, server_plan


def with_node(plan: Plan, **update: Any) -> Plan:
    node = plan.main.nodes[0]
    if "argv" in update and isinstance(update["argv"], dict):  # {old: new} replacements
        update["argv"] = [update["argv"].get(a, a) for a in node.argv]
    main = plan.main.model_copy(update={"nodes": [node.model_copy(update=update)]})
    return plan.model_copy(update={"main": main})


def model_at(plan: Plan, where: str) -> Plan:
    node = plan.main.nodes[0]
    return with_node(plan, argv=[*node.argv, "--model-path", where], model_mount=where)


BASE = make_plan(server_plan())


def test_the_same_plan_has_no_change() -> None:
    assert plan_changes(BASE, BASE) == []


def test_an_archive_before_d43_names_its_model_by_an_absolute_path_which_the_hash_pins() -> None:
    old = model_at(BASE, "/work/main/.tiny-models/llama-kv1")
    new = model_at(BASE, "<models>/llama-833975c7d4a76e8d")
    assert plan_changes(old, new) == []


def test_a_token_model_path_is_compared_as_written() -> None:
    old = model_at(BASE, "<models>/../../etc")
    new = model_at(BASE, "<models>/llama-833975c7d4a76e8d")
    assert [p.message for p in plan_changes(old, new)] == ["main node 0 argv differs",
                                                           "main node 0 model_mount differs"]


def test_the_digest_a_run_pins_to_an_image_is_no_change_but_another_image_is() -> None:
    old = with_node(BASE, image="cptest-reference:1@sha256:" + "a" * 64)
    assert plan_changes(old, with_node(BASE, image="cptest-reference:1")) == []
    changed = plan_changes(old, with_node(BASE, image="evil:1"))
    assert [p.message for p in changed] == ["main node 0 image differs"]


def test_each_difference_names_the_server_node_and_field_with_both_values() -> None:
    old = with_node(BASE, env={"LD_PRELOAD": "/tmp/x.so"}, gpu_ids=[5])
    (env, gpus) = plan_changes(old, BASE)
    assert (env.message, env.found, env.expected) == ("main node 0 env differs", 'archived {"LD_PRELOAD": '
                                                      '"/tmp/x.so"}', "now {}")
    assert gpus.message == "main node 0 gpu_ids differs"
