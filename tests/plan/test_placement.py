"""Specification of the placement (cptest/plan/build.py, pipeline.prepare): physical plans stay as they
were; a co-located plan runs every rank of a multi-rank server as its own local node process, records
everything the placement adds, and is re-planned identically from its archive."""

from __future__ import annotations

from pathlib import Path

import pytest

from cptest import pipeline
from cptest.errors import PlanError, ScenarioError
from cptest.lang import parse_text
from cptest.lang.safety import PLACEMENT_ENV
from cptest.plan import plan
from cptest.plan.archive_reader import placement_of
from cptest.plan.build import rank_gpus
from cptest.plan.compare import plan_changes
from cptest.plan.model import Placement, Plan
from cptest.run.preflight import preflight

REPO = Path(__file__).resolve().parents[2]

DCP2 = """cptest 1
scenario s {
  engine sglang "0.5.17"
  model synthetic llama {
    layers 2 hidden 256 heads 8 kv_heads 1 head_dim 32 vocab 512 intermediate 512 seed 1
  }
  topology { gpus 2 tp 2 dcp 2 }
  serve { attention_backend triton mem_fraction 0.3 flag "--disable-custom-all-reduce" }
  baseline { tp 2 }
  workload { requests 4 concurrency 2 prompt_tokens uniform(16, 32) output_tokens 4 }
  fault kill rank 1 after 2 requests
  expect {
    rows kv_owner position % 2
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
"""


def planned(text: str = DCP2, **placement: object) -> Plan:
    return plan(parse_text(text, "s.cps"), placement=Placement(**placement))  # type: ignore[arg-type]


def test_a_physical_plan_has_one_node_on_as_many_gpus_as_ranks() -> None:
    p = planned()
    assert p.placement == "physical" and p.main.colocation is None
    (node,) = p.main.nodes
    assert node.gpu_ids == [0, 1] and "--nnodes" not in node.argv
    assert not set(node.env) & set(PLACEMENT_ENV)


def test_a_colocated_server_runs_each_rank_as_a_node_of_its_own_on_shared_gpus() -> None:
    p = planned(mode="colocated")
    assert p.placement == "colocated"
    main = p.main
    assert [n.node_rank for n in main.nodes] == [0, 1]
    assert [n.gpu_ids for n in main.nodes] == [[0], [0]]
    assert [n.port for n in main.nodes] == [30000, 30001]
    assert main.base_url == "http://127.0.0.1:30000"
    for k, node in enumerate(main.nodes):
        argv = node.argv
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == str(k)
        assert argv[argv.index("--dist-init-addr") + 1] == "127.0.0.1:30050"
        assert argv[argv.index("--port") + 1] == str(30000 + k)
        # The scenario's 0.3 of a GPU is shared by the two ranks on GPU 0.
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.15"
        # The placement's switch is there once, whether or not the scenario passes it too.
        assert argv.count("--disable-custom-all-reduce") == 1
        assert node.env["NCCL_SOCKET_IFNAME"] == "lo" and node.env["NCCL_P2P_DISABLE"] == "1"
        assert node.env["SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK"] == "0"
        assert node.env["NCCL_NVLS_ENABLE"] == "0"  # the machine's rules still hold
    assert main.nodes[0].env["NCCL_HOSTID"] != main.nodes[1].env["NCCL_HOSTID"]
    colo = main.colocation
    assert colo is not None and colo.rank_gpus == [0, 0] and colo.ranks_per_gpu == 2
    assert colo.mem_fraction == 0.15 and "0.3 / 2" in colo.mem_fraction_basis
    assert "NCCL" in colo.transport and colo.cannot_judge
    assert [g.node for g in main.geometry] == [0, 1]  # world rank k runs on node k
    # The baseline is co-located the same way; the TP1 control has one rank and nothing to share.
    assert p.baseline is not None and p.baseline.colocated and p.baseline.nodes[1].port == 30101
    assert p.control is not None and not p.control.colocated and len(p.control.nodes) == 1


def test_a_rank_fault_of_a_colocated_server_names_the_node_it_acts_on() -> None:
    assert planned(mode="colocated").faults[0].node == 1
    assert planned().faults[0].node is None


def test_ranks_spread_over_the_placements_gpus_in_contiguous_blocks() -> None:
    assert rank_gpus(4, None) == [0, 0, 0, 0]
    assert rank_gpus(4, [0, 1]) == [0, 0, 1, 1]
    assert rank_gpus(8, [2, 3]) == [2, 2, 2, 2, 3, 3, 3, 3]
    assert rank_gpus(2, [0, 1, 2, 3]) == [0, 1]  # more GPUs than ranks: one each
    p = planned(mode="colocated", gpus=[1, 2])
    assert [n.gpu_ids for n in p.main.nodes] == [[1], [2]]
    assert p.main.colocation is not None and p.main.colocation.mem_fraction == 0.3


