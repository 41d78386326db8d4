"""Specifications of the teacher-forced and free-running generation clauses (D39)."""

from __future__ import annotations

import math
from pathlib import Path

from cptest.checks import check_loaded, load_archive
from cptest.contracts import GenerationParams
from cptest.contracts.generation import GenBound
from cptest.contracts.parity import forced, free_running, nearest_rank
from cptest.evidence import RequestResult, Score
from cptest.testing.archives import make_plan, server_plan, write_archive


def score(
    run: str,
    index: int,
    lps: list[float],
    tops: list[list[int]] | None = None,
    sha: str = "s",
    status: str = "ok",
) -> Score:
    top = [[(t, -0.1 * (r + 1)) for r, t in enumerate(ids)] for ids in (tops or [[7, 8, 9]] * len(lps))]
    return Score(
        run=run,
        index=index,
        sequence_sha256=f"{sha}{index}",
        start=4,
        status=status,  # type: ignore[arg-type]
        token_logprobs=lps,
        top=top,
    )


def req(run: str, index: int, ids: list[int], top: list[list[int]] | None = None) -> RequestResult:
    return RequestResult(
        run=run,
        index=index,
        prompt_len=4,
        max_new_tokens=len(ids),
        prompt_sha256="x",  # type: ignore[arg-type]
        status="ok",
        output_ids=ids,
        output_logprobs=[-0.1] * len(ids),
        output_top=None if top is None else [[(t, -0.1) for t in p] for p in top],
    )


def judge(tmp_path: Path, params: GenerationParams, runner: dict[str, list]) -> object:
    plan = make_plan(server_plan(), [params], baseline=server_plan("baseline"))
    if "control" in runner:
        plan = plan.model_copy(update={"control": server_plan("control")})
    write_archive(tmp_path, plan, runner=runner)
    return check_loaded(load_archive(tmp_path), finished=True).verdicts[0]


REL = GenerationParams(bounds=[GenBound(metric="logprob", stat="p99", limit=4.0, relative=True)])


def test_nearest_rank_takes_a_value_that_occurred() -> None:
    values = sorted(float(v) for v in range(1, 101))
    assert (nearest_rank(values, 0.5), nearest_rank(values, 0.99), nearest_rank(values, 1.0)) == (
        50.0,
        99.0,
        100.0,
    )


def test_forced_figures_compare_position_by_position_and_skip_missing_logprobs() -> None:
    main = [score("main", 0, [-1.0, -2.0, math.nan, -4.0])]
    base = [score("baseline", 0, [-1.1, -2.0, -3.0, -3.5])]
    fig = forced(main, base, [1])
    assert fig.positions == 3 and sorted(round(d, 6) for d in fig.deltas) == [0.0, 0.1, 0.5]
    assert fig.stat("max") == 0.5 and fig.agreement(1) == 1.0


def test_forced_refuses_to_compare_different_sequences() -> None:
    fig = forced([score("main", 0, [-1.0], sha="a")], [score("baseline", 0, [-1.0], sha="b")], [1])
    assert fig.requests == 0 and fig.mismatched == [0] and fig.stat("p99") is None


def test_topk_agreement_needs_each_top1_in_the_others_topk() -> None:
    main = [score("main", 0, [-1.0, -1.0], tops=[[5, 6, 7], [9, 6, 7]])]
    base = [score("baseline", 0, [-1.0, -1.0], tops=[[6, 5, 7], [6, 7, 8]])]
    fig = forced(main, base, [1, 2])
    # position 0: top1 5 vs 6, each in the other's top 2; position 1: 9 is not in the baseline's top 2
    assert fig.agreement(1) == 0.0 and fig.agreement(2) == 0.5


def test_relative_bound_passes_within_k_times_the_control_floor(tmp_path: Path) -> None:
    v = judge(
        tmp_path,
        REL,
        {
            "main": [score("main", 0, [-1.0, -2.0, -3.0])],
            "baseline": [score("baseline", 0, [-1.1, -2.1, -3.1])],
            "control": [score("control", 0, [-1.05, -2.05, -3.05])],
        },
    )
    assert v.status == "pass", v.reason
    row = v.figures["bounds"][0]
    assert row["floor"] == 0.05 and row["limit"] == 0.2 and row["ratio"] == 2.0


