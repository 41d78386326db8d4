"""cptest/run/gpu.py and the supervisor's per-process GPU figures: whose memory is whose.

NVML itself needs a GPU (tools/device/nvml-check.py is the real test, on the GPU machine: see
results/_suite-check). Here: how its answers are summed, and how the supervisor sorts real
processes into this run's and others' (real process trees, real sessions, real reapers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from conftest import fake_node, wait_until  # isort: skip

from cptest.evidence import GpuSample, read_records
from cptest.run.evidence_writer import RecordWriter
from cptest.run.gpu import MIB, GpuReading, nvml_reading
from cptest.run.process import ProcessLauncher
from cptest.run.supervisor import Supervisor, gpu_settled


def test_nvml_answers_are_summed_per_process_and_device() -> None:
    procs = {0: [SimpleNamespace(pid=7, usedGpuMemory=100 * MIB),
                 SimpleNamespace(pid=7, usedGpuMemory=20 * MIB)],
             1: [SimpleNamespace(pid=8, usedGpuMemory=None)]}  # the driver would not say
    nvml = SimpleNamespace(
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=(500 + h) * MIB),
        nvmlDeviceGetComputeRunningProcesses=lambda h: procs[h])
    assert nvml_reading(nvml) == GpuReading({"0": 500, "1": 501}, {"0": {7: 120}, "1": {8: 0}})


def test_memory_of_this_runs_tree_is_ours_and_a_strangers_is_not(tmp_path: Path, port: int) -> None:
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    writer = RecordWriter(tmp_path / "r.jsonl")
    try:
        held: dict[int, int] = {}
        reading = lambda: GpuReading({"0": 900}, {"0": dict(held)})  # noqa: E731
        with Supervisor(ProcessLauncher(), gpu_query=reading) as sup:
            owned = sup.start(fake_node(port), tmp_path / "engine.log", {"cptest.run": "r1"}, "main", writer)
            wait_until(lambda: len(owned.handle.pids()) >= 2, 20, "the fake tree")
            child = owned.handle.pids()[-1]
            held.update({child: 300, stranger.pid: 600})
            sup.sample_gpu("running", "main", writer)
            before = sup.gpu_query()
            assert not gpu_settled(sup, before)(False)  # our child still holds memory
            del held[child]
            assert gpu_settled(sup, before)(False)  # only the stranger's is left: ours is released
        (sample,) = [r for r in read_records(tmp_path / "r.jsonl")[0] if isinstance(r, GpuSample)]
        assert {(p.pid, p.ours) for p in sample.processes} == {(child, True), (stranger.pid, False)}
        assert sample.ours_mib() == {"0": 300}
    finally:
        stranger.kill()
        stranger.wait()
