"""A cptest-like parent for teardown tests: owns a fake engine tree, then ends in the way asked.

`python parent_script.py <mode> <port> <pids file>`; mode: normal, exception, signal (waits for
SIGTERM/SIGINT with cptest's handlers), thread_crash (the supervisor's sampler thread crashes),
wait (waits forever; the test SIGKILLs it). The pids of the whole tree (with create times) are
written to the pids file once the tree is complete.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))

from conftest import fake_node  # noqa: E402

from cptest.outline import null_logger  # noqa: E402
from cptest.run.evidence_writer import RecordWriter  # noqa: E402
from cptest.run.process import ProcessLauncher, install_signal_handlers  # noqa: E402
from cptest.run.supervisor import GpuQueryUnavailable, GpuReading, Supervisor  # noqa: E402

EXPECTED = 1 + 2 * 2 + 1  # main, 2 schedulers with a helper each, one orphan


def no_gpu() -> GpuReading:
    raise GpuQueryUnavailable("no GPU in tests")


def settled_tree(list_pids: Callable[[], list[int]], deadline: float) -> dict[int, float]:
    """The whole tree with create times, once two listings 0.2 s apart agree.

    The orphan's double fork passes through a short-lived middle process: a listing taken while it
    lives already counts EXPECTED pids, and that pid is gone before its create time is read.
    """
    last: dict[int, float] = {}
    while time.monotonic() < deadline:
        now: dict[int, float] = {}
        for pid in list_pids():
            try:
                now[pid] = psutil.Process(pid).create_time()
            except psutil.NoSuchProcess:
                continue
        if len(now) >= EXPECTED and now == last:
            return now
        last = now
        time.sleep(0.2)
    raise SystemExit("tree never complete")


def main() -> None:
    mode, port, pids_file = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    install_signal_handlers()
    out = pids_file.parent
    writer = RecordWriter(out / "runner.jsonl")
    with Supervisor(ProcessLauncher(), log=null_logger(), gpu_query=no_gpu, sample_interval_s=0.1,
                    teardown_grace_s=1.0) as sup:
        owned = sup.start(fake_node(port, "--orphan"), out / "engine.log", {"test": out.name}, "main", writer)
        pids = settled_tree(owned.handle.pids, time.monotonic() + 20)
        tmp = pids_file.with_suffix(".tmp")  # whole or absent: the test reads it once it exists
        tmp.write_text(json.dumps(pids))
        tmp.replace(pids_file)
        if mode == "exception":
            raise RuntimeError("boom inside the run")
        if mode == "thread_crash":
            def crash() -> None:
                raise RuntimeError("sampler bug")
            sup._sample_hook = crash
            sup.start_sampling("main", writer)
            while True:
                sup.check()
                time.sleep(0.05)
        if mode in ("signal", "wait"):
            while True:
                time.sleep(0.1)


if __name__ == "__main__":
    main()
