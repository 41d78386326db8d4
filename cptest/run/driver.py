"""The workload driver: sends the plan's requests to SGLang's `/generate`, streaming, and records each.

Request shape (the pinned SGLang release, `srt/managers/io_struct.py` GenerateReqInput): `input_ids`,
`sampling_params` (the plan's sampling plus `max_new_tokens`), `return_logprob: true`,
`logprob_start_len: -1` ("-1 ... will only return logprobs for output tokens", io_struct.py:206-208),
`stream: true`.

Response shape (`srt/entrypoints/http_server.py:874-904`): server-sent events `data: <json>\\n\\n`,
ended by `data: [DONE]`; an error inside the stream is `data: {"error": {"message": ...}}`. Each
chunk has `output_ids` and `meta_info` (`id`, `finish_reason`, `prompt_tokens`, `completion_tokens`,
`output_token_logprobs` as `[logprob, token_id, text|null]` triples). By default chunks are
*cumulative* (`tokenizer_manager.py:2365-2395`: the whole `state.output_ids` each time); with
`--incremental-streaming-output` they are deltas (`incremental=True` here). A `finish_reason` of type
`abort` is an error.

Outcomes: `ok`; `error` (connection refused/reset, HTTP status, error chunk, abort, stream ended
without a finish); `timeout` (no finish within the workload's `timeout_s`: indeterminate, not failed);
`not_sent` (the workload was stopped before its turn). Before sending, every payload is checked
against its planned request (`conformance`); a mismatch is a cptest bug and raises RunError.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from cptest.errors import RunError
from cptest.evidence import RequestResult, RunRole
from cptest.outline import Progress
from cptest.plan.model import PlannedRequest, WorkloadPlan
from cptest.plan.workload import prompt_sha256
from cptest.request_ids import workload_rid
from cptest.run.evidence_writer import RecordWriter

DONE = object()
"""`parse_sse_line` result for `data: [DONE]`."""

OnDone = Callable[[RequestResult, int], None]
"""Called after each request ends with the result and the number of `ok` requests so far."""


def build_payload(req: PlannedRequest, top_logprobs: int = 0) -> dict[str, Any]:
    """The /generate body for a planned request (`top_logprobs`: the workload's top-k per output)."""
    payload = {
        "rid": workload_rid(req.index),
        "input_ids": list(req.input_ids),
        "sampling_params": {**req.sampling.model_dump(), "max_new_tokens": req.max_new_tokens},
        "return_logprob": req.return_logprob,
        "logprob_start_len": -1,
        "stream": True,
    }
    if top_logprobs and req.return_logprob:
        payload["top_logprobs_num"] = top_logprobs
    return payload


def top_pairs(position: Any) -> list[tuple[int, float]]:
    """SGLang's top list at one position (`[[logprob, token_id, text], ...]` or null) -> (id, logprob)
    pairs sorted by logprob, most likely first."""
    if not position:
        return []
    pairs = [(int(t[1]), float(t[0])) for t in position if t and t[0] is not None]
    return sorted(pairs, key=lambda p: -p[1])


def conformance(req: PlannedRequest, payload: dict[str, Any]) -> list[str]:
    """Differences between what the plan asked for and `payload` (empty when they agree)."""
    diffs = []
    ids = payload.get("input_ids")
    if not isinstance(ids, list) or prompt_sha256(ids) != prompt_sha256(req.input_ids):
        n = len(ids) if isinstance(ids, list) else None
        diffs.append(f"prompt differs (planned {len(req.input_ids)} tokens, payload {n})")
    sp = dict(payload.get("sampling_params") or {})
    if sp.pop("max_new_tokens", None) != req.max_new_tokens:
        diffs.append(f"max_new_tokens differs (planned {req.max_new_tokens})")
    planned = req.sampling.model_dump()
    if sp != planned:
        diffs.append(f"sampling differs (planned {planned}, payload {sp})")
    if payload.get("return_logprob") != req.return_logprob:
        diffs.append("return_logprob differs")
    return diffs


def parse_sse_line(line: bytes | str) -> dict[str, Any] | object | None:
    """One line of the event stream -> a chunk dict, `DONE`, or None (blank, comment, non-data)."""
    if isinstance(line, str):
        line = line.encode()
    line = line.strip()
    if not line.startswith(b"data:"):
        return None
    body = line[5:].strip()
    if body == b"[DONE]":
        return DONE
    obj = orjson.loads(body)  # 2-3x json's speed; chunks are parsed on the event loop
    if not isinstance(obj, dict):
        raise ValueError(f"stream chunk is not an object: {body[:80].decode(errors='replace')}")
    return obj


def _json_text(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def _logprob(triple: Any) -> float:
    """`[logprob, token_id, text]` -> the logprob (NaN when SGLang sent none)."""
    return float(triple[0]) if triple and triple[0] is not None else float("nan")


@dataclass
class StreamState:
    """What the stream said so far about one request."""

    incremental: bool = False
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    error: str | None = None
    first_token_at: float | None = None
    first_text_at: float | None = None
    done: bool = False
    top: list[list[tuple[int, float]]] | None = None
    """Top-k per output position, when the request asked for them."""

    def feed(self, chunk: dict[str, Any] | object, now: float) -> None:
        if chunk is DONE:
            self.done = True
            return
        assert isinstance(chunk, dict)
        if "error" in chunk:
            err = chunk["error"]
            self.error = str(err.get("message", err) if isinstance(err, dict) else err)
            return
        raw_ids = chunk.get("output_ids") or []
        meta = chunk.get("meta_info") or {}
        raw_lps = meta.get("output_token_logprobs") or []
        if self.incremental:
            self.output_ids.extend(map(int, raw_ids))
            self.logprobs.extend(map(_logprob, raw_lps))
        else:
            # Cumulative chunks repeat everything so far: convert only what is new, once the part
            # already held is checked to be unchanged (a list comparison, C speed). Converting the
            # whole list on every chunk was quadratic: at 32 streams of 256 tokens it held the event
            # loop long enough to cost 6-12 % of the measured throughput against bench_serving.
            n = len(self.output_ids)
            if len(raw_ids) >= n and raw_ids[:n] == self.output_ids:
                self.output_ids.extend(map(int, raw_ids[n:]))
            else:
                self.output_ids = list(map(int, raw_ids))
            k = len(self.logprobs)
            if raw_lps and len(raw_lps) >= k:
                self.logprobs.extend(map(_logprob, raw_lps[k:]))
            elif raw_lps or not self.logprobs:
                self.logprobs = list(map(_logprob, raw_lps))
        raw_top = meta.get("output_top_logprobs")
        if raw_top is not None:
            if self.top is None:
                self.top = []
            if self.incremental:
                self.top.extend(map(top_pairs, raw_top))
            elif len(raw_top) > len(self.top):
                self.top.extend(map(top_pairs, raw_top[len(self.top):]))
        if self.first_token_at is None and self.output_ids:
            self.first_token_at = now
        if self.first_text_at is None and chunk.get("text"):
            self.first_text_at = now
        if meta.get("finish_reason") is not None:
            fr = meta["finish_reason"]
            self.finish_reason = fr if isinstance(fr, dict) else {"type": str(fr)}


@dataclass(frozen=True)
class _Prepared:
    """A planned request with the body it sends (checked against the plan) and that body's prompt
    hash, both made before the timed span."""

    req: PlannedRequest
    payload: dict[str, Any]
    prompt_sha256: str


@dataclass
class WorkloadSummary:
    completed: int = 0
    failed: int = 0
    timeout: int = 0
    not_sent: int = 0
    results: list[RequestResult] = field(default_factory=list)

    def as_detail(self) -> dict[str, int]:
        return {"completed": self.completed, "failed": self.failed, "timeout": self.timeout,
                "not_sent": self.not_sent}


class WorkloadDriver:
    """Drives one workload against one server. Closed loop (`concurrency`) or open loop (each
    request sent at `send_after_s` from the start). Writes a RequestResult per request as it ends."""

    def __init__(self, base_url: str, workload: WorkloadPlan, *, role: RunRole,
                 writer: RecordWriter, on_done: list[OnDone] | None = None, incremental_stream: bool = False,
                 progress: Progress | None = None,
                 connect_timeout_s: float = 10.0, connection_per_request: bool = True) -> None:
        self.base_url = base_url.rstrip("/")
        self.workload = workload
        self.role = role
        self.writer = writer
        self.on_done = list(on_done or [])
        self.incremental = incremental_stream
        self.progress = progress
        self.connect_timeout_s = connect_timeout_s
        self.connection_per_request = connection_per_request
        self.summary = WorkloadSummary()
        self.started_at: float | None = None
        """time.monotonic() when the first request could be sent (faults count time from here)."""
        self._stop = asyncio.Event()
        self._abort: BaseException | None = None

    def run(self) -> WorkloadSummary:
        """Run to the end (blocking). Re-raises an exception raised by an `on_done` callback after
        the remaining requests were recorded as `not_sent`."""
        return asyncio.run(self.arun())

    async def arun(self) -> WorkloadSummary:
        # Python's cyclic collector is off while the workload runs (one full collection first, and
        # back as it was after): its pauses land on the event loop while requests connect, and with
        # it on cptest's median TTFT reads about 1.2x sglang.bench_serving's on one server and
        # request set, with it off about 1.0x (docs/measurements.md, "The probe's share and the
        # client's fidelity, on one server"). The workload is bounded, so the cyclic garbage it leaves
        # is too; reference counting frees the rest as it goes.
        was_enabled = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            return await self._arun()
        finally:
            if was_enabled:
                gc.enable()

    async def _arun(self) -> WorkloadSummary:
        # Every body is built, checked against the plan and hashed before the first request: the
        # request sends exactly the body checked, and its result carries that body's prompt hash.
        # Hashing as each request ends costs ~50 us of the event loop per request, in the very
        # iterations where the next requests connect.
        prepared: list[_Prepared] = []
        for req in self.workload.requests:
            payload = build_payload(req, self.workload.top_logprobs)
            diffs = conformance(req, payload)
            if diffs:
                raise RunError(f"request {req.index}: the driver would send something else than planned: "
                               + "; ".join(diffs))
            prepared.append(_Prepared(req, payload, prompt_sha256(payload["input_ids"])))
        self._stop = asyncio.Event()
        limit = self.workload.concurrency or (None if self.workload.rate_per_s else 1)
        sem = asyncio.Semaphore(limit) if limit else None
        # force_close: one connection per request, opened inside the timed span, as bench_serving
        # does (a session per request): keep-alive makes cptest's median TTFT about 13 % lower than
        # bench_serving's on the same server, a difference of clients, not of servers.
        connector = aiohttp.TCPConnector(limit=max(limit or len(self.workload.requests), 1) + 4,
                                         force_close=self.connection_per_request)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s)
        # read_bufsize: a cumulative chunk of a long answer with logprobs is one line of hundreds of
        # KB; aiohttp's line reader refuses lines over twice this buffer.
        async with aiohttp.ClientSession(self.base_url, connector=connector, timeout=timeout,
                                         json_serialize=_json_text, read_bufsize=1 << 22) as client:
            self.started_at = time.monotonic()
            await asyncio.gather(*(self._one(client, p, sem) for p in prepared))
        if self.progress is not None:
            s = self.summary
            self.progress.update(len(s.results), force=True, ok=s.completed, error=s.failed,
                                 timeout=s.timeout)
        if self._abort is not None:
            raise self._abort
        return self.summary

    def stop(self) -> None:
        """Send no further request; those not yet sent are recorded as `not_sent`."""
        self._stop.set()

    async def _one(self, client: aiohttp.ClientSession, p: _Prepared,
                   sem: asyncio.Semaphore | None) -> None:
        assert self.started_at is not None
        req = p.req
        if req.send_after_s is not None and not self.workload.concurrency:
            delay = self.started_at + req.send_after_s - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
        if sem is not None:
            await sem.acquire()
        try:
            if self._stop.is_set():
                result = self._result(p, "not_sent", error="workload stopped before this request")
            else:
                result = await self._send(client, p)
        finally:
            if sem is not None:
                sem.release()
        self._finish(result)

    def _result(self, p: _Prepared, status: str, **kw: Any) -> RequestResult:
        req = p.req
        # stamped here rather than by the writer's copy of the record (a copy of 256 outputs, on the loop)
        return RequestResult(run=self.role, index=req.index, prompt_len=len(p.payload["input_ids"]),
                             max_new_tokens=req.max_new_tokens, prompt_sha256=p.prompt_sha256,
                             status=status, t=round(self.writer.now(), 6), **kw)  # type: ignore[arg-type]

    async def _send(self, client: aiohttp.ClientSession, p: _Prepared) -> RequestResult:
        payload = p.payload
        state = StreamState(incremental=self.incremental)
        sent_at = self.writer.now()
        t0 = time.monotonic()
        status, error = "ok", ""
        try:
            async with asyncio.timeout(self.workload.timeout_s):
                async with client.post("/generate", json=payload) as resp:
                    if resp.status != 200:
                        body = (await resp.read()).decode(errors="replace")[:500]
                        status, error = "error", f"HTTP {resp.status}: {body}"
                    else:
                        async for line in resp.content:  # one event line at a time, as bytes
                            chunk = parse_sse_line(line)
                            if chunk is not None:
                                state.feed(chunk, time.monotonic())
                            if state.done or state.error:
                                break
        except TimeoutError:
            status, error = "timeout", f"no finish within {self.workload.timeout_s} s"
        except (aiohttp.ClientError, ValueError, OSError) as e:
            status, error = "error", f"{type(e).__name__}: {e}"
        end = time.monotonic()
        if status == "ok":
            fr = state.finish_reason or {}
            if state.error:
                status, error = "error", state.error
            elif state.finish_reason is None:
                status, error = "error", "stream ended without a finish_reason"
            elif fr.get("type") == "abort":
                status, error = "error", f"aborted: {fr.get('message', '')}"
        # The first answer: sglang.bench_serving stamps its TTFT at the first chunk whose `text` is
        # non-empty (benchmark/serving.py, async_request_sglang_generate); where the server sends
        # text, so does cptest (the same event), else at the first chunk with an output token
        # (a `--skip-tokenizer-init` server sends none).
        first = state.first_text_at if state.first_text_at is not None else state.first_token_at
        ttft = first - t0 if first is not None else None
        by_token = None
        if state.first_text_at is not None and state.first_token_at is not None:
            by_token = state.first_token_at - t0
        n = len(state.output_ids)
        tpot = (end - first) / (n - 1) if first is not None and n > 1 else None
        return self._result(p, status, error=error, output_ids=state.output_ids,
                            output_logprobs=state.logprobs, sent_at=sent_at, ttft_s=ttft, tpot_s=tpot,
                            e2e_s=end - t0, output_top=state.top, ttft_token_s=by_token)

    def _finish(self, result: RequestResult) -> None:
        s = self.summary
        s.results.append(result)
        if result.status == "ok":
            s.completed += 1
        elif result.status == "timeout":
            s.timeout += 1
        elif result.status == "not_sent":
            s.not_sent += 1
        else:
            s.failed += 1
        self.writer.write(result)
        if self.progress is not None:
            self.progress.update(len(s.results), ok=s.completed, error=s.failed, timeout=s.timeout)
        for cb in self.on_done:
            try:
                cb(result, s.completed)
            except Exception as e:  # stop sending; surface the error when the workload ends
                if self._abort is None:
                    self._abort = e
                self.stop()
