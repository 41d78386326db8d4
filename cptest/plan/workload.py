"""Concrete workload requests from a seed: pure and deterministic.

The same (workload, vocab) gives the same token ids on every machine and Python >= 3.11: lengths
come from `random.Random` seeded with a string (CPython's documented reproducible path), token ids
from one stream of the seed (`cptest.plan.prompts`), which the plan names rather than stores.
Changing the request count does not change the requests that were already there.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cptest.errors import PlanError, Problem
from cptest.lang.tables import MAX_DATASET_BYTES, MAX_PLAN_TOKENS
from cptest.plan.model import SamplingParams, WorkloadPlan, encode_ids
from cptest.plan.prompts import FIRST_ORDINARY_ID

__all__ = ["FIRST_ORDINARY_ID", "Dist", "build_workload", "load_dataset", "prompt_sha256"]


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
            # random() * width is a documented, stable path (randint's bit-rejection is 5x slower).
            return lo + int(rng.random() * (hi - lo + 1))
        if self.kind == "choice":
            return self.values[rng.randrange(len(self.values))]
        raise ValueError(f"unknown distribution {self.kind!r}")

    @property
    def minimum(self) -> int:
        return self.values[0] if self.kind != "choice" else min(self.values)


def prompt_sha256(input_ids: Sequence[int]) -> str:
    """The hash the workload driver re-computes to prove it sent what the plan asked for."""
    return hashlib.sha256(json.dumps(list(input_ids), separators=(",", ":")).encode()).hexdigest()


def load_dataset(path: Path, *, max_bytes: int = MAX_DATASET_BYTES) -> list[list[int]]:
    """A dataset file: JSON lines, each `{"input_ids": [...]}` or a bare list of ids.

    Only a regular file of at most `max_bytes` is read (never `/dev/zero`, a FIFO or a huge file:
    the whole dataset goes into the plan), and at most `MAX_PLAN_TOKENS` token ids in all."""
    prompts: list[list[int]] = []
    try:
        with path.open("rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise PlanError(Problem(None, f"dataset {path} is not a regular file"))
            data = fh.read(max_bytes + 1)
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        why = getattr(e, "strerror", None) or e
        raise PlanError(Problem(None, f"cannot read dataset {path}: {why}")) from None
    if len(data) > max_bytes:
        raise PlanError(Problem(None, f"dataset {path} is larger than {max_bytes:,} bytes",
                                expected=f"a JSON-lines file of at most {max_bytes:,} bytes"))
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise PlanError(Problem(None, f"dataset {path} is not UTF-8 text")) from None
    total = 0
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, 4,300-digit ints, deep nesting
            why = e.msg if isinstance(e, json.JSONDecodeError) else type(e).__name__
            raise PlanError(Problem(None, f"{path}:{n}: not JSON ({why})")) from None
        ids = raw.get("input_ids") if isinstance(raw, dict) else raw
        if not (isinstance(ids, list) and ids
                and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 32 for i in ids)):
            raise PlanError(Problem(None, f"{path}:{n}: expected a non-empty list of token ids "
                                          "(0 <= id < 2**32)"))
        total += len(ids)
        if total > MAX_PLAN_TOKENS:
            raise PlanError(Problem(None, f"{path}:{n}: the dataset holds more than "
                                          f"{MAX_PLAN_TOKENS:,} token ids"))
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
    sampling: SamplingParams,
    vocab: int,
    concurrency: int | None,
    rate: float | None,
    timeout_s: float,
    logprobs: bool = True,
    dataset: list[list[int]] | None = None,
) -> WorkloadPlan:
    """The workload as the list of requests the driver will send, in order. A synthetic prompt is
    named by where it lies in the seed's stream (`SyntheticPrompt`), a dataset's is stored."""
    arrival = 0.0
    # One generator, drawn in request order: request i's lengths depend only on the draws before
    # it, so adding requests at the end never changes the earlier ones. A string seed is hashed
    # with SHA-512 by CPython (stable across platforms and versions).
    rng = random.Random(f"cptest-workload/{seed}")
    arrivals = random.Random(f"cptest-arrivals/{seed}")
    lengths, max_new = [], []
    for _ in range(requests):
        lengths.append(prompt_tokens.draw(rng) if dataset is None else 0)
        max_new.append(output_tokens.draw(rng))
    prompts: list[dict[str, int] | str] = []
    if dataset is not None:
        prompts = [encode_ids(dataset[i % len(dataset)]) for i in range(requests)]
    else:
        at = 0
        for n in lengths:
            prompts.append({"seed": seed, "vocab": vocab, "at": at, "tokens": n})  # a SyntheticPrompt
            at += n
    planned: list[dict[str, Any]] = []
    for i in range(requests):
        send_after = None
        if rate is not None:
            send_after = round(arrival, 6)
            arrival += arrivals.expovariate(rate)  # Poisson arrivals at the declared rate
        planned.append({"index": i, "prompt": prompts[i], "max_new_tokens": max_new[i], "sampling": sampling,
                        "return_logprob": logprobs, "send_after_s": send_after})
    # Validated once, as a whole, in pydantic's compiled core: a model built per request costs
    # several times as much, and a plan has hundreds of requests.
    return WorkloadPlan.model_validate({"seed": seed, "concurrency": concurrency, "rate_per_s": rate,
                                        "timeout_s": timeout_s, "requests": planned})
