"""Specification of cptest/run/supervisor.py: ownership, teardown of each, sampling."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from cptest.errors import RunError
from cptest.evidence import GpuSample, Lifecycle, ProbeNote, ProcessSample, read_records
from cptest.outline import Logger, TerminalSink
from cptest.plan.model import NodeLaunch
from cptest.run.evidence_writer import RecordWriter
from cptest.run.launcher import ExitInfo
from cptest.run.process import ProcessLauncher
from cptest.run.supervisor import (
    GpuQueryUnavailable,
    GpuReading,
    Supervisor,
    parse_gpu_memory,
    query_gpu_memory,
)

from conftest import fake_node, wait_until  # isort: skip


def no_gpu() -> GpuReading:
    raise GpuQueryUnavailable("nvidia-smi not found on PATH; GPU memory not sampled")


class StubHandle:
    def __init__(self, k: int) -> None:
        self.node = NodeLaunch(node_rank=k, gpu_ids=[], env={}, argv=["x"], port=1)
        self.log_path = Path("/dev/null")

    def main_pid(self) -> int:
        return 1000 + self.node.node_rank

    def pids(self) -> list[int]:
        return []

    def poll(self) -> int | None:
        return 0

    def send_signal(self, sig: int) -> None:
        pass


class FlakyLauncher:
    """Teardown of node 1 fails; node 0 must still be torn down."""

    name = "stub"

    def __init__(self) -> None:
        self.torn: list[int] = []

    def start(self, node: NodeLaunch, log_path: Path, labels: dict[str, str]) -> StubHandle:
        return StubHandle(node.node_rank)

    def teardown(self, handle: StubHandle, grace_s: float = 10.0) -> ExitInfo:
        if handle.node.node_rank == 1:
            raise OSError("docker daemon went away")
        self.torn.append(handle.node.node_rank)
        return ExitInfo(0)

    def sweep(self, labels: dict[str, str]) -> list[str]:
        return []


def test_nvidia_smi_csv_is_parsed_per_gpu() -> None:
    assert parse_gpu_memory("0, 1234\n1, 5\n\nNo devices were found\n") == {"0": 1234, "1": 5}


def test_an_absent_nvidia_smi_is_unavailable_not_an_error() -> None:
    with pytest.raises(GpuQueryUnavailable, match="not found"):
        query_gpu_memory(["no-such-nvidia-smi", "--query-gpu=index"])


def test_exit_tears_down_every_handle_even_when_one_teardown_fails(tmp_path: Path) -> None:
    out = io.StringIO()
    launcher = FlakyLauncher()
    writer = RecordWriter(tmp_path / "r.jsonl")
    with Supervisor(launcher, log=Logger([TerminalSink(out)]), gpu_query=no_gpu) as sup:
        for k in range(3):
            sup.start(NodeLaunch(node_rank=k, gpu_ids=[], env={}, argv=["x"], port=1), tmp_path / "l", {},
                      "main", writer)
    assert sorted(launcher.torn) == [0, 2]
    assert "error during teardown of main node 1 (pid 1001): docker daemon went away" in out.getvalue()
    events = [r.event for r in read_records(tmp_path / "r.jsonl")[0] if isinstance(r, Lifecycle)]
    assert events.count("launched") == 3 and events.count("teardown") == 2


def test_samples_record_the_tree_with_titles_and_a_note_when_gpus_cannot_be_read(tmp_path: Path,
                                                                                 port: int) -> None:
    writer = RecordWriter(tmp_path / "r.jsonl")
    with Supervisor(ProcessLauncher(), gpu_query=no_gpu) as sup:
        owned = sup.start(fake_node(port), tmp_path / "engine.log", {}, "main", writer)
        wait_until(lambda: len(owned.handle.pids()) >= 5, 20, "the fake tree")
        sup.sample("before", "main", writer, host=True)
        sup.sample("running", "main", writer)
    records = read_records(tmp_path / "r.jsonl")[0]
    samples = [r for r in records if isinstance(r, ProcessSample)]
    assert [s.phase for s in samples] == ["before", "running"]
    titles = {p["title"] for p in samples[0].procs}
    assert {"sglang::scheduler_TP0", "sglang::scheduler_TP1"} <= titles
    assert {"pid", "ppid", "name", "status", "rss"} <= set(samples[0].procs[0])
    notes = [r for r in records if isinstance(r, ProbeNote)]
    assert len(notes) == 1 and "nvidia-smi" in notes[0].message  # once, not per sample
    assert not [r for r in records if isinstance(r, GpuSample)]
    teardown = [r for r in records if isinstance(r, Lifecycle) and r.event == "teardown"]
    assert teardown[0].detail["leftover_pids"] == []


def test_gpu_memory_is_sampled_when_readable(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path / "r.jsonl")
    with Supervisor(FlakyLauncher(), gpu_query=lambda: GpuReading({"0": 10})) as sup:
        assert sup.sample("before", "main", writer) == GpuReading({"0": 10})
    (gpu,) = [r for r in read_records(tmp_path / "r.jsonl")[0] if isinstance(r, GpuSample)]
    assert gpu.used_mib == {"0": 10} and gpu.phase == "before"


def test_periodic_sampling_runs_until_stopped(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path / "r.jsonl")
    with Supervisor(FlakyLauncher(), gpu_query=no_gpu, sample_interval_s=0.05) as sup:
        sup.start_sampling("main", writer)
        time.sleep(0.4)
        sup.stop_sampling()
        n = len(read_records(tmp_path / "r.jsonl")[0])
        time.sleep(0.2)
        assert len(read_records(tmp_path / "r.jsonl")[0]) == n
    assert n >= 4


def test_a_crashed_sampler_thread_surfaces_on_the_main_thread(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path / "r.jsonl")
    with Supervisor(FlakyLauncher(), gpu_query=no_gpu, sample_interval_s=0.02) as sup:
        def crash() -> None:
            raise RuntimeError("psutil bug")

        sup._sample_hook = crash
        sup.start_sampling("main", writer)
        wait_until(lambda: sup.thread_error is not None, 5, "the crash")
        with pytest.raises(RunError, match="sampler thread crashed: RuntimeError: psutil bug"):
            sup.check()
