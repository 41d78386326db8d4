"""Port slots claimed host-wide, so that cptest processes running at once never pick the same ports.

A slot is what `cptest.suite.machine` lays out: a main and a baseline block of `PORT_BLOCK` ports
each (a co-located server's node ports and rendezvous lie inside its block). A claim is an exclusive
`flock` on the slot's file in a claims folder. It is atomic between processes, and the kernel drops
it when the file is closed or its holder exits by any path, SIGKILL included: no claim outlives the
process that made it, and nothing has to be cleaned up after a crash. A slot whose ports something
else already listens on (a server cptest did not start), or whose main or baseline port a server
could not bind, is passed over.

`cptest run` claims a slot unless `--ports` names the ports; `cptest suite` claims one per scenario
it starts and hands its ports to the scenario's run.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil

from cptest.errors import Problem, RunError
from cptest.run.preflight import server_can_bind
from cptest.suite.machine import PORT_BASE, PORT_BLOCK, SLOT_STRIDE

CLAIMS_ENV = "CPTEST_PORT_CLAIMS"
"""The claims folder; default a folder of this user's under the system's temporary directory."""
BASE_ENV = "CPTEST_PORT_BASE"
"""The first slot's main port (default `PORT_BASE`): lets two test suites on one host keep apart."""
SLOTS = 64


def claims_dir() -> Path:
    """The folder whose files are the claims (made on first use, this user's only)."""
    named = os.environ.get(CLAIMS_ENV)
    folder = Path(named) if named else Path(tempfile.gettempdir()) / f"cptest-port-claims-{os.getuid()}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def port_base() -> int:
    """The first slot's main port: `CPTEST_PORT_BASE` when set, else `PORT_BASE`."""
    text = os.environ.get(BASE_ENV)
    if not text:
        return PORT_BASE
    try:
        base = int(text)
    except ValueError:
        raise RunError(f"{BASE_ENV}={text!r}: expected a port number") from None
    if not 1024 <= base <= 65535 - SLOT_STRIDE:
        raise RunError(f"{BASE_ENV}={base}: expected a port from 1024 to {65535 - SLOT_STRIDE}")
    return base


@dataclass
class Claim:
    """A held slot: its main and baseline ports, until `release` (or the process's exit)."""

    main: int
    baseline: int
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the file drops the flock
            self.fd = None


def ports_free(main: int, baseline: int) -> bool:
    """True when nothing listens on any port of the two blocks and a server could bind the main and
    the baseline port, the test preflight makes (`port_in_use`, unknown): a slot preflight would
    refuse is passed over here instead. The rest of a block is judged by listeners only: a client
    socket of another process may hold one of its ports for a moment (the OS hands out ephemeral
    ports in this range), and passing a slot over for that would scatter runs."""
    wanted = {p for first in (main, baseline) for p in range(first, min(first + PORT_BLOCK, 65536))}
    if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in wanted
           for c in psutil.net_connections(kind="tcp")):
        return False
    return server_can_bind("", main) and server_can_bind("", baseline)


def try_claim(main: int, baseline: int, folder: Path | None = None) -> Claim | None:
    """Claim the slot whose main port is `main`, or None when another process holds it or something
    listens on its ports."""
    path = (folder or claims_dir()) / f"slot-{main}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    claim = Claim(main, baseline, fd)
    if not ports_free(main, baseline):
        claim.release()
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a person looking; the lock decides
    return claim


def claim_slot(base: int | None = None, slots: int = SLOTS) -> Claim:
    """The first slot, from `base` up, that no process holds and whose ports are free. Raises
    RunError when every one of `slots` is taken."""
    first = port_base() if base is None else base
    folder = claims_dir()
    for slot in range(slots):
        main = first + SLOT_STRIDE * slot
        if main + SLOT_STRIDE > 65536:
            break
        claim = try_claim(main, main + PORT_BLOCK, folder)
        if claim is not None:
            return claim
    raise RunError(Problem(None, f"no free port slot: the {slots} slots from port {first} are claimed by "
                           "other cptest processes or in use",
                           hint="wait for a run to end, or name ports: --ports MAIN,BASELINE"))

