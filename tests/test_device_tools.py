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
from typing import Any

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


def test_probe_windows_adds_the_writer_threads_rounds_as_an_upper_bound(tmp_path: Path) -> None:
    """D69: the writer may finish batches; its CPU (`writer_ns`, the notes' 11th field) is reported
    per step and added to the engine's share for a figure comparable with the notes before it."""
    pw = _load("probe_windows")
    probe_dir = tmp_path / "probe-p0"
    p = Probe(probe_dir, switch=tmp_path / "switch")
    p.set_rank(RankId(world=0))
    for steps, probe_ns, writer_ns in ((100, 2_000_000, 500_000), (100, 1_000_000, 1_500_000)):
        p.cost = [probe_ns, steps, 1_000, 1_000 + 100_000_000, 0, 0, 0, 0, 0, 0, writer_ns]
        p._write_cost()
    p.close()
    share = pw.engine_share(pw.probe_notes(probe_dir, "cost"))
    assert share is not None
    assert share["share"] == pytest.approx(3_000_000 / 200_000_000)
    assert share["writer_us_per_step"] == pytest.approx(10.0)
    assert share["share_with_writer"] == pytest.approx(5_000_000 / 200_000_000)


def test_probe_windows_adds_the_pool_hook_to_the_engine_threads_whole_share(tmp_path: Path) -> None:
    """D73: the pool hook runs on the engine's thread outside the forward (the notes' 12th field);
    the whole share adds it to the forward hooks' time, with its own interval."""
    pw = _load("probe_windows")
    probe_dir = tmp_path / "probe-p0"
    p = Probe(probe_dir, switch=tmp_path / "switch")
    p.set_rank(RankId(world=0))
    for steps, probe_ns, pool_ns in ((100, 2_000_000, 400_000), (100, 1_000_000, 200_000)):
        p.cost = [probe_ns, steps, 1_000, 1_000 + 100_000_000, 0, 0, 0, 0, 0, 0, 0, pool_ns]
        p._write_cost()
    p.close()
    share = pw.engine_share(pw.probe_notes(probe_dir, "cost"))
    assert share is not None
    assert share["share"] == pytest.approx(3_000_000 / 200_000_000)  # the forward hooks alone, as before
    assert share["pool_us_per_step"] == pytest.approx(3.0)
    whole = share["engine_all"]
    assert whole["share"] == pytest.approx(3_600_000 / 200_000_000)
    assert whole["us_per_step"] == pytest.approx(18.0)
    assert whole["ci95"][0] <= whole["share"] <= whole["ci95"][1]


def test_probe_windows_splits_the_pool_hooks_and_the_writers_time(tmp_path: Path) -> None:
    """D73: busy iterations that returned early vs those that read the pools, and the writer's
    rounds by phase, per step (the notes' 13th to 18th fields)."""
    pw = _load("probe_windows")
    probe_dir = tmp_path / "probe-p0"
    p = Probe(probe_dir, switch=tmp_path / "switch")
    p.set_rank(RankId(world=0))
    # 100 steps: 100 busy iterations, 25 of them read the pools (1_000_000 of the 1_300_000 ns)
    p.cost = [2_000_000, 100, 1_000, 1_000 + 100_000_000, 0, 0, 0, 0, 0, 0, 600_000, 1_300_000, 100,
              1_000_000, 25, 100_000, 300_000, 200_000]
    p._write_cost()
    p.close()
    share = pw.engine_share(pw.probe_notes(probe_dir, "cost") * 2)  # two notes alike: an interval
    assert share is not None
    split = share["pool_split"]
    assert split["busy_calls_per_step"] == pytest.approx(1.0)
    assert split["us_per_early_return"] == pytest.approx(4.0)  # 300_000 ns over 75 early returns
    assert split["us_per_read"] == pytest.approx(40.0)
    assert split["reads_per_step"] == pytest.approx(0.25)
    assert share["writer_us_per_step_by_phase"] == {
        "sends_and_polls": pytest.approx(1.0), "finishing": pytest.approx(3.0), "lines": pytest.approx(2.0)}


