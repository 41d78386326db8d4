"""Port slots claimed host-wide (cptest/suite/port_claims.py): two holders never share a slot, a slot
with a listener on it is passed over, and a claim ends with its holder however that one ends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cptest.errors import RunError
from cptest.suite.machine import PORT_BASE, PORT_BLOCK, SLOT_STRIDE
from cptest.suite.port_claims import (
    BASE_ENV,
    CLAIMS_ENV,
    claim_slot,
    port_base,
    try_claim,
)
from cptest.suite.schedule import Pool
from cptest.testing.ports import free_slots


@pytest.fixture
def claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "claims"
    monkeypatch.setenv(CLAIMS_ENV, str(folder))
    return folder


def test_two_claims_get_two_slots_and_a_released_slot_is_taken_again(claims: Path) -> None:
    base = free_slots(3)
    first, second = claim_slot(base), claim_slot(base)
    assert (first.main, first.baseline) == (base, base + PORT_BLOCK)
    assert second.main == base + SLOT_STRIDE  # the first slot is held, even by this very process
    first.release()
    third = claim_slot(base)
    assert third.main == base
    second.release()
    third.release()


@pytest.mark.parametrize("how", ["a listener in the baseline block", "the main port bound, not listening"])
def test_a_slot_whose_ports_are_taken_is_passed_over_until_they_are_let_go(claims: Path, how: str) -> None:
    base = free_slots(3)
    with socket.socket() as s:
        if how.startswith("a listener"):
            s.bind(("127.0.0.1", base + PORT_BLOCK + 7))
            s.listen()
        else:
            # No listener to see (and no SO_REUSEADDR), yet the server's bind, and so preflight,
            # would refuse the port.
            s.bind(("127.0.0.1", base))
        assert try_claim(base, base + PORT_BLOCK) is None
        c = claim_slot(base)
        assert c.main == base + SLOT_STRIDE
        c.release()
    # once the socket is gone the slot is free again, and the claim above was let go
    c = claim_slot(base)
    assert c.main == base
    c.release()


def test_a_claim_ends_with_its_holder_even_when_it_is_killed(claims: Path, tmp_path: Path) -> None:
    base = free_slots(3)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from cptest.suite.port_claims import claim_slot
        c = claim_slot({base})
        print(c.main, flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True, env={**os.environ, CLAIMS_ENV: str(claims)})
    try:
        assert holder.stdout is not None and int(holder.stdout.readline()) == base
        assert try_claim(base, base + PORT_BLOCK) is None  # held by the other process
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        again = try_claim(base, base + PORT_BLOCK)  # no cleanup ran, and the slot is free
        assert again is not None
        again.release()
    finally:
        holder.kill()
        holder.wait()


def test_every_slot_taken_is_an_infrastructure_error_naming_the_way_out(claims: Path) -> None:
    base = free_slots(2)
    held = [claim_slot(base) for _ in range(2)]
    try:
        with pytest.raises(RunError) as e:
            claim_slot(base, slots=2)
        assert e.value.exit_code == 3
        assert "no free port slot" in str(e.value) and "--ports" in (e.value.problems[0].hint or "")
    finally:
        for c in held:
            c.release()


def test_the_base_comes_from_the_environment_and_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BASE_ENV, raising=False)
    assert port_base() == PORT_BASE
    monkeypatch.setenv(BASE_ENV, "45000")
    assert port_base() == 45000
    for bad in ("x", "80", "65500"):
        monkeypatch.setenv(BASE_ENV, bad)
        with pytest.raises(RunError, match=BASE_ENV):
            port_base()


def test_the_suites_pool_takes_only_slots_it_could_claim(claims: Path) -> None:
    from cptest.suite.demand import Demand
    from cptest.suite.machine import Machine

    base = free_slots(3)
    outside = claim_slot(base)  # another cptest process's run, as far as the suite can tell
    try:
        pool = Pool(Machine({0: 80_000}, tuple(range(8)), port_base=base), claim=try_claim)
        d = Demand(name="a", gpus=1, gpu_mib=1000, cpus=2)
        granted = pool.place("a", d)
        assert granted is not None and granted.placement.main_port == base + SLOT_STRIDE
        assert try_claim(base + SLOT_STRIDE, base + SLOT_STRIDE + PORT_BLOCK) is None  # the pool holds it
        pool.release("a")
        freed = try_claim(base + SLOT_STRIDE, base + SLOT_STRIDE + PORT_BLOCK)
        assert freed is not None
        freed.release()
    finally:
        outside.release()
