"""cptest/suite/schedule.py and demand.py: packing, exclusive scenarios, ports, GPUs and CPUs; and how
runner.plan_entries places scenarios (physical or co-located) before any of them runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from cptest.errors import RunError
from cptest.lang import parse_file
from cptest.plan import plan
from cptest.plan.model import Placement, Plan
from cptest.suite.demand import RUNTIME_MIB, Demand, demand_of
from cptest.suite.machine import Machine, discover, parse_ids
from cptest.suite.runner import Entry, child_argv, plan_entries
from cptest.suite.schedule import Granted, Pool, next_to_start

ROOT = Path(__file__).resolve().parents[2]
H200 = 143156


def two_h200(cpus: int = 30) -> Machine:
    return Machine({0: H200, 1: H200}, tuple(range(2, 2 + cpus)))


def tp2(name: str, mib: int = 4672, exclusive: str | None = None) -> Demand:
    return Demand(name, gpus=2, gpu_mib=mib, cpus=4, exclusive=exclusive)


def test_seven_tp2_servers_share_two_gpus_until_the_cpus_run_out() -> None:
    pool = Pool(two_h200())
    started = next_to_start(pool, [(f"s{i}", tp2(f"s{i}")) for i in range(8)])
    assert [k for k, _, _ in started] == [f"s{i}" for i in range(7)]  # 7 x 4 CPUs of 30
    ports = [g.placement.main_port for _, _, g in started]
    assert ports == [30000 + 200 * k for k in range(7)]  # slot 0 is a lone run's 30000/30100
    assert all(g.placement.baseline_port == g.placement.main_port + 100 for _, _, g in started)
    cpus = [c for _, _, g in started for c in g.cpus]
    assert len(cpus) == len(set(cpus)) == 28  # nobody shares a core
    assert all(g.gpus == (0, 1) for _, _, g in started)
    pool.release("s3")
    (again,) = next_to_start(pool, [("s7", tp2("s7"))])
    assert again[2].cpus == started[3][2].cpus and again[2].placement.main_port == ports[3]


def test_gpu_memory_limits_how_many_share_a_gpu() -> None:
    pool = Pool(Machine({0: 10_000}, tuple(range(64))))
    big = Demand("big", gpus=1, gpu_mib=6000, cpus=3)
    assert [k for k, _, _ in next_to_start(pool, [("a", big), ("b", big)])] == ["a"]
    assert pool.free_mib == {0: 4000}
    pool.release("a")
    assert pool.free_mib == {0: 10_000}


def test_one_gpu_servers_are_spread_over_the_least_loaded_gpus() -> None:
    pool = Pool(two_h200())
    one = Demand("one", gpus=1, gpu_mib=5000, cpus=3)
    started = next_to_start(pool, [("a", one), ("b", one), ("c", one)])
    assert [g.gpus for _, _, g in started] == [(0,), (1,), (0,)]
    assert [g.placement.gpus for _, _, g in started] == [[0], [1], [0]]


def test_an_exclusive_scenario_waits_for_an_idle_machine_and_blocks_the_queue_behind_it() -> None:
    pool = Pool(two_h200())
    queue = [("a", tp2("a")), ("x", tp2("x", exclusive="times steps")), ("b", tp2("b"))]
    assert [k for k, _, _ in next_to_start(pool, queue)] == ["a"]  # b must not overtake x
    pool.release("a")
    assert [k for k, _, _ in next_to_start(pool, queue[1:])] == ["x"]
    assert next_to_start(pool, queue[2:]) == []  # nothing beside an exclusive one
    pool.release("x")
    assert [k for k, _, _ in next_to_start(pool, queue[2:])] == ["b"]


def test_jobs_caps_concurrency() -> None:
    pool = Pool(two_h200(), jobs=1)
    assert len(next_to_start(pool, [("a", tp2("a")), ("b", tp2("b"))])) == 1


def test_what_can_never_fit_says_why() -> None:
    pool = Pool(two_h200(cpus=3))
    assert pool.never_fits(Demand("x", gpus=4, gpu_mib=1, cpus=1)) == "needs 4 GPU(s), the suite has 2"
    assert "needs 4 CPUs" in (pool.never_fits(tp2("y")) or "")
    assert pool.never_fits(Demand("z", 0, 0, 0, cannot_run="2 nodes: a suite packs one host")) == \
        "2 nodes: a suite packs one host"
    assert pool.never_fits(Demand("r", gpus=0, gpu_mib=0, cpus=1)) is None


def test_demand_of_a_tiny_tp2_scenario_follows_the_pool_rule() -> None:
    scenario = parse_file(ROOT / "scenarios" / "dcp2_llama_kv1.cps")
    d = demand_of(scenario, plan(scenario), H200)
    assert (d.gpus, d.cpus, d.exclusive) == (2, 4, None)
    # 65536 rows x (4 layers x K,V x 1 head x 64 x 2 bytes) = 64 MiB, plus weights, plus runtime
    assert RUNTIME_MIB + 64 <= d.gpu_mib <= RUNTIME_MIB + 64 + 64
    assert "pool 65536 rows x 1024 B = 64 MiB" in d.basis


def demand(name: str, **placement: object) -> Demand:
    scenario = parse_file(ROOT / "scenarios" / f"{name}.cps")
    return demand_of(scenario, plan(scenario, placement=Placement(**placement)), H200)


def test_colocated_ranks_share_one_gpu_and_each_holds_a_whole_server() -> None:
    physical, colocated = demand("dcp2_llama_kv1"), demand("dcp2_llama_kv1", mode="colocated")
    assert (physical.gpus, colocated.gpus) == (2, 1)
    assert physical.cpus == colocated.cpus == 4  # a scheduler per rank, HTTP and detokenizer
    # Each rank: its pool (64 MiB), half the weights, and its own runtime part (a CUDA context each).
    assert colocated.gpu_mib == 2 * (64 + 5 + RUNTIME_MIB)
    assert colocated.basis.startswith("2 co-located rank(s) per GPU x 4677 MiB each (pool 65536 rows")


def test_four_colocated_ranks_hold_four_shares_of_the_gpu() -> None:
    d = demand("dcp4_llama", mode="colocated")
    # 131072 rows x (4 layers x K,V x 2 of 8 KV heads x 128 x 2 bytes) = 512 MiB; a quarter of the
    # 1664 MiB of weights; four ranks on GPU 0.
    assert (d.gpus, d.gpu_mib, d.cpus) == (1, 4 * (512 + 416 + RUNTIME_MIB), 6)


def test_colocated_ranks_spread_over_two_gpus_count_the_ranks_of_the_fuller_one() -> None:
    d = demand("dcp4_llama", mode="colocated", gpus=[0, 1])
    assert (d.gpus, d.gpu_mib) == (2, 2 * (512 + 416 + RUNTIME_MIB))


def test_a_colocated_rank_holds_no_more_than_its_own_memory_fraction() -> None:
    d = demand("dcp4_llama", mode="colocated", rank_mem_fraction=0.001)
    assert d.gpu_mib == 4 * (int(0.001 * H200) + RUNTIME_MIB)


def test_several_physical_nodes_cannot_run_and_the_same_plan_colocated_can() -> None:
    assert demand("tp4_dcp2_two_nodes_sglang").cannot_run == "2 nodes: a suite packs one host"
    d = demand("tp4_dcp2_two_nodes_sglang", mode="colocated")
    assert (d.cannot_run, d.gpus, d.cpus) == (None, 1, 6)
    assert d.gpu_mib == 4 * (64 + 3 + RUNTIME_MIB)


def test_a_reference_scenario_needs_no_gpu() -> None:
    scenario = parse_file(ROOT / "scenarios" / "reference_stop_rank_dcp2.cps")
    d = demand_of(scenario, plan(scenario), H200)
    assert (d.gpus, d.gpu_mib, d.cpus) == (0, 0, 1)


def test_ids_parse_and_bad_ones_say_what_was_expected() -> None:
    assert parse_ids("4-6,1", "--cpus") == [1, 4, 5, 6]
    with pytest.raises(RunError, match="--gpus: 'a' is not a list of ids"):
        parse_ids("a", "--gpus")


def test_discover_keeps_cpus_for_cptest_and_gpu_memory_in_use_out() -> None:
    m = discover(gpus=None, cpus=list(range(8)), gpu_totals={"0": 1000, "1": 1000}, reserve_mib=100)
    assert m.client_cpus == (0, 1) and m.cpus == tuple(range(2, 8))
    assert m.gpus == {0: 900, 1: 900}  # no GPU readable here: free = total, less the reserve
    with pytest.raises(RunError, match=r"GPU\(s\) \[5\]"):
        discover(gpus=[5], cpus=[0], gpu_totals={"0": 1000})


# ------------------------------------------------------------------ placement: physical or co-located
def one_h200() -> Machine:
    # Ports far from a lone run's 30000/30100, which another run on this machine may hold.
    return Machine({0: H200}, tuple(range(16)), port_base=41000)


def suite_plan(names: list[str], machine: Machine, mode: str, *, gpu: bool = True,
               rank_mem_fraction: float | None = None) -> tuple[Pool, list[Entry]]:
    pool = Pool(machine)
    files = [ROOT / "scenarios" / f"{n}.cps" for n in names]
    return pool, plan_entries(files, machine, engine=None, gpu_present=gpu, pool=pool, placement_mode=mode,
                              rank_mem_fraction=rank_mem_fraction)


def child_plan(entry: Entry, granted: Granted, rank_mem_fraction: float | None = None) -> Plan:
    """What the child `cptest run` plans from its argv, on a machine with more GPUs than the suite
    gave it (its own `auto` would not co-locate there)."""
    from cptest import pipeline
    from cptest.cli import parse_placement, run

    argv = child_argv(entry, granted, results=Path("r"), engine=None, ignore_lint=False, launcher="process",
                      rank_mem_fraction=rank_mem_fraction)
    o = run.make_context("run", argv[4:]).params
    return pipeline.prepare(Path(o["file"]), engine=o["engine_name"], gpu_present=True,
                            placement=parse_placement(o["gpus"], o["cpus"], o["ports"],
                                                      o["rank_mem_fraction"]),
                            placement_mode=o["placement_mode"], gpus_here=8).plan


def ports_held(planned: Plan) -> set[int]:
    """Every port the plan's servers bind: each node's HTTP port and node 0's rendezvous."""
    out = set()
    for server in planned.servers():
        for node in server.nodes:
            out.add(node.port)
            if "--dist-init-addr" in node.argv:
                out.add(int(node.argv[node.argv.index("--dist-init-addr") + 1].rsplit(":", 1)[1]))
    return out


