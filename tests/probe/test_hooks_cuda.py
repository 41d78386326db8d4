"""The probe's device copies on a real GPU: SGLang's thread does not wait, the record is right.

Runs where CUDA is (the GPU machine: `tools/device/probe-overhead.sh` runs it before measuring);
skipped elsewhere. The step's positions are made behind a ~0.3 s GPU spin, so a probe that waits
for them on the engine's thread (as `.tolist()` did) takes at least that long to return.
"""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from cptest.evidence import RankId, Step, read_records  # noqa: E402
from cptest.probe import hooks, runtime  # noqa: E402
from cptest.probe.copy_batches import COPY_EVERY  # noqa: E402
from cptest.probe.runtime import Probe  # noqa: E402

SPIN_CYCLES = 600_000_000  # torch.cuda._sleep: about 0.3 s at H200 clocks


def test_a_step_that_sends_a_batch_of_copies_returns_before_they_exist_and_all_are_recorded(
    tmp_path: Path,
) -> None:
    probe = Probe(tmp_path, copy_within_s=60.0)  # the batch closes at its steps, not at its time bound
    runtime.set_probe(probe)
    try:
        probe.set_rank(RankId(world=0))
        probe.cp_configured = False
        n = 64
        base = torch.arange(n, device="cuda")
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()  # SGLang runs forwards on its own stream too
        fb = types.SimpleNamespace(forward_mode=types.SimpleNamespace(name="DECODE"),
                                   rids=[f"r{i}" for i in range(n)], batch_size=n, input_ids=base,
                                   positions=None, extend_seq_lens_cpu=None, extend_prefix_lens_cpu=None)
        step_no = {"i": 0}

        def forward(_r: Any, b: Any) -> Any:
            step_no["i"] += 1
            if step_no["i"] % COPY_EVERY == 0:
                torch.cuda._sleep(SPIN_CYCLES)  # the GPU is busy; what follows is queued behind it
            b.positions = base * 3 + 1000 + step_no["i"]
            mask = b.positions % 2 == 0
            k = torch.zeros(n, 1, 8, device="cuda")
            hooks.after_set_kv_buffer(None, None, None, None, k, k, dcp_kv_mask=mask)
            return types.SimpleNamespace(can_run_graph=False)

        runner = types.SimpleNamespace(is_draft_worker=False)
        with torch.cuda.stream(stream):
            for _ in range(COPY_EVERY):  # first use: kernels load, the pinned pool grows
                hooks.around_model_runner_forward(forward, runner, fb)
            assert probe.flush(timeout=30)
            torch.cuda.synchronize()
            for _ in range(COPY_EVERY - 1):
                hooks.around_model_runner_forward(forward, runner, fb)
            t0 = time.perf_counter()
            hooks.around_model_runner_forward(forward, runner, fb)  # fills the batch and sends it
            returned_s = time.perf_counter() - t0
            spin_done = stream.query()
            # The engine's thread sends on the steps' stream, its current one: the copies queue
            # behind the step's kernels, and the current stream stays as SGLang set it.
            assert torch.cuda.current_stream() == stream
        assert probe.flush(timeout=30)
        torch.cuda.synchronize()
        assert returned_s < 0.05, f"the hooked step took {returned_s:.3f} s: it waited for the device"
        assert not spin_done, "the GPU finished before the step returned: the spin was too short to tell"
        steps = [r for r in read_records(tmp_path / "rank0.jsonl")[0] if isinstance(r, Step)]
        got = [s.step for s in steps]
        assert got == list(range(1, 2 * COPY_EVERY + 1)), (
            f"steps read back {got}; the file:\n" + (tmp_path / "rank0.jsonl").read_text()[:6000])
        for s in steps:
            want = [1000 + 3 * i + s.step for i in range(n)]
            assert s.seq_positions == {f"r{i}": [(p, p + 1)] for i, p in enumerate(want)}
            assert s.kv_written == {f"r{i}": [(p, p + 1)] if p % 2 == 0 else [] for i, p in enumerate(want)}
        print(f"the step that sent {COPY_EVERY} steps' copies returned in {returned_s * 1e3:.2f} ms "
              f"with the GPU still busy", file=sys.stderr)
    finally:
        runtime.set_probe(None)
        probe.close()