def test_probe_windows_splits_the_copy_batches_finishing_by_phase(tmp_path: Path) -> None:
    """The 22nd to 24th fields: the finishing's lines, write and giving back, per step; notes without
    them give no split."""
    pw = _load("probe_windows")
    probe_dir = tmp_path / "probe-p0"
    p = Probe(probe_dir, switch=tmp_path / "switch")
    p.set_rank(RankId(world=0))
    for _ in range(2):
        p.cost = [2_000_000, 100, 1_000, 1_000 + 100_000_000, 900_000, 0, 0, 0, 0, 0, 0, 400_000, 100,
                  0, 0, 0, 0, 0, 100_000, 0, 0, 300_000, 200_000, 100_000]
        p._write_cost()
    p.close()
    share = pw.engine_share(pw.probe_notes(probe_dir, "cost"))
    assert share is not None
    assert share["finishing_us_per_step_by_phase"] == {
        "lines": pytest.approx(3.0), "write": pytest.approx(2.0), "give_back": pytest.approx(1.0)}
    older = tmp_path / "probe-p1"
    q = Probe(older, switch=tmp_path / "switch")
    q.set_rank(RankId(world=0))
    for _ in range(2):
        q.cost = [2_000_000, 100, 1_000, 1_000 + 100_000_000, 0, 0, 0, 0, 0, 0, 0, 400_000, 100,
                  0, 0, 0, 0, 0, 100_000, 500_000, 0]
        q._write_cost()
    q.close()
    older_share = pw.engine_share(pw.probe_notes(older, "cost"))
    assert older_share is not None and "finishing_us_per_step_by_phase" not in older_share


def test_probe_windows_adds_the_chores_and_the_inner_hooks_to_the_whole_share(tmp_path: Path) -> None:
    """D114: the chores (19th field) and the inner hooks (20th) run on the engine's thread outside
    both hooks' figures; the whole share adds them."""
    pw = _load("probe_windows")
    probe_dir = tmp_path / "probe-p0"
    p = Probe(probe_dir, switch=tmp_path / "switch")
    p.set_rank(RankId(world=0))
    for steps, probe_ns in ((100, 2_000_000), (100, 1_000_000)):
        p.cost = [probe_ns, steps, 1_000, 1_000 + 100_000_000, 0, 0, 0, 0, 0, 0, 0, 400_000, 100,
                  0, 0, 0, 0, 0, 100_000, 500_000]
        p._write_cost()
    p.close()
    share = pw.engine_share(pw.probe_notes(probe_dir, "cost"))
    assert share is not None
    assert share["chores_us_per_step"] == pytest.approx(1.0)
    assert share["inner_us_per_step"] == pytest.approx(5.0)
    whole = share["engine_all"]
    assert whole["share"] == pytest.approx((3_000_000 + 800_000 + 200_000 + 1_000_000) / 200_000_000)
    assert whole["us_per_step"] == pytest.approx(25.0)


def test_probe_windows_gives_the_share_an_evidence_run_pays_without_the_measurings_own_work(
        tmp_path: Path) -> None:
    """The chores' time (19th field) holds the measuring's own work (21st: the switch's stat, the
    collector's and the cost notes), which an evidence run does not do: the evidence share takes it
    out of the whole one, with its own interval; notes without the field give none."""
    pw = _load("probe_windows")
    probe_dir = tmp_path / "probe-p0"
    p = Probe(probe_dir, switch=tmp_path / "switch")
    p.set_rank(RankId(world=0))
    for steps, probe_ns, measuring_ns in ((100, 2_000_000, 60_000), (100, 1_000_000, 40_000)):
        p.cost = [probe_ns, steps, 1_000, 1_000 + 100_000_000, 0, 0, 0, 0, 0, 0, 0, 400_000, 100,
                  0, 0, 0, 0, 0, 100_000, 500_000, measuring_ns]
        p._write_cost()
    p.close()
    share = pw.engine_share(pw.probe_notes(probe_dir, "cost"))
    assert share is not None
    assert share["measuring_us_per_step"] == pytest.approx(0.5)
    whole, evidence = share["engine_all"], share["engine_evidence"]
    assert whole["share"] == pytest.approx(5_000_000 / 200_000_000)
    assert evidence["share"] == pytest.approx(4_900_000 / 200_000_000)
    assert evidence["us_per_step"] == pytest.approx(24.5)
    assert evidence["ci95"][0] <= evidence["share"] <= evidence["ci95"][1]
    older = tmp_path / "probe-p1"
    q = Probe(older, switch=tmp_path / "switch")
    q.set_rank(RankId(world=0))
    for _ in range(2):
        q.cost = [2_000_000, 100, 1_000, 1_000 + 100_000_000, 0, 0, 0, 0, 0, 0, 0, 400_000, 100,
                  0, 0, 0, 0, 0, 100_000, 500_000]
        q._write_cost()
    q.close()
    older_share = pw.engine_share(pw.probe_notes(older, "cost"))
    assert older_share is not None and "engine_evidence" not in older_share


