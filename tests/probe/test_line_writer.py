"""The rank file's writer process (`cptest.probe.line_writer`): what it writes, and what the probe
does when it is gone or never starts."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

pytest.importorskip("numpy")

import numpy as np  # noqa: E402

from cptest.evidence import PoolSample, ProbeNote, RankId, Step, read_records  # noqa: E402
from cptest.probe import line_writer, records  # noqa: E402
from cptest.probe.line_writer import LineWriter  # noqa: E402
from cptest.probe.runtime import Probe  # noqa: E402

RANK = RankId(world=2, tp=1, dcp=1, pid=4242)
RANK_JSON = RANK.model_dump_json()


def _items(t0: float) -> list[object]:
    """A pool sample and a `steps` line of two steps over two requests, as a batch hands them over."""
    pool = records.pool_sample_late(RANK_JSON, t0 + 1.25, 9, 2048, 100, 64, None, 2, 0, 2048, False)
    steps = records.steps_block_late(
        (t0 + 1.5, t0 + 1.5015), step=(10, 11), rows_in=(2, 2), attn_rows=(None, None), ffn_rows=(None, None),
        logits_rows=(None, None), cp_configured=False, graph_rows=2, rank_json=RANK_JSON, quoted="a\",\"b",
        positions=np.array([[5, 9], [6, 10]]), kv=None, mask=None, ffn_out_rows=(None, None), layers=(0, 0),
        slots=None)
    return [b'{"v":8,"t":1.0,"kind":"probe_note","rank":' + RANK_JSON.encode()
            + b',"level":"info","message":"made already"}\n', pool, steps]


def test_the_writer_writes_each_items_line_in_order_and_syncs(tmp_path: Path) -> None:
    path = tmp_path / "rank2.jsonl"
    writer, why = LineWriter.start(path, 1000.0, RANK_JSON)
    assert writer is not None, why
    try:
        items = _items(1000.0)
        assert writer.send(items) and writer.sync(10.0)
        want = b"".join(i if isinstance(i, bytes) else (records.item_line(i, 1000.0) + "\n").encode()
                        for i in items)
        assert path.read_bytes() == want
    finally:
        assert writer.close(10.0)
    recs, dropped = read_records(path)
    assert dropped == 0
    assert [type(r) for r in recs] == [ProbeNote, PoolSample, Step, Step]
    assert [r.t for r in recs] == [1.0, 1.25, 1.5, 1.5015]


def test_the_writer_writes_what_it_received_when_the_pipe_ends_without_a_sync(tmp_path: Path) -> None:
    """The engine's process gone (its end of the pipe closed): what was sent is still written."""
    path = tmp_path / "rank2.jsonl"
    writer, why = LineWriter.start(path, 1000.0, RANK_JSON)
    assert writer is not None, why
    for _ in range(50):
        assert writer.send(_items(1000.0))
    assert writer.close(10.0)
    recs, dropped = read_records(path)
    assert dropped == 0 and len(recs) == 50 * 4


def test_a_line_the_writer_cannot_make_becomes_a_note_and_the_rest_are_written(tmp_path: Path) -> None:
    path = tmp_path / "rank2.jsonl"
    writer, why = LineWriter.start(path, 1000.0, RANK_JSON)
    assert writer is not None, why
    bad = ("steps", (1001.0,), {"unknown_field": 1})
    assert writer.send([bad, *_items(1000.0)]) and writer.close(10.0)
    recs, _ = read_records(path)
    assert isinstance(recs[0], ProbeNote) and recs[0].level == "error"
    assert "writer: TypeError" in recs[0].message
    assert [type(r) for r in recs[1:]] == [ProbeNote, PoolSample, Step, Step]


def test_the_probe_writes_the_file_itself_once_its_writer_is_gone(tmp_path: Path) -> None:
    """Lines sent to a writer that died are lost, and the file says so; every later line is the
    probe's own."""
    p = Probe(tmp_path, writer="process")
    p.set_rank(RANK)
    try:
        assert p.writer is not None
        p.note("first")
        assert p.flush()
        p.writer.kill()
        p.note("second")
        p.note("third")
        assert p.writer is None and p.flush()
    finally:
        p.close()
    messages = [r.message for r in read_records(tmp_path / "rank2.jsonl")[0] if isinstance(r, ProbeNote)]
    assert messages[0] == "first" and messages[-2:] == ["second", "third"]
    assert any("writer process ended" in m for m in messages)


def test_a_writer_that_cannot_start_leaves_the_probe_writing_the_file_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(line_writer.sys, "executable", str(tmp_path / "no-python"))
    p = Probe(tmp_path, writer="process")
    p.set_rank(RANK)
    try:
        assert p.writer is None
        p.note("written anyway")
        assert p.flush()
    finally:
        p.close()
    messages = [r.message for r in read_records(tmp_path / "rank2.jsonl")[0] if isinstance(r, ProbeNote)]
    assert "written anyway" in messages
    assert any("writer process did not start" in m and "no-python" in m for m in messages)


def test_the_writer_is_told_where_cptest_lies_before_any_path_of_the_engine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's processes import the probe from wherever cptest lies (a copied tree on the GPU
    machine, not an installed package): the writer gets that directory first on its PYTHONPATH,
    then the engine's own, and runs on the engine's interpreter."""
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.chdir(tmp_path)
    seen: list[tuple[list[str], dict[str, str]]] = []
    popen = line_writer.subprocess.Popen

    def recording(args: list[str], **kw: object) -> object:
        seen.append((args, dict(kw["env"])))  # type: ignore[call-overload]
        return popen(args, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(line_writer.subprocess, "Popen", recording)
    writer, why = LineWriter.start(tmp_path / "rank2.jsonl", 0.0, RANK_JSON)
    assert writer is not None, why
    assert writer.close(10.0)
    ((args, env),) = seen
    root = str(Path(line_writer.__file__).resolve().parents[2])
    assert args[:3] == [sys.executable, "-m", "cptest.probe.line_writer"]
    assert env["PYTHONPATH"].split(os.pathsep) == [root, "/elsewhere"]
    assert (Path(root) / "cptest" / "probe" / "line_writer.py").is_file()


def test_a_terminated_writer_still_writes_what_it_received_once_the_engine_ends_the_pipe(
        tmp_path: Path) -> None:
    """SIGTERM to the server's process group reaches the writer too: it waits for the engine, which
    shuts down and flushes, and writes everything sent before the pipe ends."""
    path = tmp_path / "rank2.jsonl"
    writer, why = LineWriter.start(path, 1000.0, RANK_JSON)
    assert writer is not None, why
    writer.proc.send_signal(signal.SIGTERM)
    for _ in range(10):
        assert writer.send(_items(1000.0))
    assert writer.sync(10.0) and writer.close(10.0)
    assert len(read_records(path)[0]) == 10 * 4