def test_on_one_gpu_two_colocated_sglang_scenarios_share_it_on_ports_of_their_own() -> None:
    pool, entries = suite_plan(["dcp4_llama", "dcp2_llama_kv1"], one_h200(), "auto")
    assert [(e.demand.placement, e.demand.gpus, e.not_run) for e in entries] == [("colocated", 1, None)] * 2
    started = next_to_start(pool, [(e.key, e.demand) for e in entries])
    assert len(started) == 2 and all(g.gpus == (0,) for _, _, g in started)
    assert pool.free_mib[0] == H200 - sum(e.demand.gpu_mib for e in entries)
    plans = [child_plan(e, g) for e, (_, _, g) in zip(entries, started, strict=True)]
    for p, e in zip(plans, entries, strict=True):
        assert p.placement == "colocated" and demand_of(parse_file(e.file), p, H200) == e.demand
        assert all(s.colocation.rank_gpus == [0] * s.world_size for s in p.servers() if s.colocated)
    dcp4, dcp2 = (ports_held(p) for p in plans)
    # main and baseline co-located (4 ranks, 2 ranks), each a TP1 control on its baseline's port
    assert dcp4 == {*range(41000, 41004), 41050, *range(41100, 41104), 41150}
    assert dcp2 == {41200, 41201, 41250, 41300, 41301, 41350}
    assert not dcp4 & dcp2


