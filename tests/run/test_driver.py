"""Specification of cptest/run/workload.py: the streaming /generate driver."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from cptest.errors import RunError
from cptest.evidence import RequestResult, read_records
from cptest.plan.model import PlannedRequest, WorkloadPlan
from cptest.run.driver import (
    DONE,
    StreamState,
    WorkloadDriver,
    WorkloadSummary,
    build_payload,
    conformance,
    parse_sse_line,
    prompt_sha256,
)
from cptest.run.evidence_writer import RecordWriter
from cptest.run.process import ProcessLauncher

from conftest import fake_node, free_port, requests, wait_until  # isort: skip
from fake_engine import FAIL, SLOW  # isort: skip


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    launcher = ProcessLauncher()
    handle = launcher.start(
        fake_node(port, "--token-delay", "0.005"), tmp_path_factory.mktemp("engine") / "engine.log", {}
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/health_generate").status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 20, "the fake engine")
    yield url
    assert launcher.teardown(handle, grace_s=5).leftover_pids == []


def workload(
    reqs: list[PlannedRequest],
    concurrency: int | None = 2,
    timeout_s: float = 10.0,
    rate: float | None = None,
) -> WorkloadPlan:
    return WorkloadPlan(seed=0, concurrency=concurrency, rate_per_s=rate, timeout_s=timeout_s, requests=reqs)


def expected_ids(req: PlannedRequest) -> list[int]:
    return [(sum(req.input_ids) + 7 * i) % 1000 for i in range(req.max_new_tokens)]


def test_sse_lines_parse_to_chunks_done_or_nothing() -> None:
    assert parse_sse_line('data: {"output_ids": [1]}') == {"output_ids": [1]}
    assert parse_sse_line("data: [DONE]") is DONE
    assert parse_sse_line("") is None
    assert parse_sse_line(": keep-alive") is None
    with pytest.raises(ValueError):
        parse_sse_line("data: {not json")


def test_cumulative_chunks_replace_and_incremental_chunks_extend() -> None:
    def chunk(ids: list[int], fin: dict | None = None) -> dict:
        return {
            "output_ids": ids,
            "meta_info": {"finish_reason": fin, "output_token_logprobs": [[-0.5, i, None] for i in ids]},
        }

    cum = StreamState()
    cum.feed(chunk([5]), 1.0)
    cum.feed(chunk([5, 6], {"type": "length"}), 2.0)
    assert (cum.output_ids, cum.logprobs, cum.first_token_at) == ([5, 6], [-0.5, -0.5], 1.0)
    # A cumulative chunk whose earlier part differs from what was held replaces it whole.
    changed = StreamState()
    changed.feed(chunk([5, 6]), 1.0)
    changed.feed(chunk([7, 6, 8]), 2.0)
    assert changed.output_ids == [7, 6, 8] and len(changed.logprobs) == 3
    inc = StreamState(incremental=True)
    inc.feed(chunk([5]), 1.0)
    inc.feed(chunk([6], {"type": "length"}), 2.0)
    assert inc.output_ids == [5, 6] and inc.finish_reason == {"type": "length"}


def test_payload_asks_for_output_logprobs_only_and_streams() -> None:
    req = PlannedRequest(index=0, input_ids=[1, 2], max_new_tokens=3, sampling={"temperature": 0.0})
    assert build_payload(req) == {
        "rid": "cptest-0",
        "input_ids": [1, 2],
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 3},
        "return_logprob": True,
        "logprob_start_len": -1,
        "stream": True,
    }
    assert conformance(req, build_payload(req)) == []


def test_conformance_names_every_difference() -> None:
    req = PlannedRequest(index=0, input_ids=[1, 2], max_new_tokens=3, sampling={"temperature": 0.0})
    bad = {
        "input_ids": [1],
        "sampling_params": {"temperature": 1.0, "max_new_tokens": 4},
        "return_logprob": False,
    }
    diffs = conformance(req, bad)
    assert len(diffs) == 4
    assert any("prompt differs" in d for d in diffs)


def test_a_plan_cannot_carry_a_second_max_new_tokens_in_its_sampling() -> None:
    # The sampling parameters are typed: the output length has one place, max_new_tokens.
    with pytest.raises(ValidationError, match="max_new_tokens"):
        PlannedRequest(index=3, input_ids=[1], max_new_tokens=3, sampling={"max_new_tokens": 9})


def test_requests_are_recorded_with_outputs_logprobs_and_timings(engine: str, tmp_path: Path) -> None:
    reqs = requests(5, max_new=4)
    seen: list[int] = []
    driver = WorkloadDriver(
        engine,
        workload(reqs),
        role="baseline",
        writer=RecordWriter(tmp_path / "r.jsonl"),
        on_done=[lambda r, completed: seen.append(completed)],
    )
    summary = driver.run()
    assert summary.as_detail() == {"completed": 5, "failed": 0, "timeout": 0, "not_sent": 0}
    assert seen == [1, 2, 3, 4, 5]
    records, dropped = read_records(tmp_path / "r.jsonl")
    assert dropped == 0 and len(records) == 5
    for rec in records:
        assert isinstance(rec, RequestResult) and rec.run == "baseline" and rec.status == "ok"
        req = reqs[rec.index]
        assert rec.output_ids == expected_ids(req)
        assert rec.output_logprobs == pytest.approx([-0.01, -0.02, -0.03, -0.04])
        assert rec.prompt_sha256 == prompt_sha256(req.input_ids) and rec.prompt_len == 4
        assert rec.ttft_s is not None and rec.tpot_s is not None and rec.e2e_s >= rec.ttft_s


def test_a_request_past_its_timeout_is_indeterminate_not_failed(engine: str, tmp_path: Path) -> None:
    reqs = requests(1, max_new=50, prompt=[SLOW, 200])
    summary = WorkloadDriver(
        engine, workload(reqs, timeout_s=0.5), role="main", writer=RecordWriter(tmp_path / "r.jsonl")
    ).run()
    assert summary.timeout == 1 and summary.failed == 0
    assert summary.results[0].status == "timeout"


def test_an_error_chunk_is_an_error(engine: str, tmp_path: Path) -> None:
    reqs = requests(1, prompt=[FAIL, 7])
    summary = WorkloadDriver(
        engine, workload(reqs), role="main", writer=RecordWriter(tmp_path / "r.jsonl")
    ).run()
    assert summary.results[0].status == "error" and "bad input 7" in summary.results[0].error


def two_requests(url: str, tmp_path: Path) -> WorkloadSummary:
    writer = RecordWriter(tmp_path / "r.jsonl")
    return WorkloadDriver(url, workload(requests(2)), role="main", writer=writer).run()


def test_connection_refused_is_an_error(tmp_path: Path) -> None:
    summary = two_requests(f"http://127.0.0.1:{free_port()}", tmp_path)
    assert [r.status for r in summary.results] == ["error", "error"]
    assert "ClientConnectorError" in summary.results[0].error


class CannedStreams(http.server.BaseHTTPRequestHandler):
    """A real HTTP server whose answer to /generate depends on the request's first input id."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["input_ids"][0] == 1:
            text = 'data: {"output_ids": [1], "meta_info": {"finish_reason": null}}\n\n'
        else:
            text = ('data: {"output_ids": [], "meta_info": {"finish_reason": {"type": "abort", '
                    '"message": "server shutting down"}}}\n\ndata: [DONE]\n\n')
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text.encode())

    def log_message(self, *_a: object) -> None:
        pass


