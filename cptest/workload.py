"""Concrete workload requests from a seed: pure and deterministic.

The same (workload, vocab) gives the same token ids on every machine and Python >= 3.11:
`random.Random(seed)` is a Mersenne Twister whose `randrange`/`random` outputs are part of
CPython's documented reproducibility guarantee for a given seed. Each request draws from its own
generator (seeded with `seed` and its index), so changing the request count does not change
the requests that were already there.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cptest.errors import PlanError, Problem
from cptest.plan_model import PlannedRequest, WorkloadPlan

FIRST_ORDINARY_ID = 3
"""Token ids below this are kept out of synthetic prompts: 0/1/2 are BOS/EOS/PAD in the tiny
models (make-tiny-models) and in most Llama-style vocabularies' first slots."""


@dataclass(frozen=True)
class Dist:
    """A length distribution: fixed n, uniform over [lo, hi] inclusive, or a choice of values."""

    kind: str
    values: tuple[int, ...]

    def draw(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.values[0]
        if self.kind == "uniform":
            lo, hi = self.values
            return rng.randint(lo, hi)
        if self.kind == "choice":
            return self.values[rng.randrange(len(self.values))]
        raise ValueError(f"unknown distribution {self.kind!r}")

    @property
    def minimum(self) -> int:
        return self.values[0] if self.kind != "choice" else min(self.values)


def request_rng(seed: int, index: int) -> random.Random:
    # A string seed is hashed with SHA-512 by CPython: stable, and independent per request.
    return random.Random(f"cptest-workload/{seed}/{index}")


def synthetic_prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    hi = max(vocab - 1, FIRST_ORDINARY_ID)
    return [rng.randint(FIRST_ORDINARY_ID, hi) for _ in range(length)]


def prompt_sha256(input_ids: Sequence[int]) -> str:
    """The hash the workload driver re-computes to prove it sent what the plan asked for."""
    return hashlib.sha256(json.dumps(list(input_ids), separators=(",", ":")).encode()).hexdigest()


def load_dataset(path: Path) -> list[list[int]]:
    """A dataset file: JSON lines, each `{"input_ids": [...]}` or a bare list of ids."""
    prompts: list[list[int]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise PlanError(Problem(None, f"cannot read dataset {path}: {e.strerror}")) from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as e:
            raise PlanError(Problem(None, f"{path}:{n}: not JSON ({e.msg})")) from None
        ids = raw.get("input_ids") if isinstance(raw, dict) else raw
        if not (isinstance(ids, list) and ids and all(isinstance(i, int) and i >= 0 for i in ids)):
            raise PlanError(Problem(None, f"{path}:{n}: expected a non-empty list of token ids"))
        prompts.append(ids)
    if not prompts:
        raise PlanError(Problem(None, f"dataset {path} holds no prompts"))
    return prompts


def build_workload(
    *,
    requests: int,
    seed: int,
    prompt_tokens: Dist,
    output_tokens: Dist,
    sampling: dict,
    vocab: int,
    concurrency: int | None,
    rate: float | None,
    timeout_s: float,
    logprobs: bool = True,
    dataset: list[list[int]] | None = None,
) -> WorkloadPlan:
    """The workload as the list of requests the driver will send, in order."""
    planned: list[PlannedRequest] = []
    arrival = 0.0
    arrivals = random.Random(f"cptest-arrivals/{seed}")
    for i in range(requests):
        rng = request_rng(seed, i)
        if dataset is not None:
            ids = list(dataset[i % len(dataset)])
        else:
            ids = synthetic_prompt(rng, prompt_tokens.draw(rng), vocab)
        max_new = output_tokens.draw(rng)
        params = dict(sampling, max_new_tokens=max_new)
        send_after = None
        if rate is not None:
            send_after = round(arrival, 6)
            arrival += arrivals.expovariate(rate)  # Poisson arrivals at the declared rate
        planned.append(
            PlannedRequest(
                index=i, input_ids=ids, max_new_tokens=max_new, sampling=params,
                return_logprob=logprobs, send_after_s=send_after,
            )
        )
    return WorkloadPlan(
        seed=seed, concurrency=concurrency, rate_per_s=rate, timeout_s=timeout_s, requests=planned
    )