def test_probe_windows_says_whether_every_server_meets_the_target_with_its_interval(tmp_path: Path) -> None:
    """The target is judged on the upper bound of the share an evidence run pays: a mean below it
    is not enough, and a server whose notes cannot say leaves the verdict unknown."""
    pw = _load("probe_windows")

    def server(name: str, probe_ns: list[int]) -> dict[str, Any]:
        d = tmp_path / f"probe-{name}"
        p = Probe(d, switch=tmp_path / "switch")
        p.set_rank(RankId(world=0))
        for ns in probe_ns:  # each note: 100 steps over 100 ms
            p.cost = [ns, 100, 1_000, 1_000 + 100_000_000, 0, 0, 0, 0, 0, 0, 0, 0, 100,
                      0, 0, 0, 0, 0, 0, 0, 0]
            p._write_cost()
        p.close()
        return pw.engine_share(pw.probe_notes(d, "cost"))

    low = server("low", [500_000, 600_000, 700_000])
    across = server("across", [600_000, 1_300_000])  # its mean is under 1 %, its upper bound is not
    assert across["engine_evidence"]["share"] < pw.TARGET_SHARE < across["engine_evidence"]["ci95"][1]
    assert low["engine_evidence"]["within_target"] is True
    assert across["engine_evidence"]["within_target"] is False
    assert pw.target_met([low]) is True
    assert pw.target_met([low, across]) is False
    assert pw.target_met([low, None]) is None


def test_the_chores_time_the_measurings_own_work_apart(tmp_path: Path) -> None:
    """A measuring probe's chores put the switch's stat and the notes into the 21st field as well as
    the 19th; a probe that does not measure times neither."""
    p = Probe(tmp_path / "probe", switch=tmp_path / "switch")
    p.set_rank(RankId(world=0))
    p.timing = True
    p.chores(p.clock())
    assert 0 < p.cost[20] <= p.cost[18]
    p.timing = False
    p.cost = [0] * len(p.cost)
    p.chores(p.clock())
    assert p.cost[18] == p.cost[20] == 0
    p.close()


def test_fidelity_compares_the_clients_round_by_round() -> None:
    fid = _load("fidelity")
    runs = [{"client": "bench_serving", "x": 100.0}, {"client": "cptest", "x": 102.0},
            {"client": "cptest", "x": 95.0}, {"client": "bench_serving", "x": 100.0}]
    ratios = [fid._pair(runs[2 * i:2 * i + 2], "x") for i in range(2)]
    assert ratios == [pytest.approx(1.02), pytest.approx(0.95)]
    lo, hi = fid.bootstrap(ratios)
    assert 0.95 <= lo <= hi <= 1.02


def test_paired_rounds_give_each_client_both_halves_and_both_cpu_sets() -> None:
    fid = _load("fidelity")
    plan = [fid.assignment(i) for i in range(8)]
    for k in range(0, 8, 2):  # a pair of rounds: cptest's client sends both halves
        assert {plan[k][0], plan[k + 1][0]} == {0, 1}
    for k in range(0, 8, 4):  # two pairs: each half through each CPU set
        assert sorted(plan[k:k + 4]) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def _run(client: str, i: int, ttfts: list[float], tokens: int, seconds: float) -> dict[str, object]:
    return {"client": client, "round": i, "ttfts_ms": ttfts, "output_tokens": tokens, "duration_s": seconds,
            "lag": {"samples": 10, "p99_ms": 1.0 + i, "max_ms": 2.0 + i}}


def test_paired_summary_pools_each_pair_of_rounds() -> None:
    fid = _load("fidelity")
    runs = [_run("cptest", 0, [10.0, 12.0], 100, 1.0), _run("bench_serving", 0, [10.0, 10.0], 100, 1.0),
            _run("cptest", 1, [14.0, 16.0], 100, 1.0), _run("bench_serving", 1, [12.0, 14.0], 100, 2.0),
            # an unfinished pair (a deadline or a failure) counts as rounds, not as a pair
            _run("cptest", 2, [10.0], 10, 1.0), _run("bench_serving", 2, [20.0], 10, 1.0),
            {"client": "cptest", "round": 3, "error": "ClientError: refused"}]
    s = fid.paired_summary(runs)
    assert s["pairs"] == 1 and s["rounds"] == 3
    # pooled over the pair: cptest's median of [10, 12, 14, 16] = 13 over bench's of [10, 10, 12, 14] = 11
    assert s["pair:median_ttft_ms"]["ratios"] == [pytest.approx(13 / 11)]
    assert s["pair:mean_ttft_ms"]["ratios"] == [pytest.approx(13 / 11.5)]
    assert s["pair:output_throughput"]["ratios"] == [pytest.approx((200 / 2.0) / (200 / 3.0))]
    assert s["round:median_ttft_ms"]["ratios"] == [pytest.approx(r) for r in (1.1, 15 / 13, 0.5)]
    assert s["lag_p99_ms_median"] == {"cptest": 2.0, "bench_serving": 2.0}
    assert s["lag_max_ms_max"] == {"cptest": 4.0, "bench_serving": 4.0}


