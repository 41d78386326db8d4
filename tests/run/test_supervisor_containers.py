"""A stray engine process inside a container (another pid namespace than cptest's) is another run's,
never an orphan of this one: two docker runs at once (a suite's) must not fail each other's
`shutdown no_orphans`. The docker launcher starts no reaper and its containers carry no label in
their environment; what makes a stray this run's is its session (cptest/run/supervisor.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cptest.evidence import ProcessSample, read_records
from cptest.run.evidence_writer import RecordWriter
from cptest.run.supervisor import GpuQueryUnavailable, GpuReading, Supervisor

TITLE = "cptest-contained::"


def no_gpu() -> GpuReading:
    raise GpuQueryUnavailable("no GPU here")


class NoLauncher:
    name = "none"


@pytest.fixture
def contained() -> Iterator[int]:
    """Host pid of a process titled like an engine in its own pid namespace, as a container's is."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare to make a pid namespace")
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "bash", "-c",
                              f"exec -a {TITLE}server sleep 60"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            kids = [p for p in psutil.Process(outer.pid).children() if p.cmdline()[:1] == [f"{TITLE}server"]]
            if kids:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the namespaced process did not start")
        yield kids[0].pid
    finally:
        outer.kill()
        outer.wait()


def test_a_stray_engine_process_in_a_container_is_sampled_as_foreign_not_as_an_orphan(contained: int,
                                                                                      tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path / "runner.jsonl")
    sup = Supervisor(NoLauncher(), gpu_query=no_gpu, title_prefix=TITLE)  # type: ignore[arg-type]
    sup.sample("after", "main", writer, host=True)
    writer.close()
    assert os.readlink(f"/proc/{contained}/ns/pid") != os.readlink("/proc/self/ns/pid")
    [sample] = [r for r in read_records(tmp_path / "runner.jsonl")[0] if isinstance(r, ProcessSample)]
    assert [(p["pid"], p["scope"]) for p in sample.procs] == [(contained, "foreign")]
