"""One outline logger for cptest, fanned out to sinks (terminal, JSON lines, JUnit records).

Long actions run inside `log.step("waiting for rank 2 KV pool")`: the step is printed when it
starts and `(finished: waiting for rank 2 KV pool, in 3.2 s)` when it ends, nested by indentation
(NixOS test driver, `nested`). Progress of long work (requests done while the workload runs) is one
updating line on a terminal and a line every `interval_s` otherwise. The logger never raises into
the caller because of a sink: a sink that fails is dropped with one warning on stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal, Protocol

from cptest.paths import portable

Level = Literal["info", "warning", "error"]


@dataclass(frozen=True)
class Event:
    """One thing the logger was told. `kind`: step_start, step_end, message, progress."""

    kind: str
    title: str
    depth: int
    t: float
    """Seconds since the logger was created (monotonic)."""
    level: Level = "info"
    duration_s: float | None = None
    status: Literal["ok", "failed"] | None = None
    error: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)


class Sink(Protocol):
    def emit(self, event: Event) -> None: ...

    def close(self) -> None: ...


def _use_color(stream: IO[str]) -> bool:
    # https://no-color.org: any non-empty NO_COLOR disables colour; pipes and files get none either.
    if os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


class TerminalSink:
    """Human outline on a stream (stderr by default). Colour only on a tty without NO_COLOR."""

    _COLORS = {"warning": "\x1b[33m", "error": "\x1b[31m", "step": "\x1b[1m", "done": "\x1b[2m"}
    _RESET = "\x1b[0m"

    def __init__(self, stream: IO[str] | None = None, *, color: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.color = _use_color(self.stream) if color is None else color
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._progress_open = False

    def _paint(self, text: str, key: str) -> str:
        return f"{self._COLORS[key]}{text}{self._RESET}" if self.color and key in self._COLORS else text

    def _line(self, text: str) -> None:
        if self._progress_open:  # finish the updating progress line before printing anything else
            self.stream.write("\n")
            self._progress_open = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def emit(self, event: Event) -> None:
        pad = "  " * event.depth
        if event.kind == "step_start":
            self._line(pad + self._paint(event.title, "step"))
        elif event.kind == "step_end":
            word = "finished" if event.status == "ok" else "failed"
            text = f"{pad}({word}: {event.title}, in {event.duration_s:.2f} s)"
            if event.error:
                text += f": {event.error}"
            self._line(self._paint(text, "done" if event.status == "ok" else "error"))
        elif event.kind == "progress":
            text = f"{pad}{event.title}"
            if self.tty:
                self.stream.write("\r\x1b[2K" + text if self.color else "\r" + text)
                self.stream.flush()
                self._progress_open = True
            else:
                self._line(text)
        else:
            prefix = "" if event.level == "info" else f"{event.level}: "
            self._line(pad + self._paint(prefix + event.title, event.level))

    def close(self) -> None:
        if self._progress_open:
            self.stream.write("\n")
            self.stream.flush()
            self._progress_open = False


class JsonLinesSink:
    """Appends every event as one JSON object per line (evidence/cptest.jsonl), flushed at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = path.open("a", encoding="utf-8")

    def emit(self, event: Event) -> None:
        obj = {
            "kind": event.kind, "title": event.title, "depth": event.depth, "t": round(event.t, 6),
            "wall": datetime.now(UTC).isoformat(timespec="milliseconds"), "level": event.level,
        }
        if event.duration_s is not None:
            obj["duration_s"] = round(event.duration_s, 6)
        if event.status is not None:
            obj["status"] = event.status
        if event.error is not None:
            obj["error"] = event.error
        if event.fields:
            obj["fields"] = event.fields
        self._f.write(portable(json.dumps(obj, default=str)) + "\n")  # no directory of this machine
        self._f.flush()

    def close(self) -> None:
        self._f.close()


@dataclass
class JUnitCase:
    """One finished top-level step, ready for a JUnit `<testcase>`."""

    name: str
    duration_s: float
    status: Literal["ok", "failed"]
    message: str = ""


class JUnitSink:
    """Keeps finished steps of depth 0 as `JUnitCase`s (the report stage renders the XML)."""

    def __init__(self) -> None:
        self.cases: list[JUnitCase] = []

    def emit(self, event: Event) -> None:
        if event.kind == "step_end" and event.depth == 0:
            self.cases.append(JUnitCase(event.title, event.duration_s or 0.0, event.status or "ok",
                                        event.error or ""))

    def close(self) -> None:
        pass


