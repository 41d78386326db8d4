"""Specification of `cptest.plan.workload`: concrete, deterministic requests from a seed, and datasets."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from cptest.errors import PlanError
from cptest.plan.model import SamplingParams, SyntheticPrompt, WorkloadPlan, encode_ids
from cptest.plan.prompts import synthetic_prompt, synthetic_prompts
from cptest.plan.workload import FIRST_ORDINARY_ID, Dist, build_workload, load_dataset, prompt_sha256

VOCAB = 50
PROMPT = Dist("uniform", (4, 40))
OUTPUT = Dist("fixed", (8,))


def workload(*, requests: int = 16, seed: int = 7, prompt: Dist = PROMPT,
             output: Dist = OUTPUT, rate: float | None = None, vocab: int = VOCAB,
             dataset: list[list[int]] | None = None) -> WorkloadPlan:  # fmt: skip
    return build_workload(
        requests=requests, seed=seed, prompt_tokens=prompt, output_tokens=output,
        sampling=SamplingParams(temperature=0.0), vocab=vocab, concurrency=None if rate else 4, rate=rate,
        timeout_s=30.0, dataset=dataset,
    )  # fmt: skip


def test_same_seed_gives_the_same_requests():
    assert workload(seed=7) == workload(seed=7)


def test_different_seeds_give_different_requests():
    a, b = workload(seed=7), workload(seed=8)
    assert [r.input_ids for r in a.requests] != [r.input_ids for r in b.requests]


def test_request_i_does_not_change_when_the_request_count_grows():
    few, many = workload(requests=5), workload(requests=50)
    assert many.requests[:5] == few.requests


def test_token_ids_are_ordinary_ids_within_the_vocabulary():
    ids = [i for r in workload(requests=200).requests for i in r.input_ids]
    assert min(ids) >= FIRST_ORDINARY_ID and max(ids) < VOCAB
    # Both ends are reachable: the range is [3, vocab), not something narrower.
    assert {FIRST_ORDINARY_ID, VOCAB - 1} <= set(ids)


def test_uniform_lengths_are_within_bounds_and_both_bounds_are_drawn():
    lengths = [len(r.input_ids) for r in workload(requests=400, prompt=Dist("uniform", (5, 9))).requests]
    assert set(lengths) == {5, 6, 7, 8, 9}


def test_fixed_length_is_exact():
    w = workload(prompt=Dist("fixed", (12,)), output=Dist("fixed", (3,)))
    assert {len(r.input_ids) for r in w.requests} == {12}
    assert {r.max_new_tokens for r in w.requests} == {3}


def test_choice_draws_only_from_its_values_and_uses_each():
    w = workload(requests=200, prompt=Dist("choice", (8, 64, 512)), output=Dist("choice", (1, 2)))
    assert {len(r.input_ids) for r in w.requests} == {8, 64, 512}
    assert {r.max_new_tokens for r in w.requests} == {1, 2}


def test_dist_minimum_is_the_shortest_possible_draw():
    assert Dist("fixed", (9,)).minimum == 9
    assert Dist("uniform", (4, 8)).minimum == 4
    assert Dist("choice", (64, 8)).minimum == 8


def test_unknown_distribution_kind_raises():
    with pytest.raises(ValueError, match="unknown distribution 'normal'"):
        Dist("normal", (1, 2)).draw(random.Random(0))


def test_closed_loop_requests_have_no_send_time():
    assert all(r.send_after_s is None for r in workload().requests)


@pytest.mark.parametrize("seed", [1, 7, 1234])
def test_rate_mode_sends_at_increasing_times_with_mean_gap_one_over_rate(seed: int):
    # Poisson arrivals: gaps are exponential with mean 1/rate and standard deviation 1/rate, so the
    # mean of n = 2000 gaps has standard deviation (1/rate)/sqrt(n) = 2.2% of 1/rate. Ten percent is
    # 4.5 standard deviations: a correct generator fails it with probability < 1e-5 per seed, while
    # an off-by-a-factor rate (1/rate vs rate, or gaps in ms) misses by far more.
    rate = 4.0
    w = workload(requests=2001, rate=rate, seed=seed, prompt=Dist("fixed", (4,)))
    times = [r.send_after_s for r in w.requests]
    assert times[0] == 0.0
    assert all(t is not None for t in times)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]  # type: ignore[operator]
    assert all(g > 0 for g in gaps)
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.10)


def test_rate_mode_and_request_contents_are_independent():
    # The arrival times come from their own generator: turning on a rate does not change the prompts.
    closed, open_ = workload(), workload(rate=2.0)
    assert [r.input_ids for r in closed.requests] == [r.input_ids for r in open_.requests]


def test_dataset_prompts_are_sent_in_order_and_cycled():
    data = [[5, 6, 7], [8, 9]]
    w = workload(requests=5, dataset=data)
    assert [r.input_ids for r in w.requests] == [data[0], data[1], data[0], data[1], data[0]]


def test_a_synthetic_prompt_is_its_slice_of_the_seeds_stream():
    # Regenerating one prompt jumps to its start; cutting the stream from its beginning gives the
    # same ids, whether the prompt starts on a whole 64-bit draw (even start) or halfway (odd).
    lengths = [5, 8, 1, 6, 3, 4]
    at = 0
    for n, whole in zip(lengths, synthetic_prompts(7, lengths, VOCAB), strict=True):
        assert synthetic_prompt(7, VOCAB, at, n) == whole
        at += n


def test_a_synthetic_workload_names_its_prompts_and_stores_no_ids():
    w = workload(requests=3, prompt=Dist("fixed", (5000,)))
    assert [r.prompt for r in w.requests] == [SyntheticPrompt(seed=7, vocab=VOCAB, at=k * 5000, tokens=5000)
                                              for k in range(3)]
    assert [r.prompt_len for r in w.requests] == [len(r.input_ids) for r in w.requests] == [5000] * 3
    assert len(w.model_dump_json()) < 1000  # 15,000 token ids would be 80 KB of base64
    again = WorkloadPlan.model_validate_json(w.model_dump_json())
    assert again == w and [r.input_ids for r in again.requests] == [r.input_ids for r in w.requests]


def test_a_dataset_workload_stores_its_prompts():
    w = workload(requests=2, dataset=[[5, 6, 7]])
    assert [r.prompt for r in w.requests] == [encode_ids([5, 6, 7])] * 2
    assert [r.prompt_len for r in w.requests] == [3, 3]


def test_prompt_sha256_is_of_the_compact_json_list():
    assert prompt_sha256([3, 4]) == prompt_sha256((3, 4))
    assert prompt_sha256([3, 4]) != prompt_sha256([4, 3])
    assert prompt_sha256([]) == "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945"


# ------------------------------------------------------------------------------ dataset files
def test_dataset_reads_objects_and_bare_lists_and_skips_blank_lines(tmp_path: Path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"input_ids": [3, 4, 5]}\n\n[6, 7]\n')
    assert load_dataset(f) == [[3, 4, 5], [6, 7]]


@pytest.mark.parametrize(
    ("content", "line", "phrase"),
    [
        ("[3, 4]\n{not json\n", 2, "not JSON"),
        ("[3]\n\n[]\n", 3, "expected a non-empty list of token ids"),
        ('{"input_ids": [3, -1]}\n', 1, "expected a non-empty list of token ids"),
        ('{"input_ids": [3, 1.5]}\n', 1, "expected a non-empty list of token ids"),
        ('{"ids": [3]}\n', 1, "expected a non-empty list of token ids"),
        ('"hello"\n', 1, "expected a non-empty list of token ids"),
    ],
    ids=["not_json", "empty_list_after_blank_line", "negative_id", "float_id", "wrong_key", "string"],
)
def test_dataset_errors_name_file_and_line(tmp_path: Path, content: str, line: int, phrase: str):
    f = tmp_path / "d.jsonl"
    f.write_text(content)
    with pytest.raises(PlanError) as err:
        load_dataset(f)
    (problem,) = err.value.problems
    assert problem.message.startswith(f"{f}:{line}: ") and phrase in problem.message


def test_empty_dataset_is_an_error_naming_the_file(tmp_path: Path):
    f = tmp_path / "d.jsonl"
    f.write_text("\n\n")
    with pytest.raises(PlanError, match="holds no prompts"):
        load_dataset(f)


def test_missing_dataset_is_an_error_naming_the_file(tmp_path: Path):
    with pytest.raises(PlanError) as err:
        load_dataset(tmp_path / "absent.jsonl")
    assert f"cannot read dataset {tmp_path / 'absent.jsonl'}" in err.value.problems[0].message
