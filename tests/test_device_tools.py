"""The GPU machine's measurement scripts (tools/device) read what the real probe writes.

They run only on the GPU machine, against SGLang; here their readers are fed rank files written by
the probe itself, so that a change of the probe's notes cannot silently blind them.
"""

from __future__ import annotations

import gc
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cptest.evidence import RankId
from cptest.probe.runtime import Probe

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "device" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_probe_windows_reads_the_probes_cost_and_collector_notes(tmp_path: Path) -> None:
    pw = _load("probe_windows")
    probe_dir = tmp_path / "probe-p0"
    p = Probe(probe_dir, switch=tmp_path / "switch")
    p.set_rank(RankId(world=0))
    p.watch_gc()
    try:
        for steps, probe_ns, span_ns in ((100, 2_000_000, 400_000_000), (90, 1_800_000, 360_000_000),
                                         (3, 10, 20)):  # the last: cut short by a switch
            p.cost = [probe_ns, steps, 1_000, 1_000 + span_ns]
            p._write_cost()
        gc.collect(2)
    finally:
        gc.callbacks.remove(p._on_gc)
    p.close()
    share = pw.engine_share(pw.probe_notes(probe_dir, "cost"))
    assert share is not None
    assert share["notes"] == 2 and share["steps"] == 190
    assert share["share"] == pytest.approx(3_800_000 / 760_000_000)
    assert share["ci95"][0] <= share["share"] <= share["ci95"][1]
    assert share["probe_us_per_step"] == pytest.approx(20.0)
    collections = pw.gc_collections(probe_dir)
    assert [c[1] for c in collections] == [2] and collections[0][2] >= 0


def test_fidelity_compares_the_clients_round_by_round() -> None:
    fid = _load("fidelity")
    runs = [{"client": "bench_serving", "x": 100.0}, {"client": "cptest", "x": 102.0},
            {"client": "cptest", "x": 95.0}, {"client": "bench_serving", "x": 100.0}]
    ratios = [fid._pair(runs[2 * i:2 * i + 2], "x") for i in range(2)]
    assert ratios == [pytest.approx(1.02), pytest.approx(0.95)]
    lo, hi = fid.bootstrap(ratios)
    assert 0.95 <= lo <= hi <= 1.02