def test_a_stream_without_finish_or_with_abort_is_an_error(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CannedStreams)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        summary = two_requests(f"http://127.0.0.1:{server.server_address[1]}", tmp_path)
    finally:
        server.shutdown()
    by_index = {r.index: r for r in summary.results}
    assert by_index[0].status == "error" and "without a finish_reason" in by_index[0].error
    assert by_index[1].status == "error" and "server shutting down" in by_index[1].error


def test_a_failing_callback_stops_sending_and_is_reraised(engine: str, tmp_path: Path) -> None:
    def boom(result: RequestResult, completed: int) -> None:
        if completed == 2:
            raise RunError("sampler crashed")

    driver = WorkloadDriver(
        engine,
        workload(requests(6), concurrency=1),
        role="main",
        writer=RecordWriter(tmp_path / "r.jsonl"),
        on_done=[boom],
    )
    with pytest.raises(RunError, match="sampler crashed"):
        driver.run()
    assert [r.status for r in driver.summary.results] == ["ok", "ok"] + ["not_sent"] * 4


def test_the_collector_is_off_while_requests_run_and_as_it_was_after(engine: str, tmp_path: Path) -> None:
    """Its pauses made cptest's TTFT read 1.21x bench_serving's on one server (results/_measure
    run14); the driver turns it off for the workload only, also when the workload raises."""
    import gc

    states: list[bool] = []

    def note(result: RequestResult, completed: int) -> None:
        states.append(gc.isenabled())
        if completed == 3:
            raise RunError("stop here")

    assert gc.isenabled()
    driver = WorkloadDriver(engine, workload(requests(4), concurrency=1), role="main",
                            writer=RecordWriter(tmp_path / "r.jsonl"), on_done=[note])
    with pytest.raises(RunError, match="stop here"):
        driver.run()
    assert states == [False] * 4 and gc.isenabled()  # the fourth: recorded not_sent
    gc.disable()
    try:  # a caller that runs with the collector off keeps it off
        WorkloadDriver(engine, workload(requests(1)), role="main",
                       writer=RecordWriter(tmp_path / "s.jsonl")).run()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_open_loop_sends_each_request_at_its_planned_time(engine: str, tmp_path: Path) -> None:
    reqs = [
        PlannedRequest(index=i, input_ids=[1, 2], max_new_tokens=1, sampling={}, send_after_s=0.3 * i)
        for i in range(3)
    ]
    writer = RecordWriter(tmp_path / "r.jsonl")
    driver = WorkloadDriver(engine, workload(reqs, concurrency=None, rate=3.0), role="main", writer=writer)
    summary = driver.run()
    assert summary.completed == 3
    start = driver.started_at - writer.t0
    sent = sorted(r.sent_at - start for r in summary.results)
    assert sent == pytest.approx([0.0, 0.3, 0.6], abs=0.08)


