"""cptest/reference/server_args.py: the server's argv round-trips, and plans label reference ranks."""

from __future__ import annotations

from pathlib import Path

from cptest.engines.reference import choose
from cptest.lang import parse_file
from cptest.plan import plan
from cptest.reference.layout import node_ranks
from cptest.reference.server_args import ReferenceConfig, build_argv, parse
from cptest.topology import Degrees

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def test_argv_round_trips_through_the_server_parser() -> None:
    degrees = Degrees(tp=4, dcp=1, attn_cp=2, prefill_cp=True, cp_strategy="interleave")
    cfg = ReferenceConfig(model_path="/m", degrees=degrees, port=31234, page_size=2, max_total_tokens=1000,
                          context_length=512)
    argv = build_argv(cfg)
    assert argv[:3] == ["python3", "-m", "cptest.reference.server"]
    assert parse(argv[3:]) == cfg


def test_reference_plan_targets_reference_rank_titles_never_sglang_ones() -> None:
    s = choose(parse_file(SCENARIOS / "fault_kill_rank_dcp2.cps"), "reference", gpu_present=False).scenario
    p = plan(s)
    assert p.main.engine == "reference" and p.main.process_title_prefix == "cptest-ref::scheduler"
    assert [g.process_title for g in p.main.geometry] == ["cptest-ref::scheduler_TP0",
                                                             "cptest-ref::scheduler_TP1"]
    assert p.faults[0].process_title == "cptest-ref::scheduler_TP1"
    assert "--dcp-size" in p.main.nodes[0].argv and "sglang" not in " ".join(p.main.nodes[0].argv)


def test_a_multi_node_argv_round_trips_with_sglangs_node_flags() -> None:
    degrees = Degrees(tp=4, dcp=2, nodes=2, cp_strategy="zigzag")
    cfg = ReferenceConfig(model_path="/m", degrees=degrees, node_rank=1, dist_init_addr="10.0.0.7:30050")
    argv = build_argv(cfg)
    at = argv.index("--nnodes")
    assert argv[at:] == ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.7:30050"]
    assert parse(argv[3:]) == cfg


def test_two_node_plan_gives_each_node_its_rank_and_node_0s_rendezvous() -> None:
    p = plan(parse_file(SCENARIOS / "reference_two_node_kill_rank.cps"))
    argvs = [n.argv for n in p.main.nodes]
    assert [a[a.index("--node-rank") + 1] for a in argvs] == ["0", "1"]
    assert {a[a.index("--dist-init-addr") + 1] for a in argvs} == {"127.0.0.1:30050"}
    assert node_ranks(p.main.topology, 0) == range(0, 1) and node_ranks(p.main.topology, 1) == range(1, 2)
