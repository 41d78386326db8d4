"""Append-only writer of runner evidence records (`evidence/<role>/runner.jsonl`).

Each record is written and flushed the moment it is observed (evidence first: a crash of cptest
leaves everything gathered so far). `t` is filled in as seconds since the writer was opened, on the
monotonic clock, unless the caller set it. Safe to use from several threads.

`background=True` (the runner's files, which the workload driver writes from its event loop): a
record is stamped and queued by `write`, and a thread of the writer turns it into its line and
writes and flushes it, in the order `write` was called. The event loop then spends ~1 us per record
instead of the line's serialisation and the file's write (~50-100 us for a request's result): the
driver writes one result as each request ends, requests of one length end together, and the next
requests start in those same loop iterations, where any work adds to the time to their first token
as cptest's client reads it. Records reach the file within milliseconds;
`flush()` waits for them, `close()` writes them all first. A cptest killed outright (SIGKILL) loses
what was still queued, at most the last few milliseconds of records.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path

from pydantic import BaseModel

from cptest.evidence import dump_record
from cptest.paths import portable


class RecordWriter:
    """JSON-lines writer for evidence records; one per file."""

    def __init__(self, path: Path, *, t0: float | None = None, fsync: bool = False,
                 background: bool = False) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic() if t0 is None else t0
        self.fsync = fsync
        self._f = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[BaseModel | threading.Event | None] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._queue_lock = threading.Lock()  # a record is queued only while the thread will write it
        self._closing: threading.Thread | None = None
        if background:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._drain, name=f"cptest-records:{path.name}",
                                            daemon=True)
            self._thread.start()

    def now(self) -> float:
        """Seconds since this writer opened, on the clock records use."""
        return time.monotonic() - self.t0

    def write(self, record: BaseModel) -> BaseModel:
        """Append `record` (with `t` set when it was 0) and flush (in background mode: queue it for
        the writer's thread). Returns what was written."""
        if getattr(record, "t", None) == 0.0:
            record = record.model_copy(update={"t": round(self.now(), 6)})
        with self._queue_lock:
            queued = self._thread is not None and self._queue is not None
            if queued:
                self._queue.put(record)  # type: ignore[union-attr]
            closing = self._closing
        if not queued:
            if closing is not None:  # a late sampler while `close` drains: after what was queued
                closing.join()
            self._append(record)  # synchronous mode, or after close
        self._raise_failed()  # an earlier record's failure, after this record is on its way
        return record

    def flush(self) -> None:
        """Return once every record written so far is in the file (at once in synchronous mode)."""
        done = threading.Event()
        with self._queue_lock:
            if self._thread is None or self._queue is None:
                done.set()
            else:
                self._queue.put(done)
        done.wait()
        self._raise_failed()

    def close(self) -> None:
        """Write what is queued, stop the writer's thread, close the file. A record written later
        still reaches the file (reopened, synchronously): a late sampler loses nothing."""
        with self._queue_lock:
            thread, self._thread = self._thread, None
            if thread is not None and self._queue is not None:
                self._closing = thread
                self._queue.put(None)
        if thread is not None:
            thread.join()
        with self._lock:
            if not self._f.closed:
                self._f.close()
        self._raise_failed()

    def _append(self, record: BaseModel) -> None:
        line = portable(dump_record(record)) + "\n"  # no directory of this machine (cptest.paths)
        with self._lock:
            if self._f.closed:  # a late sampler after close: reopen rather than lose evidence
                self._f = self.path.open("a", encoding="utf-8")
            self._f.write(line)
            self._f.flush()
            if self.fsync:
                os.fsync(self._f.fileno())

    def _drain(self) -> None:
        """The writer's thread: lines in queue order until `close` sends None. A failure (a full
        disk) is kept and raised by the next `write`, `flush` or `close`; later records are still
        tried, so that one bad moment does not silence the rest."""
        assert self._queue is not None
        while (item := self._queue.get()) is not None:
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._append(item)
            except BaseException as e:  # noqa: BLE001 - handed to the writing thread
                if self._error is None:
                    self._error = e

    def _raise_failed(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise OSError(f"writing {self.path} failed: {e}") from e
