"""Teacher-forced scoring: every server scores the same token sequences with prompt logprobs.

The sequences are the baseline's: each workload prompt followed by the baseline's output for it
(`sequences_from`). A server scores them after its own workload, one `/generate` each:

    {"input_ids": prompt + output, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
     "return_logprob": true, "logprob_start_len": len(prompt) - 1, "top_logprobs_num": K,
     "stream": false}

The pinned SGLang release answers with `meta_info.input_token_logprobs` (`[logprob, token_id, text]` for each
input position from `logprob_start_len` on: the log-probability of that position's token given
everything before it, null for the first one) and `meta_info.input_top_logprobs` (the top K at
each of those positions).
So position j of the answer scores output token j of the baseline under the same history on every
server: the numerics of the forward pass compared directly, without one early greedy flip turning
the rest of the sequence into a different text (docs/language.md, "Generation parity"). The token
ids of the answer are checked against the sequence sent; a mismatch is an `error` record, never a
figure.

Each answer is one `Score` record in the server's runner file.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from cptest.evidence import RequestResult, Score
from cptest.outline import Progress
from cptest.plan.model import WorkloadPlan
from cptest.plan.workload import prompt_sha256
from cptest.request_ids import scoring_rid
from cptest.run.driver import top_pairs
from cptest.run.evidence_writer import RecordWriter


@dataclass(frozen=True)
class Sequence:
    index: int
    input_ids: list[int]
    start: int
    """Length of the prompt: the first scored position."""

    @property
    def sha256(self) -> str:
        return prompt_sha256(self.input_ids)


def sequences_from(baseline: Iterable[RequestResult], workload: WorkloadPlan) -> list[Sequence]:
    """Prompt + output of every request the baseline answered `ok` with at least one token."""
    prompts = {r.index: r.input_ids for r in workload.requests}
    out = []
    for r in sorted(baseline, key=lambda r: r.index):
        if r.status != "ok" or not r.output_ids or r.index not in prompts:
            continue
        prompt = list(prompts[r.index])
        out.append(Sequence(r.index, prompt + list(r.output_ids), len(prompt)))
    return out


def payload(seq: Sequence, top_k: int) -> dict[str, Any]:
    # One position before the first scored one: SGLang's first input entry is always null (row j of
    # the logits scores token j + 1, so the token at logprob_start_len itself gets no logprob;
    # the pinned release's managers/scheduler_components/logprob_result_processor.py:36-38).
    return {
        "rid": scoring_rid(seq.index),
        "input_ids": seq.input_ids,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": seq.start - 1,
        "top_logprobs_num": top_k,
        "stream": False,
    }


def parse_answer(seq: Sequence, body: Any) -> tuple[list[float], list[list[tuple[int, float]]]] | str:
    """(token logprobs, top lists) for the scored positions, or why the answer cannot be used."""
    if not isinstance(body, dict):
        return "the answer is not a JSON object"
    if "error" in body:
        err = body["error"]
        return str(err.get("message", err) if isinstance(err, dict) else err)
    meta = body.get("meta_info") or {}
    toks = meta.get("input_token_logprobs")
    tops = meta.get("input_top_logprobs")
    want = seq.input_ids[seq.start :]
    if not isinstance(toks, list) or len(toks) != len(want) + 1:
        n = len(toks) if isinstance(toks, list) else None
        return f"input_token_logprobs has {n} positions, {len(want) + 1} were asked for"
    toks = toks[1:]  # the position before the first scored one (null by SGLang's rule)
    tops = tops[1:] if isinstance(tops, list) else tops
    ids = [int(t[1]) for t in toks]
    if ids != want:
        j = next(i for i, (a, b) in enumerate(zip(ids, want, strict=True)) if a != b)
        return f"the engine scored token {ids[j]} at position {seq.start + j}, the sequence has {want[j]}"
    lps = [float(t[0]) if t[0] is not None else math.nan for t in toks]
    top = [top_pairs(p) for p in tops] if isinstance(tops, list) else []
    return lps, top


async def _score_one(
    client: aiohttp.ClientSession, seq: Sequence, top_k: int, role: str, timeout_s: float
) -> Score:
    base = {"run": role, "index": seq.index, "sequence_sha256": seq.sha256, "start": seq.start}
    try:
        async with asyncio.timeout(timeout_s):
            async with client.post("/generate", json=payload(seq, top_k)) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    return Score(
                        **base,
                        status="error",
                        error=f"HTTP {resp.status}: {raw.decode(errors='replace')[:300]}",
                    )
                parsed = parse_answer(seq, orjson.loads(raw))
    except TimeoutError:
        return Score(**base, status="timeout", error=f"no answer within {timeout_s} s")
    except (aiohttp.ClientError, ValueError, OSError) as e:
        return Score(**base, status="error", error=f"{type(e).__name__}: {e}")
    if isinstance(parsed, str):
        return Score(**base, status="error", error=parsed)
    lps, top = parsed
    return Score(**base, status="ok", token_logprobs=lps, top=top)


async def _score_all(
    base_url: str,
    seqs: list[Sequence],
    top_k: int,
    role: str,
    writer: RecordWriter,
    concurrency: int,
    timeout_s: float,
    progress: Progress | None,
) -> list[Score]:
    sem = asyncio.Semaphore(max(concurrency, 1))
    done: list[Score] = []
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)

    async def one(client: aiohttp.ClientSession, seq: Sequence) -> None:
        async with sem:
            s = await _score_one(client, seq, top_k, role, timeout_s)
        done.append(s)
        writer.write(s)
        if progress is not None:
            progress.update(len(done), ok=sum(x.status == "ok" for x in done))

    async with aiohttp.ClientSession(
        base_url.rstrip("/"),
        timeout=timeout,
        json_serialize=lambda o: orjson.dumps(o).decode(),
        read_bufsize=1 << 22,
    ) as client:
        await asyncio.gather(*(one(client, s) for s in seqs))
    return done


def score(
    base_url: str,
    seqs: list[Sequence],
    *,
    top_k: int,
    role: str,
    writer: RecordWriter,
    concurrency: int,
    timeout_s: float,
    progress: Progress | None = None,
) -> list[Score]:
    """Score `seqs` on the server at `base_url`; each answer is written as it comes."""
    return asyncio.run(_score_all(base_url, seqs, top_k, role, writer, concurrency, timeout_s, progress))
