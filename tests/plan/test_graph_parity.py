"""Specification of the plan of `graph parity vs eager` (D60): the eager twin, and the scenarios that
cannot compare graphs with eager refused at the statement."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cptest.errors import PlanError
from cptest.lang import parse_file, parse_text
from cptest.plan import plan
from cptest.plan.model import BASELINE_PORT, Plan
from tests.lang.test_graph_parity import TEXT

ROOT = Path(__file__).resolve().parents[2]
QUALIFICATION = ROOT / "scenarios" / "qualification" / "graph_parity_dcp2_llama_kv1.cps"

# The language test's scenario, with one graph parity statement (line 10) and nothing else expected.
BASE = TEXT.replace("    graph prefill eager\n", "").replace(
    "{clauses}", "logprob p99 <= 4 * control free_running topk 5")
"""Line 6: serve; line 7: baseline; line 10: the graph parity statement."""


def _plan_of(text: str) -> Plan:
    return plan(parse_text(text, "t.cps"))


def _graph_flags(argv: list[str]) -> dict[str, str]:
    return {a: argv[i + 1] for i, a in enumerate(argv) if a.startswith("--cuda-graph-backend-")}


def test_the_eager_twin_is_the_main_layout_with_every_graph_phase_disabled() -> None:
    p = _plan_of(BASE)
    assert p.eager is not None and p.eager.role == "eager" and p.eager.eager
    assert p.eager.topology == p.main.topology and p.eager.world_size == p.main.world_size
    assert _graph_flags(p.eager.nodes[0].argv) == {"--cuda-graph-backend-decode": "disabled",
                                                   "--cuda-graph-backend-prefill": "disabled"}
    assert _graph_flags(p.main.nodes[0].argv) == {"--cuda-graph-backend-decode": "full"}
    assert not p.main.eager
    # Apart from graphs and its port, the twin launches what main launches.
    def rest(argv: list[str]) -> list[str]:
        flags = _graph_flags(argv)
        return [a for a in argv if a not in flags and a not in flags.values() and a not in {"30000", "30100"}]
    assert rest(p.eager.nodes[0].argv) == rest(p.main.nodes[0].argv)
    assert p.eager.nodes[0].port == BASELINE_PORT and p.eager.nodes[0].env == p.main.nodes[0].env


def test_graph_parity_alone_plans_the_control_and_the_scoring() -> None:
    p = _plan_of(BASE)
    assert p.control is not None and p.control.topology.tp == 1
    assert p.workload.score_topk == 1 and p.workload.top_logprobs == 5
    assert [s.role for s in p.servers()] == ["main", "baseline", "control", "eager"]


def test_without_graph_parity_no_twin_is_planned_for_any_scenario_of_the_suite() -> None:
    for f in sorted((ROOT / "scenarios").glob("*.cps")):
        assert plan(parse_file(f)).eager is None, f.name


def _refusal(text: str) -> tuple[str, str]:
    with pytest.raises(PlanError) as err:
        _plan_of(text)
    (problem,) = err.value.problems
    span = problem.span
    assert span is not None and (span.file, span.line, span.col) == ("t.cps", 10, 5)
    return problem.message, err.value.render()


def test_a_main_server_running_eager_decode_is_refused_at_the_statement() -> None:
    message, rendered = _refusal(BASE.replace("cuda_graph_decode full", "cuda_graph_decode disabled"))
    assert "cuda_graph_decode is disabled (t.cps:6:11)" in message and "both would run eager" in message
    assert rendered.startswith("t.cps:10:5: ") and "serve { cuda_graph_decode full }" in rendered


def test_an_undeclared_decode_graph_mode_is_refused() -> None:
    message, _ = _refusal(BASE.replace("  serve { cuda_graph_decode full }\n", "  serve { }\n"))
    assert "cuda_graph_decode is not declared" in message


def test_a_contract_that_needs_eager_forwards_is_refused_with_graph_parity(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # No contract needs eager forwards since the probe records replays (D58): a stand-in for one that
    # would (the refusal must still come at the statement, naming the contract).
    from cptest.contracts import CONTRACTS

    monkeypatch.setitem(CONTRACTS, "rows", dataclasses.replace(CONTRACTS["rows"], needs_eager=True))
    text = BASE.replace("    graph parity", "    rows kv_owner position % 2\n    graph parity")
    with pytest.raises(PlanError) as err:
        _plan_of(text)
    (problem,) = err.value.problems
    assert problem.span is not None and problem.span.line == 11
    assert "needs the main server to run decode CUDA graphs, but rows evidence needs per-step records" in \
        problem.message


def test_row_evidence_and_graph_parity_go_together_since_replays_are_recorded() -> None:
    p = _plan_of(BASE.replace("    graph parity", "    rows kv_owner position % 2\n    graph parity"))
    assert p.eager is not None and not p.main.eager


def test_bounds_without_a_baseline_are_refused_and_free_running_alone_is_not() -> None:
    no_base = BASE.replace("  baseline { tp 2 }\n", "")
    with pytest.raises(PlanError) as err:
        _plan_of(no_base)
    assert "score the baseline's sequences" in err.value.problems[0].message
    p = _plan_of(no_base.replace("logprob p99 <= 4 * control ", ""))
    assert p.eager is not None and p.baseline is None and p.control is None and p.workload.score_topk == 0


def test_the_qualification_scenario_plans_graphs_on_main_and_an_eager_twin() -> None:
    p = plan(parse_file(QUALIFICATION))
    assert p.eager is not None and p.control is not None and p.baseline is not None
    # prefill graphs stay off as the suite's defaults declare them (defaults/tiny.cps; SGLang
    # disables them under DCP anyway)
    assert _graph_flags(p.main.nodes[0].argv) == {"--cuda-graph-backend-decode": "full",
                                                  "--cuda-graph-backend-prefill": "disabled"}
    assert _graph_flags(p.eager.nodes[0].argv)["--cuda-graph-backend-decode"] == "disabled"
    graph = next(e for e in p.expectations if e.kind == "graph")
    assert graph.violated_on == "reference" and not graph.expect_violation  # must hold on SGLang


def test_a_rerun_puts_a_twin_without_baseline_back_on_its_port() -> None:
    from cptest.plan.archive_reader import placement_of
    from cptest.plan.model import Placement

    text = BASE.replace("  baseline { tp 2 }\n", "").replace("logprob p99 <= 4 * control ", "")
    archived = plan(parse_text(text, "t.cps"), placement=Placement(main_port=30040, baseline_port=30041))
    assert archived.baseline is None and archived.eager is not None
    assert placement_of(archived).baseline_port == 30041
