"""Specification of cptest/outline.py: the outline logger and its sinks."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from cptest.outline import JsonLinesSink, JUnitSink, Logger, TerminalSink


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_steps_nest_and_report_their_duration() -> None:
    out = io.StringIO()
    log = Logger([TerminalSink(out)])
    with log.step("launching main server"), log.step("waiting for rank 2 KV pool"):
        log.info("pool has 4096 rows")
    lines = out.getvalue().splitlines()
    assert lines[0] == "launching main server"
    assert lines[1] == "  waiting for rank 2 KV pool"
    assert lines[2] == "    pool has 4096 rows"
    assert lines[3].startswith("  (finished: waiting for rank 2 KV pool, in ")
    assert lines[4].startswith("(finished: launching main server, in ")


def test_a_failed_step_is_logged_and_its_exception_reraised() -> None:
    out = io.StringIO()
    log = Logger([TerminalSink(out)])
    with pytest.raises(ValueError), log.step("parsing"):
        raise ValueError("bad token")
    assert "(failed: parsing, in " in out.getvalue()
    assert "ValueError: bad token" in out.getvalue()
    with log.step("next"):
        pass
    assert "\n(finished: next" in out.getvalue()  # depth is restored after the failure


def test_no_color_on_non_tty_and_when_no_color_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TerminalSink(io.StringIO()).color is False
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert TerminalSink(Tty()).color is True
    monkeypatch.setenv("NO_COLOR", "1")
    assert TerminalSink(Tty()).color is False


def test_json_lines_sink_writes_one_object_per_event(tmp_path: Path) -> None:
    path = tmp_path / "evidence" / "cptest.jsonl"
    log = Logger([JsonLinesSink(path)])
    with log.step("workload", requests=4):
        log.warning("slow")
    log.close()
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["kind"] for e in events] == ["step_start", "message", "step_end"]
    assert events[0]["fields"] == {"requests": 4}
    assert events[1]["level"] == "warning" and events[1]["depth"] == 1
    assert events[2]["status"] == "ok" and events[2]["duration_s"] >= 0


def test_junit_sink_keeps_top_level_steps_only() -> None:
    junit = JUnitSink()
    log = Logger([junit])
    with log.step("main server"), log.step("inner"):
        pass
    with pytest.raises(RuntimeError), log.step("baseline server"):
        raise RuntimeError("boom")
    assert [(c.name, c.status) for c in junit.cases] == [("main server", "ok"), ("baseline server", "failed")]
    assert "boom" in junit.cases[1].message


def test_progress_prints_periodic_lines_off_tty() -> None:
    out = io.StringIO()
    log = Logger([TerminalSink(out)])
    p = log.progress("main requests", total=10, interval_s=3600)
    p.update(1, ok=1)
    p.update(2, ok=2)  # within the interval: not printed
    p.update(10, force=True, ok=9, error=1)
    assert out.getvalue().splitlines() == [
        "main requests: 1/10 (ok 1)",
        "main requests: 10/10 (ok 9, error 1)",
    ]


def test_progress_is_one_updating_line_on_a_tty() -> None:
    out = Tty()
    log = Logger([TerminalSink(out, color=False)])
    p = log.progress("main requests", total=3)
    p.update(1, force=True)
    p.update(2, force=True)
    log.info("done")
    text = out.getvalue()
    assert text == "\rmain requests: 1/3\rmain requests: 2/3\ndone\n"


def test_a_broken_sink_is_dropped_without_breaking_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    class Broken:
        def emit(self, event: object) -> None:
            raise OSError("disk full")

        def close(self) -> None:
            pass

    out = io.StringIO()
    log = Logger([Broken(), TerminalSink(out)])
    log.info("one")
    log.info("two")
    assert out.getvalue() == "one\ntwo\n"
    assert "disk full" in capsys.readouterr().err
