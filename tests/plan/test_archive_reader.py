"""Specifications of `plan.archive_reader`: an archived plan is read as the planner generation that
made it, so what that planner decided differently is not tampering, and only for its archives."""

from __future__ import annotations

from cptest.lang import parse_text
from cptest.plan import plan
from cptest.plan.archive_reader import ABSOLUTE_MOUNTS, CURRENT, generation_of
from cptest.plan.compare import integrity_differences
from cptest.plan.model import Plan

SCENARIO = """cptest 1
scenario s {
  engine sglang "0.5.17"
  model synthetic llama { layers 2 hidden 256 heads 8 kv_heads 2 head_dim 32 vocab 512 intermediate 512 }
  topology { gpus 4 tp 4 dcp 2 }
  workload { requests 2 concurrency 1 prompt_tokens uniform(8, 16) output_tokens 2 }
  expect { rows kv_owner position % 2 }
}
"""
EXTRA = ["--cuda-graph-backend-prefill", "disabled"]


def planned() -> Plan:
    return plan(parse_text(SCENARIO, "s.cps"))


def with_extra_flags(p: Plan) -> Plan:
    nodes = [n.model_copy(update={"argv": [*n.argv, *EXTRA]}) for n in p.main.nodes]
    return p.model_copy(update={"main": p.main.model_copy(update={"nodes": nodes})})


def differences(archived: Plan, replanned: Plan) -> list[str]:
    return [p.message for p in integrity_differences(archived, replanned, "plan.json", "restore it")]


def test_a_plan_of_this_planner_is_read_as_the_current_generation() -> None:
    assert generation_of(planned()) is CURRENT
    assert differences(planned(), planned()) == []


def test_an_archive_of_the_absolute_mounts_planner_reads_as_its_re_plan() -> None:
    now = planned()
    archived = with_extra_flags(now.with_model_location(now.main.nodes[0].model_mount or "", "/data/m/tiny"))
    assert generation_of(archived) is ABSOLUTE_MOUNTS
    assert differences(archived, now) == []


def test_the_older_planners_flags_in_an_archive_of_this_planner_are_tampering() -> None:
    archived = with_extra_flags(planned())
    assert generation_of(archived) is CURRENT
    assert differences(archived, planned()) == [
        "integrity check failed: main node 0 argv differs from what scenario.cps plans"]


def test_another_model_path_is_tampering_unless_every_mount_is_absolute() -> None:
    now = planned()
    moved = now.with_model_location(now.main.nodes[0].model_mount or "", "<models>/other")
    assert generation_of(moved) is CURRENT
    assert any("model_mount differs" in m for m in differences(moved, now))