def test_relative_bound_fails_above_k_times_the_floor_and_names_both(tmp_path: Path) -> None:
    v = judge(
        tmp_path,
        REL,
        {
            "main": [score("main", 0, [-1.0, -2.0, -2.0])],
            "baseline": [score("baseline", 0, [-1.0, -2.0, -3.0])],
            "control": [score("control", 0, [-1.0, -2.0, -3.1])],
        },
    )
    assert v.status == "fail"
    assert "logprob p99 1 > 0.4" in v.reason and "floor 0.1" in v.reason


def test_relative_bound_without_control_evidence_is_unknown(tmp_path: Path) -> None:
    v = judge(tmp_path, REL, {"main": [score("main", 0, [-1.0])], "baseline": [score("baseline", 0, [-1.0])]})
    assert v.status == "unknown" and "no control evidence" in v.reason


def test_absolute_bound_and_agreement(tmp_path: Path) -> None:
    p = GenerationParams(
        bounds=[
            GenBound(metric="logprob", stat="max", limit=0.05),
            GenBound(metric="topk_agree", k=1, limit=0.9),
        ]
    )
    v = judge(
        tmp_path,
        p,
        {"main": [score("main", 0, [-1.0, -2.0])], "baseline": [score("baseline", 0, [-1.04, -2.0])]},
    )
    assert v.status == "pass", v.reason
    v = judge(
        tmp_path / "b",
        p,
        {"main": [score("main", 0, [-1.0, -2.0])], "baseline": [score("baseline", 0, [-1.06, -2.0])]},
    )
    assert v.status == "fail" and "logprob max 0.06 > 0.05" in v.reason


def test_no_scores_on_either_side_is_unknown(tmp_path: Path) -> None:
    p = GenerationParams(bounds=[GenBound(metric="logprob", stat="p50", limit=1.0)])
    v = judge(
        tmp_path,
        p,
        {"main": [score("main", 0, [-1.0], status="error")], "baseline": [score("baseline", 0, [-1.0])]},
    )
    assert v.status == "unknown"


def test_free_running_rule_accepts_a_divergence_inside_both_topk_and_stops_there() -> None:
    main = [req("main", 0, [1, 2, 9, 4], top=[[1], [2], [9, 3], [4]])]
    base = [req("baseline", 0, [1, 2, 3, 5], top=[[1], [2], [3, 9], [5]])]
    fr = free_running(main, base, 2)
    assert (fr.diverged, fr.within_topk, fr.violations) == (1, 1, [])
    assert free_running(main, base, 1).violations[0]["position"] == 2


def test_free_running_clause_fails_on_a_divergence_outside_topk(tmp_path: Path) -> None:
    p = GenerationParams(free_running_topk=2)
    v = judge(
        tmp_path,
        p,
        {
            "main": [req("main", 0, [1, 8], top=[[1], [8, 6]])],
            "baseline": [req("baseline", 0, [1, 3], top=[[1], [3, 4]])],
        },
    )
    assert v.status == "fail" and "request 0 at output position 1" in v.reason


def test_free_running_without_top_lists_is_unknown_not_pass(tmp_path: Path) -> None:
    p = GenerationParams(free_running_topk=2)
    v = judge(tmp_path, p, {"main": [req("main", 0, [1, 8])], "baseline": [req("baseline", 0, [1, 3])]})
    assert v.status == "unknown"


def test_a_floor_below_float32_resolution_is_raised_to_it(tmp_path: Path) -> None:
    # control bit-identical to the baseline, main one float32 ulp away at |logprob| 6: the floor is
    # the resolution (2**-21 at 4..8), not 0, and one ulp passes 4 x floor
    ulp = 2.0**-21
    v = judge(
        tmp_path,
        REL,
        {
            "main": [score("main", 0, [-6.0 - ulp, -6.5])],
            "baseline": [score("baseline", 0, [-6.0, -6.5])],
            "control": [score("control", 0, [-6.0, -6.5])],
        },
    )
    assert v.status == "pass", v.reason
    assert v.figures["bounds"][0]["floor"] == v.figures["bounds"][0]["resolution"] == parity_sig(ulp)


def parity_sig(x: float) -> float:
    from cptest.contracts.parity import sig

    return sig(x)
