"""What a person sees of a long command on stderr (cptest/console.py, docs/decisions.md D50): a live
display on a colour terminal, plain lines with heartbeats on a pipe, plain lines only under --json,
and never anything of it in the run's archive log."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest

from cptest.console import HeartbeatSink, LiveSink, console_sink
from cptest.outline import JsonLinesSink, Logger, TerminalSink
from tests.test_cli import ANSI, _through_a_terminal


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_sink_is_chosen_by_terminal_no_color_and_json(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert isinstance(console_sink(_Tty()), LiveSink)
    assert isinstance(console_sink(io.StringIO()), HeartbeatSink)  # a pipe: plain lines, heartbeats
    assert type(console_sink(_Tty(), live_allowed=False)) is TerminalSink  # --json: plain lines only
    monkeypatch.setenv("NO_COLOR", "1")
    assert isinstance(console_sink(_Tty()), HeartbeatSink)
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert isinstance(console_sink(_Tty()), HeartbeatSink)


def test_a_quiet_phase_gets_heartbeat_lines_that_never_reach_the_archive_log(tmp_path: Path):
    def outline(with_heartbeat: bool) -> tuple[str, list[dict]]:
        out = io.StringIO()
        term = TerminalSink(out)
        sink = HeartbeatSink(term, 0.3) if with_heartbeat else term
        archive_log = tmp_path / f"cptest-{with_heartbeat}.jsonl"
        log = Logger([sink, JsonLinesSink(archive_log)])
        with log.step("waiting for main server readiness"):
            time.sleep(1.6)
        log.close()
        events = [json.loads(line) for line in archive_log.read_text().splitlines()]
        kept = ("kind", "title", "depth")
        return out.getvalue(), [{k: v for k, v in e.items() if k in kept} for e in events]

    beating, archived = outline(True)
    plain, archived_plain = outline(False)
    assert "... still waiting for main server readiness (" in beating
    assert beating.count("... still") >= 2 and "... still" not in plain
    assert archived == archived_plain  # the archive's outline log is the same with or without them


def test_no_heartbeat_when_lines_keep_coming():
    out = io.StringIO()
    log = Logger([HeartbeatSink(TerminalSink(out), 0.5)])
    with log.step("workload"):
        for i in range(8):
            log.info(f"request {i}")
            time.sleep(0.1)
    log.close()
    assert "... still" not in out.getvalue()


LIVE = """
import sys, time
from cptest.console import console_sink
from cptest.outline import Logger
log = Logger([console_sink(sys.stderr)])
with log.step("waiting for main server readiness"):
    time.sleep(1.5)
p = log.progress("main requests", 4)
with log.step("main workload: 4 requests"):
    for i in range(1, 5):
        p.update(i, force=True, ok=i)
        time.sleep(0.3)
"""


def test_a_terminal_sees_the_open_phase_with_its_elapsed_time_and_a_bar():
    drawn = _through_a_terminal("-c", LIVE, no_color=False)
    assert ANSI.search(drawn)
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn)
    assert "⠋" in out or any(c in out for c in "⠙⠹⠸⠼⠴⠦⠧⠇⠏")  # the live display was drawn
    assert "waiting for main server readiness" in out and " 1 s" in out  # its elapsed time ticked
    assert "━" in out and "main requests: 4/4 (ok 4)" in out  # the requests' bar and their last count
    assert "(finished: main workload: 4 requests, in " in out  # the outline's lines are kept


def test_no_color_on_a_terminal_gets_plain_lines_without_a_live_display():
    out = _through_a_terminal("-c", LIVE, no_color=True)
    assert not ANSI.search(out) and "━" not in out
    assert "waiting for main server readiness" in out and "main requests: 4/4 (ok 4)" in out