def test_the_first_answer_is_stamped_at_the_first_text_where_the_server_sends_text() -> None:
    # bench_serving's TTFT event: the first chunk with non-empty text, which incremental detokenization
    # may hold back a chunk after the first token id.
    from cptest.run.driver import StreamState

    s = StreamState()
    s.feed({"text": "", "output_ids": [5], "meta_info": {}}, 1.0)
    s.feed({"text": "hi", "output_ids": [5, 6], "meta_info": {}}, 2.0)
    assert (s.first_token_at, s.first_text_at) == (1.0, 2.0)
    quiet = StreamState()
    quiet.feed({"output_ids": [5], "meta_info": {}}, 1.0)
    assert (quiet.first_token_at, quiet.first_text_at) == (1.0, None)


def test_bodies_are_built_checked_and_hashed_before_the_first_request(
        engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # D70: hashing a prompt as its request ended cost the event loop ~50 us per request, in the
    # iterations where the next requests connect. Every body is made and hashed before the timed
    # span; each result carries the hash of the body that was sent.
    import cptest.run.driver as driver_module
    calls: list[bool] = []  # per call: was the timed span already running?
    holder: list[WorkloadDriver] = []
    for name in ("prompt_sha256", "build_payload"):
        real = getattr(driver_module, name)

        def spy(*a: object, _real: object = real, **k: object) -> object:
            calls.append(holder[0].started_at is not None)
            return _real(*a, **k)  # type: ignore[operator]

        monkeypatch.setattr(driver_module, name, spy)
    reqs = requests(6, max_new=3)
    writer = RecordWriter(tmp_path / "r.jsonl", background=True)
    holder.append(WorkloadDriver(engine, workload(reqs), role="main", writer=writer))
    summary = holder[0].run()
    writer.close()
    assert summary.completed == 6
    assert calls and not any(calls), "a body was built or hashed inside the timed span"
    records, _ = read_records(tmp_path / "r.jsonl")
    assert sorted(r.index for r in records) == list(range(6))
    for rec in records:
        assert isinstance(rec, RequestResult)
        assert rec.prompt_sha256 == prompt_sha256(reqs[rec.index].input_ids)
