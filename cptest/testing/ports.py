"""Free TCP ports for test servers that another process binds a moment later.

A port the kernel hands out for `bind(0)` comes from its ephemeral range, the same range it draws
the local ports of outgoing connections from. Between the test's pick and the server's bind (a
Python process starting: a second or more), any client connection of the test run may take that
port as its local end, and the server then fails with "address in use". Ports below that range are
never handed to a connection, so a pick there stays free until someone binds it on purpose.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable
from pathlib import Path

FLOOR = 20_000
"""The lowest port picked: above the well-known and registered services tests might meet."""
_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_low() -> int | None:
    """The first port of the kernel's ephemeral range, or None where it cannot be read."""
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def bindable(port: int) -> bool:
    """Whether 127.0.0.1:`port` can be bound now (no SO_REUSEADDR: a port in TIME_WAIT is not)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(rng: random.Random | None = None) -> int:
    """A port free on 127.0.0.1 now and, where the kernel's ephemeral range starts above FLOOR,
    below it; elsewhere, one the kernel picks."""
    low = ephemeral_low()
    if low is not None and low > FLOOR + 1000:
        pick = rng or random.SystemRandom()
        for _ in range(200):
            port = pick.randrange(FLOOR, low)
            if bindable(port):
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_block(offsets: Iterable[int], rng: random.Random | None = None) -> int:
    """A base port such that base + each offset is free now (a co-located server's node ports,
    its rendezvous, a second server's block), all below the ephemeral range where the kernel's
    range starts above FLOOR plus the widest offset."""
    wanted = sorted(set(offsets))
    low = ephemeral_low()
    top = (low if low is not None and low > FLOOR + wanted[-1] + 1000 else 65536) - wanted[-1]
    floor = FLOOR if top > FLOOR else 1024
    pick = rng or random.SystemRandom()
    for _ in range(200):
        base = pick.randrange(floor, top)
        if all(bindable(base + k) for k in wanted):
            return base
    raise RuntimeError(f"no free block of ports at offsets {wanted} below {top + wanted[-1]}")


def free_slots(slots: int, rng: random.Random | None = None) -> int:
    """A first port from which `slots` of a suite's port slots (`suite.machine.SLOT_STRIDE` ports
    each) are bindable now, below the ephemeral range: a claimed slot's server, or a test itself,
    binds its ports a moment later, which a client connection's local port or a TIME_WAIT there
    would refuse (`suite.port_claims.ports_free` looks for listeners only)."""
    from cptest.suite.machine import SLOT_STRIDE

    return free_block(range(SLOT_STRIDE * slots), rng)
