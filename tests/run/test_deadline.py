"""The plan's deadline bounds a whole run: when it passes, the runner tears everything down and the run
is unknown (RunError, exit 3), like a SIGTERM to cptest."""

from __future__ import annotations

import io
import signal
import time
from pathlib import Path

import pytest

from cptest.errors import RunError
from cptest.evidence import Lifecycle, read_records
from cptest.outline import Logger, TerminalSink
from cptest.run.process import ProcessLauncher
from cptest.run.runner import RunOptions, run_plan
from cptest.run.supervisor import GpuQueryUnavailable, GpuReading

from conftest import alive, fake_server, free_port, make_plan  # isort: skip


def no_gpu() -> GpuReading:
    raise GpuQueryUnavailable("nvidia-smi not found on PATH; GPU memory not sampled")


def test_a_run_past_its_deadline_is_torn_down_and_unknown(tmp_path: Path) -> None:
    plan = make_plan(fake_server("main", free_port(), "--ready-after", "100", ready_timeout_s=60.0))
    plan = plan.model_copy(update={"deadline_s": 2.0})
    t0 = time.monotonic()
    with pytest.raises(RunError) as info:
        run_plan(plan, tmp_path / "a", launcher=ProcessLauncher(), log=Logger([TerminalSink(io.StringIO())]),
                 options=RunOptions(sample_interval_s=0.2, gpu_query=no_gpu, ready_poll_s=0.1))
    assert time.monotonic() - t0 < 30
    assert info.value.exit_code == 3 and "deadline of 2 s was reached" in str(info.value)
    records = read_records(tmp_path / "a" / "evidence" / "main" / "runner.jsonl")[0]
    evs = [r for r in records if isinstance(r, Lifecycle)]
    assert [e.event for e in evs][-2:] == ["interrupted", "teardown"]
    assert evs[-2].detail == {"reason": "deadline"} and evs[-1].detail["leftover_pids"] == []
    pids = [e.detail["pid"] for e in evs if e.event == "launched" and "pid" in e.detail]
    assert alive(pids) == []
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # disarmed
