"""Append-only writer of runner evidence records (`evidence/<role>/runner.jsonl`).

Each record is written and flushed the moment it is observed (evidence first: a crash of cptest
leaves everything gathered so far). `t` is filled in as seconds since the writer was opened, on the
monotonic clock, unless the caller set it. Safe to use from several threads.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from pydantic import BaseModel

from cptest.evidence import dump_record
from cptest.paths import portable


class RecordWriter:
    """JSON-lines writer for evidence records; one per file."""

    def __init__(self, path: Path, *, t0: float | None = None, fsync: bool = False) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic() if t0 is None else t0
        self.fsync = fsync
        self._f = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def now(self) -> float:
        """Seconds since this writer opened, on the clock records use."""
        return time.monotonic() - self.t0

    def write(self, record: BaseModel) -> BaseModel:
        """Append `record` (with `t` set when it was 0) and flush. Returns what was written."""
        if getattr(record, "t", None) == 0.0:
            record = record.model_copy(update={"t": round(self.now(), 6)})
        line = portable(dump_record(record)) + "\n"  # no directory of this machine (cptest.paths)
        with self._lock:
            if self._f.closed:  # a late sampler after close: reopen rather than lose evidence
                self._f = self.path.open("a", encoding="utf-8")
            self._f.write(line)
            self._f.flush()
            if self.fsync:
                os.fsync(self._f.fileno())
        return record

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.close()