def test_two_colocated_reference_scenarios_run_side_by_side_on_disjoint_ports() -> None:
    machine = Machine({0: H200}, (0, 1), port_base=41000)
    pool, entries = suite_plan(["reference_stop_rank_dcp2", "reference_pcp2_interleave_qwen3"], machine,
                               "colocated", gpu=False)
    assert [(e.demand.placement, e.not_run) for e in entries] == [("colocated", None)] * 2
    started = next_to_start(pool, [(e.key, e.demand) for e in entries])
    assert [g.cpus for _, _, g in started] == [(0,), (1,)]
    plans = [child_plan(e, g) for e, (_, _, g) in zip(entries, started, strict=True)]
    assert [p.placement for p in plans] == ["colocated"] * 2
    a, b = (ports_held(p) for p in plans)
    assert {41000, 41001, 41050} <= a and {41200, 41201, 41250} <= b and not a & b


def test_ports_of_concurrent_slots_never_meet_at_the_most_ranks_a_server_may_co_locate() -> None:
    from cptest.engines.protocol import MAX_COLOCATED_RANKS, RENDEZVOUS_PORT_OFFSET, node_port

    machine = one_h200()

    def held(slot: int) -> set[int]:
        nodes = [node_port(0, k, True) for k in range(MAX_COLOCATED_RANKS)]
        return {p + extra for p in machine.ports(slot) for extra in [*nodes, RENDEZVOUS_PORT_OFFSET]}

    blocks = [held(slot) for slot in range(machine.slots)]
    assert sum(len(b) for b in blocks) == len(set().union(*blocks))
    assert machine.ports(0) == (41000, 41100) and machine.ports(1) == (41200, 41300)


def test_physical_placement_on_one_gpu_keeps_two_rank_sglang_plans_out() -> None:
    _, entries = suite_plan(["dcp2_llama_kv1", "tp1_llama_kv1"], one_h200(), "physical")
    by = {e.name: e for e in entries}
    assert by["dcp2_llama_kv1"].not_run == "needs 2 GPU(s), the suite has 1"
    assert by["tp1_llama_kv1"].not_run is None
    assert {e.demand.placement for e in entries} == {"physical"}


def test_the_child_gets_the_placement_decided_and_the_rank_memory_fraction() -> None:
    pool, entries = suite_plan(["dcp2_llama_kv1", "tp1_llama_kv1"], one_h200(), "auto",
                               rank_mem_fraction=0.05)
    started = next_to_start(pool, [(e.key, e.demand) for e in entries])
    colocated, physical = (child_argv(e, g, results=Path("r"), engine=None, ignore_lint=False,
                                      launcher="process", rank_mem_fraction=0.05)
                           for e, (_, _, g) in zip(entries, started, strict=True))
    assert colocated[colocated.index("--placement") + 1] == "colocated"
    assert physical[physical.index("--placement") + 1] == "physical"
    assert colocated[colocated.index("--rank-mem-fraction") + 1] == "0.05"
    planned = child_plan(entries[0], started[0][2], rank_mem_fraction=0.05)
    assert planned.main.colocation.mem_fraction == 0.05