def test_pooled_calls_keep_each_pair_inside_its_call() -> None:
    fid = _load("fidelity")
    a = [_run("cptest", 0, [10.0], 100, 1.0), _run("bench_serving", 0, [10.0], 100, 1.0),
         _run("cptest", 1, [10.0], 100, 1.0), _run("bench_serving", 1, [10.0], 100, 1.0),
         _run("cptest", 2, [30.0], 100, 1.0), _run("bench_serving", 2, [10.0], 100, 1.0)]  # unpaired
    b = [_run("cptest", 0, [20.0], 100, 1.0), _run("bench_serving", 0, [10.0], 100, 1.0),
         _run("cptest", 1, [20.0], 100, 1.0), _run("bench_serving", 1, [10.0], 100, 1.0)]
    s = fid.pool_paired([{"against": "bench_serving", "runs": a}, {"against": "bench_serving", "runs": b}])
    assert s["pairs"] == 2 and s["calls"] == 2
    # call a's round 2 stays unpaired rather than pairing with call b's round 0
    assert s["pair:median_ttft_ms"]["ratios"] == [pytest.approx(1.0), pytest.approx(2.0)]
    with pytest.raises(SystemExit):
        fid.pool_paired([{"against": "bench_serving", "runs": a}, {"against": "cptest-control", "runs": b}])


def test_lag_summary_reads_quantiles_in_milliseconds() -> None:
    fid = _load("fidelity")
    s = fid.lag_summary([0.0001 * k for k in range(1, 101)])  # 0.1 .. 10 ms
    assert s["samples"] == 100 and s["max_ms"] == pytest.approx(10.0)
    assert s["p50_ms"] == pytest.approx(5.1) and s["over_1ms"] == 90
    assert fid.lag_summary([]) == {"samples": 0}


def test_phase_summary_reads_each_phase_from_its_two_marks() -> None:
    fid = _load("fidelity")
    rows = [{"start": 0.0, "conn": 0.001, "headers_sent": 0.0011, "body_sent": 0.0013, "response": 0.0093,
             "first": 0.0493},
            {"start": 1.0, "conn": 1.003, "headers_sent": 1.0031, "body_sent": 1.0033, "response": 1.0113},
            ]  # the second request's first bytes were never seen: its later phases are left out
    s = fid.phase_summary(rows)
    assert s["requests"] == 2
    assert s["connect"]["p50"] == pytest.approx(2.0)  # median of 1 and 3 ms
    assert s["server_headers"]["p50"] == pytest.approx(8.0)
    assert s["to_first_chunk"] == {"p50": pytest.approx(40.0), "p90": pytest.approx(40.0)}
    assert s["start_to_first_chunk"]["p50"] == pytest.approx(49.3)


def _empty_wheel(folder: Path) -> None:
    """A valid wheel with nothing in it: what probe-bench.sh installs beside the machine's torch
    (pydantic and its kin there; here the test's environment has them already)."""
    import zipfile

    folder.mkdir()
    info = "nothing-1.0.dist-info"
    with zipfile.ZipFile(folder / "nothing-1.0-py3-none-any.whl", "w") as z:
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: nothing\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")


def test_probe_bench_runs_every_configuration_with_every_bound_and_says_which(tmp_path: Path) -> None:
    import os
    import subprocess

    _empty_wheel(tmp_path / "wheels")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SITE": str(tmp_path / "site"), "DEVICE": "cpu",
           "BENCH_WHEELS": str(tmp_path / "wheels"), "COMMIT": "abc1234",
           "CONFIGS": "--graphs --steps 150\n--steps 100", "BOUNDS": "16 0.15\n64 0.5"}
    done = subprocess.run(["bash", str(ROOT / "tools" / "device" / "probe-bench.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    text = (tmp_path / "out" / "bench.txt").read_text()
    heads = [line for line in text.splitlines() if line.startswith("== ")]
    configs, bounds = ("--graphs --steps 150", "--steps 100"), (("16", "0.15"), ("64", "0.5"))
    assert heads == [f"== --layers 4 --batch 64 --device cpu --pool {c} --copy-every {n} --copy-within-s {s}"
                     for c in configs for n, s in bounds]
    assert text.count("the probe's whole time on the engine thread") == 4
    assert "commit abc1234" in (tmp_path / "out" / "manifest.txt").read_text()
