"""RecordWriter: synchronous and background modes (docs/decisions.md D70)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from cptest.evidence import Lifecycle, read_records
from cptest.run.evidence_writer import RecordWriter


def note(i: int, who: str = "a") -> Lifecycle:
    return Lifecycle(run="main", event="ready", detail={"i": i, "who": who})


def written(path: Path) -> list[tuple[str, int]]:
    records, dropped = read_records(path)
    assert dropped == 0
    return [(r.detail["who"], r.detail["i"]) for r in records]  # type: ignore[attr-defined]


@pytest.mark.parametrize("background", [False, True])
def test_records_arrive_in_the_order_written_and_are_stamped_when_written(
        tmp_path: Path, background: bool) -> None:
    w = RecordWriter(tmp_path / "r.jsonl", background=background)
    stamped = [w.write(note(i)) for i in range(200)]
    w.flush()
    assert written(tmp_path / "r.jsonl") == [("a", i) for i in range(200)]
    ts = [r.t for r in stamped]  # type: ignore[attr-defined]
    assert all(t > 0 for t in ts) and ts == sorted(ts)
    records, _ = read_records(tmp_path / "r.jsonl")
    assert [r.t for r in records] == ts  # the file holds the stamp of the write, not of the thread's turn
    w.close()


def test_writers_on_several_threads_lose_nothing_and_keep_each_ones_order(tmp_path: Path) -> None:
    w = RecordWriter(tmp_path / "r.jsonl", background=True)
    threads = [threading.Thread(target=lambda who=who: [w.write(note(i, who)) for i in range(300)])
               for who in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.close()
    got = written(tmp_path / "r.jsonl")
    assert len(got) == 1200
    for who in "abcd":
        assert [i for w_, i in got if w_ == who] == list(range(300))


def test_close_writes_everything_queued_and_a_late_record_still_lands_after_it(tmp_path: Path) -> None:
    w = RecordWriter(tmp_path / "r.jsonl", background=True)
    for i in range(500):
        w.write(note(i))
    w.close()
    assert len(written(tmp_path / "r.jsonl")) == 500
    w.write(note(500))  # a late sampler after close: reopened, synchronously
    assert written(tmp_path / "r.jsonl")[-1] == ("a", 500)
    w.close()


def test_a_failure_of_the_writer_thread_is_raised_and_later_records_are_still_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = RecordWriter(tmp_path / "r.jsonl", background=True)
    real = RecordWriter._append

    def append(self: RecordWriter, record: Lifecycle) -> None:
        if record.detail["i"] == 1:  # type: ignore[attr-defined]
            raise OSError(28, "No space left on device")
        real(self, record)

    monkeypatch.setattr(RecordWriter, "_append", append)
    for i in range(3):
        w.write(note(i))
    with pytest.raises(OSError, match="r.jsonl failed: .*No space left"):
        w.flush()
    w.write(note(1))  # fails again on the thread; the next write raises it, and keeps its own record
    deadline = time.monotonic() + 10
    while w._error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(OSError, match="No space left"):
        w.write(note(5))
    w.close()  # each failure was raised once; nothing more to say
    assert written(tmp_path / "r.jsonl") == [("a", 0), ("a", 2), ("a", 5)]
