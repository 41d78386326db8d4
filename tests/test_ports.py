"""cptest/testing/ports.py: test servers' ports come from below the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket

import pytest

from cptest.testing import ports


def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_bound() -> None:
    low = ports.ephemeral_low()
    if low is None or low <= ports.FLOOR + 1000:
        pytest.skip("no ephemeral range above the floor on this host")
    for _ in range(20):
        port = ports.free_port()
        assert ports.FLOOR <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        assert not ports.bindable(busy)
        monkeypatch.setattr(ports, "FLOOR", busy)
        monkeypatch.setattr(ports, "ephemeral_low", lambda: busy + 1002)
        picks = {ports.free_port(random.Random(seed)) for seed in range(30)}
        assert busy not in picks and all(busy < p < busy + 1002 for p in picks)


def test_without_a_readable_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_low", lambda: None)
    port = ports.free_port()
    assert ports.bindable(port)


def test_a_free_block_has_every_offset_free_and_below_the_ephemeral_range() -> None:
    offsets = (0, 1, 50, 100, 101, 150)
    base = ports.free_block(offsets)
    assert all(ports.bindable(base + k) for k in offsets)
    low = ports.ephemeral_low()
    if low is not None and low > ports.FLOOR + 1150:
        assert base >= ports.FLOOR and base + 150 < low


def test_a_block_whose_offset_is_taken_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(ports, "FLOOR", busy - 60)
        monkeypatch.setattr(ports, "ephemeral_low", lambda: busy + 1200)
        picks = {ports.free_block((0, 50), random.Random(seed)) for seed in range(40)}
        assert picks and all(busy not in (p, p + 50) for p in picks)


def test_free_slots_are_whole_suite_slots_of_bindable_ports() -> None:
    from cptest.suite.machine import SLOT_STRIDE

    base = ports.free_slots(3)
    assert all(ports.bindable(base + k) for k in range(3 * SLOT_STRIDE))
    low = ports.ephemeral_low()
    if low is not None and low > ports.FLOOR + 3 * SLOT_STRIDE + 1000:
        assert base >= ports.FLOOR and base + 3 * SLOT_STRIDE <= low
