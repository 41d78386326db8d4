"""Whose is an engine process another cptest run has just started, before its reaper exists?

Seen in a real run (a rerun beside two other reference runs, 2026-12-01): the "after" process sample
listed a `cptest-ref::server` that another `cptest run` had started a moment earlier as `host`, and
the shutdown contract failed on an orphan that was not this run's. Its parent, alive and another
cptest command, says whose it is.
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from cptest.run.supervisor import child_of_another_cptest

# A parent whose command line is that of a `cptest` command (`python -m cptest ...`), with one child.
PARENT = ("import subprocess, sys, time;"
          "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
          "print(c.pid, flush=True); time.sleep(60)")


def _parent_and_child() -> tuple[subprocess.Popen[str], int]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, "-m", "cptest", "run"], stdout=subprocess.PIPE,
                              text=True)
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


def test_the_child_of_another_cptest_command_is_foreign_until_its_parent_is_gone() -> None:
    parent, child = _parent_and_child()
    try:
        assert child_of_another_cptest(child)
        # The same process seen by the run that owns its parent is not foreign to it.
        assert not child_of_another_cptest(child, {parent.pid})
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while psutil.Process(child).ppid() == parent.pid and time.monotonic() < deadline:
            time.sleep(0.05)
        # Orphaned: nobody's child any more, so an orphan check must account for it.
        assert not child_of_another_cptest(child)
    finally:
        psutil.Process(child).kill()


def test_a_child_of_this_process_or_of_a_plain_program_is_not_foreign() -> None:
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    plain = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert plain.stdout is not None
    grandchild = int(plain.stdout.readline())
    try:
        assert not child_of_another_cptest(mine.pid)
        assert not child_of_another_cptest(grandchild)  # its parent is not a cptest command
    finally:
        for p in (mine, plain):
            p.kill()
            p.wait()
        psutil.Process(grandchild).kill()
