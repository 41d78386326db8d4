"""Specifications of cptest/report/__init__.py."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from cptest.report import matrix_rows, render, render_junit, render_matrix
from cptest.testing.archives import colocate, make_plan, server_plan
from cptest.verdict import Verdict, scenario_verdict

VERDICTS = [
    Verdict(checker="launch", status="pass", reason="ready after 3 s", source="a.cps:4:5"),
    Verdict(checker="capacity", status="fail", reason="scheduler | reports 1000", figures={"found": 1000}),
    Verdict(checker="graph", status="unknown", reason="no capture <recorded> & more"),
]


def test_report_lists_every_verdict_with_its_reason_and_escapes_pipes() -> None:
    sv = scenario_verdict("dcp2", "sglang", "0.5.17", VERDICTS)
    md = render(sv, make_plan(server_plan(world=2, dcp=2)))
    assert md.startswith("# dcp2: FAIL\n")
    assert "| capacity | FAIL | scheduler \\| reports 1000 |  |" in md
    assert "| launch | PASS | ready after 3 s | a.cps:4:5 |" in md
    assert '"found": 1000' in md
    assert "never count as SGLang" not in md


def test_reference_engine_report_says_it_does_not_qualify_sglang() -> None:
    md = render(scenario_verdict("x", "reference", "", VERDICTS[:1]))
    assert "never count as SGLang qualification" in md


def test_a_colocated_report_states_where_its_ranks_ran_and_what_that_cannot_judge_near_the_top() -> None:
    sv = scenario_verdict("dcp2", "sglang", "0.5.17", VERDICTS, placement="colocated")
    md = render(sv, make_plan(colocate(server_plan(world=2, dcp=2))))
    top = md[:md.index("## Verdicts")]
    assert top.splitlines()[2].startswith("> Co-located: each rank ran as its own local node process")
    assert "is not a speed measurement" in top.splitlines()[2]
    assert "| placement | co-located (see Placement) |" in top
    for row in ("| rank → GPU | rank 0: GPU 0; rank 1: GPU 0 |",
                "| ranks per GPU | 2 |",
                "| transport | NCCL over sockets on loopback (no P2P, SHM, IB, custom all-reduce) |",
                "| environment added to every node | NCCL_SOCKET_IFNAME=lo, NCCL_NET=Socket, "
                "NCCL_P2P_DISABLE=1 |",
                "| environment added per node | node 0: NCCL_HOSTID=cptest-node0; "
                "node 1: NCCL_HOSTID=cptest-node1 |",
                "| flags added | --disable-custom-all-reduce |",
                "| memory fraction of each rank | 0.25 (the scenario's mem_fraction 0.5 / 2 rank(s) "
                "per GPU) |",
                "- per-GPU memory accounting (device totals mix the ranks that share a GPU)"):
        assert row in top, row


def test_a_physical_report_says_nothing_of_placement() -> None:
    sv = scenario_verdict("dcp2", "sglang", "0.5.17", VERDICTS)
    md = render(sv, make_plan(server_plan(world=2, dcp=2)))
    assert "co-located" not in md.lower() and "placement" not in md


def test_a_colocated_verdict_without_a_plan_still_says_co_located() -> None:
    md = render(scenario_verdict("dcp2", "sglang", "0.5.17", VERDICTS, placement="colocated"))
    assert "| placement | co-located (see Placement) |" in md
    assert "The plan is unreadable, so where the ranks ran is unknown." in md


def test_junit_carries_the_placement_of_a_colocated_verdict_only() -> None:
    def props(sv):
        root = ET.fromstring(render_junit(sv))
        return {p.get("name"): p.get("value") for p in root.findall("./testsuite/properties/property")}

    assert props(scenario_verdict("d", "sglang", "0.5.17", VERDICTS, placement="colocated"))["placement"] == \
        "colocated"
    assert "placement" not in props(scenario_verdict("d", "sglang", "0.5.17", VERDICTS))


def test_junit_has_one_testcase_per_checker_failure_and_error() -> None:
    root = ET.fromstring(render_junit(scenario_verdict("dcp2", "sglang", "0.5.17", VERDICTS)))
    cases = root.findall("./testsuite/testcase")
    assert [c.get("name") for c in cases] == ["1-launch", "2-capacity", "3-graph"]
    assert cases[1].find("failure").get("message") == "scheduler | reports 1000"
    assert cases[2].find("error").get("message") == "no capture <recorded> & more"
    assert root.find("testsuite").get("failures") == "1"


def test_render_reads_an_archive_directory(tmp_path: Path) -> None:
    (tmp_path / "verdict.json").write_text(scenario_verdict("s", "sglang", "0.5.17", VERDICTS[:1]).to_json())
    assert render(tmp_path).startswith("# s: PASS")


def test_matrix_has_one_row_per_archive_sorted_with_engine_and_checker_columns(tmp_path: Path) -> None:
    dirs = []
    for name, engine, vs in (("zeta", "sglang", VERDICTS), ("alpha", "reference", VERDICTS[:1])):
        d = tmp_path / name / "20250101T000000Z-00000000"
        d.mkdir(parents=True)
        (d / "verdict.json").write_text(scenario_verdict(name, engine, "", vs).to_json())
        dirs.append(d)
    unchecked = tmp_path / "beta" / "20250101T000000Z-11111111"
    unchecked.mkdir(parents=True)
    lines = render_matrix([*dirs, unchecked]).splitlines()
    assert lines[0] == "| scenario | engine | verdict | launch | capacity | graph | archive |"
    assert lines[2] == "| alpha | reference | **PASS** | PASS | - | - | 20250101T000000Z-00000000 |"
    assert lines[3].startswith("| beta | ? | **not checked** |")
    assert lines[4] == "| zeta | sglang | **FAIL** | PASS | FAIL | UNKNOWN | 20250101T000000Z-00000000 |"


def test_matrix_keeps_the_newest_archive_per_scenario_and_shows_the_generation_floor(tmp_path: Path) -> None:
    old = Verdict(checker="generation", status="fail", reason="greedy", figures={"tokens_agree": 0.6})
    new = Verdict(checker="generation", status="pass", reason="p99", figures={"bounds": [
        {"bound": "logprob p99 <= 4 * control", "measured": 0.012, "floor": 0.01, "ratio": 1.2}]})
    dirs = []
    for stamp, v in (("20260101T000000Z-aaaaaaaa", old), ("20260102T000000Z-bbbbbbbb", new)):
        d = tmp_path / "dcp2" / stamp
        d.mkdir(parents=True)
        (d / "verdict.json").write_text(scenario_verdict("dcp2", "sglang", "0.5.17", [v]).to_json())
        dirs.append(d)
    lines = render_matrix(reversed(dirs)).splitlines()
    assert lines[0] == "| scenario | engine | verdict | generation | archive | older |"
    assert lines[2] == ("| dcp2 | sglang | **PASS** | PASS (p99 0.012 / floor 0.01 = 1.2x) | "
                        "20260102T000000Z-bbbbbbbb | 1 |")
    assert len([x for x in lines if x.startswith("| dcp2")]) == 1 and "†" not in "".join(lines)
    only_old = render_matrix(dirs[:1])
    assert "FAIL †" in only_old and "superseded by teacher-forced parity" in only_old


def _archive(root: Path, scenario: str, stamp: str, placement: str = "physical") -> Path:
    d = root / scenario / stamp
    d.mkdir(parents=True)
    v = scenario_verdict(scenario, "sglang", "0.5.17", VERDICTS[:1], placement=placement)  # type: ignore[arg-type]
    (d / "verdict.json").write_text(v.to_json())
    return d


def test_a_colocated_archive_never_supersedes_nor_hides_a_physical_one(tmp_path: Path) -> None:
    physical = _archive(tmp_path, "dcp2", "20260101T000000Z-aaaaaaaa")
    newer_colocated = _archive(tmp_path, "dcp2", "20260102T000000Z-bbbbbbbb", "colocated")
    older_colocated = _archive(tmp_path, "dcp2", "20251231T000000Z-cccccccc", "colocated")
    lines = render_matrix([newer_colocated, physical, older_colocated]).splitlines()
    assert lines[0] == "| scenario | engine | verdict | launch | archive | older |"
    # The physical row reads as it did before placements existed; the co-located one says so.
    assert lines[2] == "| dcp2 | sglang | **PASS** | PASS | 20260101T000000Z-aaaaaaaa | - |"
    assert lines[3] == "| dcp2 | sglang, co-located | **PASS** | PASS | 20260102T000000Z-bbbbbbbb | 1 |"
    assert len(lines) == 4
    rows = matrix_rows([physical, newer_colocated])[0]
    assert [(r["placement"], r["older"]) for r in rows] == [("physical", 0), ("colocated", 0)]


def test_the_model_row_names_a_synthetic_model_by_its_architecture_and_geometry() -> None:
    # A model cptest writes itself has no path or hub id: its row was blank.
    from cptest.checks.load import load_plan

    root = Path(__file__).resolve().parents[2] / "results"
    sv = scenario_verdict("dcp2", "sglang", "0.5.17", VERDICTS)
    moe = load_plan(root / "dcp2_qwen3_moe_kv1_eager" / "20261203T143851Z-a58f99bb")
    assert ("| model | synthetic Qwen3MoeForCausalLM (4 layers, hidden 256, 8 heads, 1 KV head, head_dim 64, "
            "experts 8, experts_per_tok 2, vocab 4096, seed 7) |") in render(sv, moe)
    mla = load_plan(root / "dcp2_mla_flashinfer_eager" / "20261203T144851Z-99d48183")
    assert ("| model | synthetic DeepseekV3ForCausalLM (4 layers, hidden 256, 8 heads, 8 KV heads, "
            "kv_lora 512, rope 64, vocab 4096, seed 4321) |") in render(sv, mla)
