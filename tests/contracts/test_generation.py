"""Specifications of cptest/contracts/generation.py."""

from __future__ import annotations

from pathlib import Path

from cptest.checks import check_loaded, load_archive
from cptest.contracts import Expectation, GenerationParams
from cptest.evidence import RequestResult
from cptest.testing.archives import make_plan, server_plan, write_archive

EXPECT = GenerationParams(tokens_agree=0.75, logprob_within=0.05)


def _req(index: int, ids: list[int], lps: list[float] | None = None, run: str = "main", status: str = "ok"):
    return RequestResult(
        run=run,
        index=index,
        prompt_len=4,
        max_new_tokens=4,
        prompt_sha256="x",
        status=status,
        output_ids=ids,
        output_logprobs=lps or [-0.1] * len(ids),
    )


def _run(tmp_path: Path, main: list, base: list | None, expect: Expectation = EXPECT):
    plan = make_plan(server_plan(), [expect], baseline=server_plan("baseline"))
    runner = {"main": main} if base is None else {"main": main, "baseline": base}
    write_archive(tmp_path, plan, runner=runner)
    return check_loaded(load_archive(tmp_path)).verdicts[0]


def test_generation_counts_agreement_up_to_the_first_divergence(tmp_path: Path) -> None:
    # request 0 agrees fully (4/4); request 1 diverges at position 2 and agrees again after (2/4 counted)
    main = [_req(0, [1, 2, 3, 4]), _req(1, [5, 6, 9, 8])]
    base = [_req(0, [1, 2, 3, 4], run="baseline"), _req(1, [5, 6, 7, 8], run="baseline")]
    v = _run(tmp_path, main, base)
    assert v.status == "pass", v.reason
    assert (v.figures["agreed_tokens"], v.figures["compared_tokens"], v.figures["tokens_agree"]) == (
        6,
        8,
        0.75,
    )
    assert v.figures["first_divergence"] == {"index": 1, "position": 2, "main": 9, "baseline": 7}


def test_generation_below_agreement_fails_naming_the_first_divergence(tmp_path: Path) -> None:
    v = _run(tmp_path, [_req(0, [1, 9, 9, 9])], [_req(0, [1, 2, 3, 4], run="baseline")])
    assert v.status == "fail"
    assert "request 0 at output position 1" in v.reason


def test_generation_logprob_beyond_tolerance_fails(tmp_path: Path) -> None:
    v = _run(tmp_path, [_req(0, [1, 2], [-0.1, -0.3])], [_req(0, [1, 2], [-0.1, -0.2], run="baseline")])
    assert v.status == "fail"
    assert v.figures["max_logprob_diff_at"] == {"index": 0, "position": 1}


def test_generation_missing_baseline_is_unknown(tmp_path: Path) -> None:
    v = _run(tmp_path, [_req(0, [1])], None)
    assert v.status == "unknown" and "no baseline evidence" in v.reason


def test_generation_only_failed_requests_is_unknown(tmp_path: Path) -> None:
    v = _run(tmp_path, [_req(0, [], status="error")], [_req(0, [1], run="baseline")])
    assert v.status == "unknown"
