"""Specification of cptest/retry.py: the one wait function."""

from __future__ import annotations

import pytest

from cptest.errors import RunError
from cptest.retry import Abort, retry


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def test_returns_value_and_elapsed_when_condition_becomes_true() -> None:
    clock = FakeClock()
    calls = iter([None, False, "ready"])
    value, elapsed = retry(lambda last: next(calls), 10, 1.0, clock=clock, sleep=clock.sleep)
    assert value == "ready"
    assert elapsed == pytest.approx(2.0)


def test_gives_up_with_what_elapsed_tries_and_last_error() -> None:
    clock = FakeClock()

    def fails(last: bool) -> bool:
        raise ConnectionError("refused")

    with pytest.raises(RunError) as info:
        retry(fails, 3, 1.0, what="waiting for /health_generate", clock=clock, sleep=clock.sleep)
    msg = str(info.value)
    assert "waiting for /health_generate" in msg
    assert "3.0 s" in msg and "4 tries" in msg
    assert "ConnectionError: refused" in msg
    assert info.value.exit_code == 3


def test_flags_only_the_last_try() -> None:
    clock = FakeClock()
    flags: list[bool] = []

    def never(last: bool) -> None:
        flags.append(last)
        return None

    with pytest.raises(RunError):
        retry(never, 2.5, 1.0, clock=clock, sleep=clock.sleep)
    assert flags[-1] is True
    assert not any(flags[:-1])
    assert clock.now == pytest.approx(102.5)  # the last sleep is cut to the deadline


def test_abort_stops_at_once() -> None:
    clock = FakeClock()
    tries = []

    def exited(last: bool) -> bool:
        tries.append(last)
        raise Abort("engine exited with status 1")

    with pytest.raises(Abort, match="status 1"):
        retry(exited, 60, 1.0, clock=clock, sleep=clock.sleep)
    assert len(tries) == 1


def test_zero_timeout_tries_once_as_the_last_try() -> None:
    seen = []
    value, _ = retry(lambda last: seen.append(last) or last, 0)
    assert value is True and seen == [True]


def test_uses_the_real_monotonic_clock_by_default() -> None:
    with pytest.raises(RunError):
        retry(lambda last: None, 0.05, 0.01)
