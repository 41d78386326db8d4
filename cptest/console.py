"""What a person watching a long command sees on stderr (README.md, "Commands").

The outline logger (`cptest.outline`) says when a phase starts and ends and how far long work got;
this module only chooses how that reaches a person, and never what reaches an archive (the run's
JSON sink sees the same events whatever is chosen here):

- **live** (stderr is a terminal, `NO_COLOR` unset, no `--json`): the outline's lines scroll above
  a live display (rich) of the phases still open, each with its elapsed time ticking, and the
  requests done of the total as a bar. Waiting for an engine's readiness or a workload is no longer
  20 s of silence.
- **plain** (a pipe or a file, `NO_COLOR`, a dumb terminal): one line per phase change, as before
  (`outline.TerminalSink`), and a line `... still <phase> (N s)` when nothing was printed for
  `HEARTBEAT_S` while a phase is open, so a CI log shows a wait is alive.
- **--json**: plain lines only, no heartbeat (stdout holds the JSON document; `cptest suite` keeps
  each child's stderr as its log).
"""

from __future__ import annotations

import os
import threading
import time
from typing import IO, Any

from cptest.outline import Event, Sink, TerminalSink

HEARTBEAT_S = 30.0
"""Plain mode: a `still ...` line after this long without a line while a phase is open."""

_SPIN = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def console_sink(stream: IO[str], *, live_allowed: bool = True) -> Sink:
    """The sink for a person on `stream`: live on a colour terminal when allowed, else plain lines
    (with heartbeats unless `live_allowed` is False, i.e. under --json)."""
    tty = bool(getattr(stream, "isatty", lambda: False)())
    if live_allowed and tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb":
        return LiveSink(stream)
    inner = TerminalSink(stream)
    return HeartbeatSink(inner, HEARTBEAT_S) if live_allowed else inner


class HeartbeatSink:
    """Plain lines (`TerminalSink`), and one `... still <phase> (N s)` line per `period_s` without
    output while a phase is open. The heartbeat is printed by this sink's own timer, never sent
    through the logger: archives record exactly what they did without it."""

    def __init__(self, inner: TerminalSink, period_s: float) -> None:
        self.inner = inner
        self.period_s = period_s
        self.tty = inner.tty  # the logger's progress rate follows it: keep what TerminalSink says
        self._open: list[tuple[str, float]] = []
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def emit(self, event: Event) -> None:
        with self._lock:
            if event.kind == "step_start":
                self._open.append((event.title, time.monotonic()))
            elif event.kind == "step_end" and self._open:
                self._open.pop()
            self.inner.emit(event)
            self._last = time.monotonic()
            if self._open and self._thread is None:
                self._thread = threading.Thread(target=self._beat, name="cptest-heartbeat", daemon=True)
                self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(min(self.period_s, 1.0)):
            with self._lock:
                now = time.monotonic()
                if not self._open or now - self._last < self.period_s:
                    continue
                title, t0 = self._open[-1]
                pad = "  " * len(self._open)
                self.inner._line(f"{pad}... still {title} ({now - t0:.0f} s)")
                self._last = now

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.inner.close()


class _Board:
    """The live display: every open phase with its elapsed time, the innermost one spinning, and
    the latest progress of each phase as a bar with its counts."""

    def __init__(self) -> None:
        self.open: list[tuple[str, float]] = []
        self.progress: dict[int, tuple[str, dict[str, Any]]] = {}

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        now = time.monotonic()
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
        grid.add_column(no_wrap=True, justify="right")
        for depth, (title, t0) in enumerate(self.open):
            mark = _SPIN[int(now * 10) % len(_SPIN)] if depth == len(self.open) - 1 else "·"
            grid.add_row(Text(f"{'  ' * depth}{mark} {title}", style="bold" if depth == 0 else ""),
                         Text(_elapsed(now - t0), style="cyan"))
            if depth + 1 in self.progress:
                text, fields = self.progress[depth + 1]
                done, total = fields.get("done"), fields.get("total")
                row = Table.grid(padding=(0, 1))
                if isinstance(done, int) and isinstance(total, int) and total > 0:
                    row.add_row(Text("  " * (depth + 1)), ProgressBar(total=total, completed=done, width=30),
                                Text(text, style="dim"))
                else:
                    row.add_row(Text("  " * (depth + 1)), Text(text, style="dim"))
                grid.add_row(row, Text(""))
        yield grid


def _elapsed(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{int(s // 60)} min {int(s % 60):02d} s"


class LiveSink:
    """The outline's lines printed above a live display of the open phases (rich). Lines keep the
    words `TerminalSink` prints; the live area is redrawn 4 times a second by rich's own thread and
    disappears when no phase is open, so nothing of it stays in the scrollback but the lines."""

    def __init__(self, stream: IO[str]) -> None:
        from rich.console import Console

        self.tty = True
        self.console = Console(file=stream, highlight=False, soft_wrap=True)
        self.board = _Board()
        self._live: Any = None
        self._lock = threading.RLock()

    def _print(self, text: str, style: str = "") -> None:
        from rich.text import Text

        self.console.print(Text(text, style=style))

    def emit(self, event: Event) -> None:
        with self._lock:
            pad = "  " * event.depth
            if event.kind == "step_start":
                self._print(pad + event.title, "bold")
                self.board.open.append((event.title, time.monotonic()))
                self._start()
            elif event.kind == "step_end":
                last = self.board.progress.pop(event.depth + 1, None)
                if last is not None:  # the last count stays in the scrollback, as on a plain terminal
                    self._print("  " * (event.depth + 1) + last[0], "dim")
                if self.board.open:
                    self.board.open.pop()
                word = "finished" if event.status == "ok" else "failed"
                text = f"{pad}({word}: {event.title}, in {event.duration_s:.2f} s)"
                if event.error:
                    text += f": {event.error}"
                self._print(text, "dim" if event.status == "ok" else "red")
                if not self.board.open:
                    self._stop()
            elif event.kind == "progress":
                self.board.progress[event.depth] = (event.title, dict(event.fields))
                if self._live is None:
                    self._print(pad + event.title, "dim")
            else:
                prefix = "" if event.level == "info" else f"{event.level}: "
                style = {"warning": "yellow", "error": "red"}.get(event.level, "")
                self._print(pad + prefix + event.title, style)

    def _start(self) -> None:
        if self._live is None:
            from rich.live import Live

            self._live = Live(self.board, console=self.console, refresh_per_second=4, transient=True,
                              redirect_stdout=False, redirect_stderr=False)
            self._live.start()

    def _stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def close(self) -> None:
        with self._lock:
            self._stop()