class Progress:
    """Progress of one long piece of work; `update` is cheap, printing is rate-limited."""

    def __init__(self, logger: Logger, what: str, total: int | None, interval_s: float) -> None:
        self.logger = logger
        self.what = what
        self.total = total
        self.interval_s = interval_s
        self._last_emit = float("-inf")
        self._last_text = ""
        self._lock = threading.Lock()

    def _text(self, done: int, counts: dict[str, int]) -> str:
        head = f"{self.what}: {done}/{self.total}" if self.total is not None else f"{self.what}: {done}"
        extra = ", ".join(f"{k} {v}" for k, v in counts.items())
        return f"{head} ({extra})" if extra else head

    def update(self, done: int, force: bool = False, **counts: int) -> None:
        """Report `done` units (and named counts). Emits at most every `interval_s` (always on tty
        at most 10 times a second) unless `force`."""
        now = time.monotonic()
        text = self._text(done, counts)
        with self._lock:
            period = 0.1 if self.logger.tty else self.interval_s
            if not force and (now - self._last_emit < period or text == self._last_text):
                return
            self._last_emit, self._last_text = now, text
        self.logger._emit("progress", text, fields={"done": done, "total": self.total, **counts})


class Logger:
    """The outline logger. Thread-safe; nesting depth is per logger (steps run on the main thread)."""

    def __init__(self, sinks: list[Sink] | None = None) -> None:
        self.sinks: list[Sink] = list(sinks or [])
        self._t0 = time.monotonic()
        self._depth = 0
        self._lock = threading.RLock()

    @property
    def tty(self) -> bool:
        return any(getattr(s, "tty", False) for s in self.sinks)

    def add_sink(self, sink: Sink) -> None:
        with self._lock:
            self.sinks.append(sink)

    def remove_sink(self, sink: Sink) -> None:
        """Detach and close `sink` (e.g. the run's JSON sink when the run ends)."""
        with self._lock:
            if sink in self.sinks:
                self.sinks.remove(sink)
        sink.close()

    def _emit(self, kind: str, title: str, **kw: Any) -> None:
        with self._lock:
            event = Event(kind, title, self._depth, time.monotonic() - self._t0, **kw)
            for sink in list(self.sinks):
                try:
                    sink.emit(event)
                except Exception as e:  # a broken sink must not break the run it describes
                    self.sinks.remove(sink)
                    print(f"cptest: log sink {type(sink).__name__} failed and was dropped: {e}",
                          file=sys.stderr)

    @contextlib.contextmanager
    def step(self, title: str, **fields: Any) -> Iterator[None]:
        """Run the body as one nested step; prints start and `(finished|failed: title, in N s)`.

        The exception of a failed body is re-raised unchanged after the end is logged.
        """
        self._emit("step_start", title, fields=fields)
        start = time.monotonic()
        with self._lock:
            self._depth += 1
        try:
            yield
        except BaseException as e:
            with self._lock:
                self._depth -= 1
            error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            self._emit("step_end", title, duration_s=time.monotonic() - start, status="failed",
                       error=error.splitlines()[0], level="error")
            raise
        with self._lock:
            self._depth -= 1
        self._emit("step_end", title, duration_s=time.monotonic() - start, status="ok")

    def info(self, message: str, **fields: Any) -> None:
        self._emit("message", message, fields=fields)

    def warning(self, message: str, **fields: Any) -> None:
        self._emit("message", message, level="warning", fields=fields)

    def error(self, message: str, **fields: Any) -> None:
        self._emit("message", message, level="error", fields=fields)

    def progress(self, what: str, total: int | None = None, interval_s: float = 10.0) -> Progress:
        return Progress(self, what, total, interval_s)

    def close(self) -> None:
        for sink in list(self.sinks):
            with contextlib.suppress(Exception):
                sink.close()


def default_logger(stream: IO[str] | None = None) -> Logger:
    """A logger with a terminal sink and a JUnit sink (the CLI adds the run's JSON sink)."""
    return Logger([TerminalSink(stream), JUnitSink()])


def null_logger() -> Logger:
    """A logger that records nothing (tests, library use)."""
    return Logger([])
