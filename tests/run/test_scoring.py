"""Specifications of cptest/run/scoring.py: what is sent, and which answers become figures."""

from __future__ import annotations

import math

from cptest.evidence import RequestResult
from cptest.plan.model import PlannedRequest, SamplingParams, WorkloadPlan
from cptest.run.scoring import Sequence, parse_answer, payload, sequences_from

SEQ = Sequence(index=0, input_ids=[5, 6, 7, 8, 9], start=3)  # prompt 5 6 7, output 8 9


def answer(ids: list[int], lps: list[float | None]) -> dict:
    toks = [[lp, t, None] for lp, t in zip(lps, ids, strict=True)]
    tops = [None] + [[[lp, t, None], [(lp or 0.0) - 1.0, 3, None]]
                     for lp, t in zip(lps[1:], ids[1:], strict=True)]
    return {"meta_info": {"input_token_logprobs": toks, "input_top_logprobs": tops}}


def test_scoring_asks_from_one_position_before_the_first_scored_token() -> None:
    # SGLang's first input entry is always null: asking from the prompt's last token scores output 0.
    p = payload(SEQ, 5)
    assert (p["logprob_start_len"], p["top_logprobs_num"], p["stream"]) == (2, 5, False)
    assert p["sampling_params"]["max_new_tokens"] == 1 and p["input_ids"] == SEQ.input_ids


def test_an_answer_gives_the_scored_tokens_logprobs_and_sorted_tops() -> None:
    lps, top = parse_answer(SEQ, answer([7, 8, 9], [None, -1.5, -0.5]))
    assert lps == [-1.5, -0.5]
    assert top == [[(8, -1.5), (3, -2.5)], [(9, -0.5), (3, -1.5)]]


def test_an_answer_about_other_tokens_is_refused_not_compared() -> None:
    # Observed on SGLang 0.5.17: token 4095 came back as 0 (results/_measure run9 scoring-check).
    why = parse_answer(SEQ, answer([7, 0, 9], [None, -1.5, -0.5]))
    assert why == "the engine scored token 0 at position 3, the sequence has 8"
    assert "positions" in parse_answer(SEQ, answer([8, 9], [-1.5, -0.5]))
    assert parse_answer(SEQ, {"error": {"message": "busy"}}) == "busy"


def test_a_missing_logprob_is_nan_not_zero() -> None:
    lps, _ = parse_answer(SEQ, answer([7, 8, 9], [None, None, -0.5]))
    assert math.isnan(lps[0]) and lps[1] == -0.5


def test_sequences_are_the_baselines_ok_answers_after_their_prompts() -> None:
    reqs = [PlannedRequest(index=i, input_ids=[3, 4 + i], max_new_tokens=2, sampling=SamplingParams())
            for i in range(3)]
    w = WorkloadPlan(seed=1, concurrency=2, rate_per_s=None, timeout_s=10, requests=reqs)

    def res(i: int, status: str, out: list[int]) -> RequestResult:
        return RequestResult(run="baseline", index=i, prompt_len=2, max_new_tokens=2, prompt_sha256="x",
                             status=status, output_ids=out)  # type: ignore[arg-type]

    seqs = sequences_from([res(2, "ok", [9]), res(0, "ok", [7, 8]), res(1, "error", [])], w)
    assert [(s.index, s.input_ids, s.start) for s in seqs] == [(0, [3, 4, 7, 8], 2), (2, [3, 6, 9], 2)]
