"""Lifelines between the reference engine's ranks (cptest/reference/lifeline.py): a peer's death, by
any signal, stops the rank that sees it even while its main thread waits for ever; a stopped peer and
a normal end are no death."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cptest.reference.lifeline import GRACE_S, Lifelines

REPO = Path(__file__).resolve().parents[2]

RANK = """
import sys, threading
from cptest.reference.lifeline import Lifelines
rank, port = int(sys.argv[1]), sys.argv[2]
def exchange(box):
    if rank == 0:
        print(box[0], flush=True)  # rank 0's port, for the peer
        return box
    return [int(port)]
lifelines = Lifelines.join(rank, 2, "tcp://127.0.0.1:29500", exchange)
print("joined", flush=True)
if sys.stdin.readline().strip() == "end":  # the leader's exit message, then a normal exit
    lifelines.closing()
    sys.exit(0)
threading.Event().wait()  # a main thread that never returns, as a rank in a collective that hangs
"""


def _rank(rank: int, port: int | str = "-") -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(port)], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def _pair() -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
    leader = _rank(0)
    assert leader.stdout is not None
    follower = _rank(1, int(leader.stdout.readline()))
    assert follower.stdout is not None
    assert follower.stdout.readline().strip() == "joined"
    assert leader.stdout.readline().strip() == "joined"
    return leader, follower


def _end(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


@pytest.mark.parametrize("killed", [0, 1])
def test_a_killed_peer_stops_the_other_rank_with_status_1_and_says_why(killed: int) -> None:
    leader, follower = _pair()
    try:
        dead, seer = (leader, follower) if killed == 0 else (follower, leader)
        dead.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        assert seer.wait(timeout=GRACE_S + 20) == 1
        took = time.monotonic() - t0
        assert seer.stdout is not None
        said = seer.stdout.read()
        assert f"stopping: rank {killed}'s lifeline closed (that rank died)" in said
        assert took >= GRACE_S * 0.9  # it waited for an exit message that never came
    finally:
        _end(leader, follower)


def test_a_stopped_peer_is_no_death() -> None:
    leader, follower = _pair()
    try:
        follower.send_signal(signal.SIGSTOP)
        time.sleep(GRACE_S + 1.0)
        assert leader.poll() is None  # a SIGSTOP fault must not end the server
        follower.send_signal(signal.SIGCONT)
        follower.send_signal(signal.SIGKILL)
        assert leader.wait(timeout=GRACE_S + 20) == 1
    finally:
        _end(leader, follower)


def test_a_normal_end_is_no_death_when_the_exit_message_comes_within_the_grace() -> None:
    leader = _rank(0)
    assert leader.stdout is not None and leader.stdin is not None
    port = int(leader.stdout.readline())
    deaths: list[str] = []
    # This test process is the follower: it records a death instead of exiting.
    mine = Lifelines.join(1, 2, "tcp://127.0.0.1:29500", lambda box: [port], on_death=deaths.append)
    try:
        assert leader.stdout.readline().strip() == "joined"
        leader.stdin.write("end\n")
        leader.stdin.flush()
        assert leader.wait(timeout=20) == 0
        time.sleep(GRACE_S / 4)  # the leader is gone before this rank read its exit message
        mine.closing()
        time.sleep(GRACE_S + 0.5)
        assert deaths == []
    finally:
        _end(leader)


def test_without_the_exit_message_a_closed_lifeline_is_a_death() -> None:
    # The counterpart of the test above: the same normal exit of the leader, no `closing` here.
    leader = _rank(0)
    assert leader.stdout is not None and leader.stdin is not None
    port = int(leader.stdout.readline())
    seen = threading.Event()
    deaths: list[str] = []

    def record(line: str) -> None:
        deaths.append(line)
        seen.set()

    Lifelines.join(1, 2, "tcp://127.0.0.1:29500", lambda box: [port], on_death=record)
    try:
        assert leader.stdout.readline().strip() == "joined"
        leader.stdin.write("end\n")
        leader.stdin.flush()
        assert seen.wait(GRACE_S + 20)
        assert deaths == ["cptest-ref rank 1: stopping: rank 0's lifeline closed (that rank died)"]
    finally:
        _end(leader)