def test_an_explicit_rank_fraction_replaces_the_division() -> None:
    colo = planned(mode="colocated", rank_mem_fraction=0.1).main.colocation
    assert colo is not None and colo.mem_fraction == 0.1 and "explicitly" in colo.mem_fraction_basis


def test_without_a_declared_fraction_the_ranks_share_the_engines_usual_one() -> None:
    text = DCP2.replace("mem_fraction 0.3 ", "")
    colo = planned(text, mode="colocated").main.colocation
    assert colo is not None and colo.mem_fraction == 0.45 and "taken as 0.9" in colo.mem_fraction_basis


def test_more_ranks_than_a_server_can_colocate_is_a_plan_error() -> None:
    text = DCP2.replace("gpus 2 tp 2 dcp 2", "gpus 64 tp 64 dcp 2").replace("baseline { tp 2 }",
                                                                              "baseline { tp 64 }")
    with pytest.raises(PlanError, match="64 ranks cannot be co-located"):
        planned(text, mode="colocated")


@pytest.mark.parametrize("name", sorted(PLACEMENT_ENV))
def test_a_scenario_cannot_set_what_the_placement_sets(name: str) -> None:
    text = DCP2.replace("serve {", f'serve {{ env "{name}" "x"')
    with pytest.raises(ScenarioError) as e:
        plan(parse_text(text, "s.cps"))
    (problem,) = e.value.problems
    assert problem.span is not None and problem.span.line == 8 and "co-located placement" in problem.message


def test_the_engines_colocation_sets_only_what_the_placement_owns() -> None:
    colo = planned(mode="colocated").main.colocation
    assert colo is not None
    assert set(colo.env) | {k for env in colo.node_env for k in env} <= set(PLACEMENT_ENV)


def scenario_file(tmp_path: Path, text: str = DCP2) -> Path:
    f = tmp_path / "s.cps"
    f.write_text(text)
    return f


def test_auto_colocates_when_this_machine_has_fewer_gpus_than_a_server_has_ranks(tmp_path: Path) -> None:
    f = scenario_file(tmp_path)
    one = pipeline.prepare(f, gpu_present=True, placement_mode="auto", gpus_here=1)
    assert one.plan.placement == "colocated"
    assert one.notes[0].startswith(
        "cptest: co-located placement (this machine gives 1 GPU(s) and a server has 2 ranks")
    two = pipeline.prepare(f, gpu_present=True, placement_mode="auto", gpus_here=2)
    assert two.plan.placement == "physical" and not two.notes
    # --gpus counts, not the machine: two GPUs named of eight.
    named = pipeline.prepare(f, gpu_present=True, placement=Placement(gpus=[3]), placement_mode="auto",
                             gpus_here=8)
    assert named.plan.placement == "colocated" and named.plan.main.nodes[1].gpu_ids == [3]


def test_auto_leaves_the_reference_engine_physical_and_colocated_is_asked_for_by_name(tmp_path: Path) -> None:
    f = scenario_file(tmp_path)
    ref = pipeline.prepare(f, gpu_present=False, placement_mode="auto", gpus_here=None)
    assert ref.engine == "reference" and ref.plan.placement == "physical"
    asked = pipeline.prepare(f, gpu_present=False, placement_mode="colocated")
    assert asked.plan.placement == "colocated" and asked.notes[0].startswith(
        "cptest: co-located placement (--placement colocated)")


def test_physical_on_a_one_gpu_machine_keeps_the_refusal(tmp_path: Path) -> None:
    prepared = pipeline.prepare(scenario_file(tmp_path), gpu_present=True, placement_mode="physical",
                                gpus_here=1)
    causes = preflight(prepared.plan, results=tmp_path, gpus=lambda: {"0": 100_000})
    assert [c.code for c in causes if c.code.startswith("gpu")] == ["gpus_missing"]


def test_a_colocated_archive_is_planned_again_exactly_as_it_ran() -> None:
    for placement in (Placement(mode="colocated"), Placement(mode="colocated", gpus=[2, 3], main_port=31000,
                                                             baseline_port=31100, rank_mem_fraction=0.2)):
        archived = plan(parse_text(DCP2, "s.cps"), placement=placement)
        again = plan(parse_text(DCP2, "s.cps"), placement=placement_of(archived))
        assert again == archived
        assert plan_changes(archived, again) == []


def test_a_colocated_servers_rendezvous_port_in_use_is_unknown_before_launch(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        base = busy - 50
        p = planned(mode="colocated", main_port=base, baseline_port=base - 100)
        causes = [c.message for c in preflight(p, results=tmp_path, gpus=lambda: None)
                  if c.code == "port_in_use" and "rendezvous" in c.message]
    assert causes == [f"main server's rendezvous port 127.0.0.1:{busy} is in use by another process"]
