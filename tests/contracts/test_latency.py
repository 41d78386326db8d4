"""Specification of cptest/contracts/latency.py: the statement in the language, the checker on
hand-built runner evidence, and the checker on a published archive's evidence through `cptest check`'s
own path (the plan's expectations judged by `check_loaded`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cptest.checks import check_loaded, guarded, load_archive
from cptest.contracts import CONTRACTS
from cptest.contracts.latency import LatencyParams, check
from cptest.errors import ScenarioError
from cptest.evidence import Evidence, RequestResult, RoleEvidence, RunnerEvidence
from cptest.lang import format_text, parse_text
from cptest.testing.archives import make_plan, server_plan, write_archive

TEXT = """cptest 1
scenario t {
  engine reference
  model synthetic llama { layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 vocab 128 intermediate 128 }
  topology { gpus 2 tp 2 }
  workload { requests 8 concurrency 2 prompt_tokens 16 output_tokens 4 }
  expect { {expect} }
}
"""


def _parse(expect: str) -> Any:
    return parse_text(TEXT.replace("{expect}", expect), "t.cps").expect


# ------------------------------------------------------------------------------------ language
def test_statements_parse_to_metric_statistic_and_bound_in_seconds() -> None:
    got = _parse("latency ttft p99 <= 500ms latency e2e max <= 2m").latency
    assert [(x.metric, x.stat, x.limit_s) for x in got] == [("ttft", "p99", 0.5), ("e2e", "max", 120.0)]


def test_the_formatter_writes_it_after_serving_and_reads_back_the_same() -> None:
    text = TEXT.replace("{expect}", "latency tpot p50   <= 1500ms serving all_complete")
    out = format_text(text, "t.cps")
    assert "    serving all_complete\n    latency tpot p50 <= 1500ms\n" in out
    assert parse_text(out, "t.cps") == parse_text(text, "t.cps")


def test_a_scenario_without_it_keeps_its_value_and_hash() -> None:
    assert "latency" not in _parse("serving all_complete").model_dump()


def test_the_plan_lists_it_after_serving_in_the_registry_order() -> None:
    names = list(CONTRACTS)
    assert names.index("serving") < names.index("latency") < names.index("shutdown")


@pytest.mark.parametrize(("expect", "message", "col"), [
    ("latency ttft p99 <= 5", "a latency bound is a duration", 12),  # the statement
    ("latency ttft p99 <= 0s", "a latency bound must be > 0", 12),
    ("latency tftt p99 <= 5s", "unknown latency metric 'tftt'", 20),  # the metric
    ("latency ttft p95 <= 5s", "unknown latency statistic 'p95'", 25),  # the statistic
])
def test_a_bad_statement_is_refused_at_its_part(expect: str, message: str, col: int) -> None:
    with pytest.raises(ScenarioError) as err:
        _parse(expect)
    problem = err.value.problems[0]
    assert problem.message == message
    assert (problem.span.line, problem.span.col) == (7, col)


# ------------------------------------------------------------------------------------ checker
def _evidence(e2e: list[float | None], *, timeouts: int = 0, errors: int = 0, colocated: bool = False,
              runner: bool = True) -> Evidence:
    reqs = [RequestResult(index=i, prompt_len=16, max_new_tokens=4, prompt_sha256="x", status="ok",
                          e2e_s=v, ttft_s=None if v is None else v / 4)
            for i, v in enumerate(e2e)]
    n = len(reqs)
    reqs += [RequestResult(index=n + i, prompt_len=16, max_new_tokens=4, prompt_sha256="x", status="timeout")
             for i in range(timeouts)]
    # An error answer is timed too (here slower than any completion): it is still no latency.
    reqs += [RequestResult(index=n + timeouts + i, prompt_len=16, max_new_tokens=4, prompt_sha256="x",
                           status="error", error="boom", e2e_s=500.0) for i in range(errors)]
    role = RoleEvidence(role="main", engine="reference", placement="colocated" if colocated else "physical",
                        runner=RunnerEvidence.of(reqs) if runner else None)
    return Evidence(roles={"main": role}, requests=list(range(len(reqs))))


TIMES = [float(x) for x in range(1, 101)]  # 1 s .. 100 s: p50 50 s, p90 90 s, p99 99 s, max 100 s


@pytest.mark.parametrize(("stat", "limit", "status", "measured"), [
    ("p50", 50.0, "pass", 50.0), ("p50", 49.9, "fail", 50.0), ("p90", 90.0, "pass", 90.0),
    ("p99", 98.5, "fail", 99.0), ("max", 100.0, "pass", 100.0), ("max", 99.9, "fail", 100.0),
])
def test_the_statistic_is_the_nearest_rank_and_is_held_against_the_bound(
        stat: str, limit: float, status: str, measured: float) -> None:
    v = check(_evidence(TIMES), LatencyParams(metric="e2e", stat=stat, limit_s=limit))
    assert (v.status, v.figures["measured_s"], v.figures["timed"]) == (status, measured, 100), v.reason


def test_the_metric_reads_its_own_field() -> None:
    # ttft is a quarter of e2e here: 25 s passes a 30 s bound that e2e (100 s) exceeds.
    assert check(_evidence(TIMES), LatencyParams(metric="ttft", stat="max", limit_s=30)).status == "pass"
    assert check(_evidence(TIMES), LatencyParams(metric="e2e", stat="max", limit_s=30)).status == "fail"


def test_errors_are_not_latencies_and_requests_without_the_figure_are_left_out() -> None:
    v = check(_evidence([1.0, None, 2.0], errors=5), LatencyParams(metric="e2e", stat="max", limit_s=2))
    assert (v.status, v.figures["timed"]) == ("pass", 2)


def test_timeouts_count_as_slowest_and_a_statistic_among_them_is_unknown() -> None:
    # 98 timed + 2 timeouts: p99 is the 99th of 100, a timeout; p90 stays among the timed ones.
    ev = _evidence(TIMES[:98], timeouts=2)
    v = check(ev, LatencyParams(metric="e2e", stat="p99", limit_s=1000))
    assert v.status == "unknown" and "timed-out" in v.reason
    assert check(ev, LatencyParams(metric="e2e", stat="p90", limit_s=90)).status == "pass"


def test_no_runner_or_no_completed_request_is_unknown() -> None:
    p = LatencyParams(metric="e2e", stat="max", limit_s=10)
    assert "runner.jsonl missing" in check(_evidence([], runner=False), p).reason
    assert check(_evidence([], errors=3), p).status == "unknown"


def test_co_located_times_meet_a_bound_but_exceeding_it_is_not_a_finding() -> None:
    p = LatencyParams(metric="e2e", stat="max", limit_s=50)
    assert check(_evidence(TIMES, colocated=True), p).status == "unknown"
    assert check(_evidence(TIMES[:50], colocated=True), p).status == "pass"


def test_a_planned_latency_expectation_is_judged_from_the_archive(tmp_path: Path) -> None:
    runner = [RequestResult(index=i, prompt_len=16, max_new_tokens=4, prompt_sha256="x", status="ok",
                            e2e_s=0.1 * (i + 1)) for i in range(4)]
    plan = make_plan(server_plan(world=2), [LatencyParams(metric="e2e", stat="max", limit_s=0.3)])
    write_archive(tmp_path, plan, runner={"main": runner})
    loaded = load_archive(tmp_path)
    assert plan.model_validate_json(plan.model_dump_json()) == plan  # plan.json holds it
    v = check_loaded(loaded).verdicts[0]
    assert (v.checker, v.status, v.figures["measured_s"]) == ("latency", "fail", 0.4), v.reason


ARCHIVE = Path(__file__).resolve().parents[2] / "results/dcp2_llama_kv1/20261203T120204Z-f0a989b3"


def test_a_published_sglang_archive_s_evidence_is_judged() -> None:
    """SGLang 0.5.17, TP2/DCP2 co-located, 32 requests that each took 5.3-6.9 s end to end."""
    evidence = load_archive(ARCHIVE).evidence
    held = guarded(evidence, LatencyParams(metric="e2e", stat="max", limit_s=60))
    assert held.status == "pass" and held.figures["timed"] == 32
    assert 5 < held.figures["measured_s"] < 7
    exceeded = guarded(evidence, LatencyParams(metric="e2e", stat="p50", limit_s=1))
    assert exceeded.status == "unknown" and "co-located" in exceeded.reason
