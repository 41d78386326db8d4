"""Specifications of cptest/contracts/capacity.py."""

from __future__ import annotations

from pathlib import Path

from cptest.checks import check_loaded, load_archive
from cptest.contracts import CapacityParams
from cptest.evidence import Capacity, KvPool, ServerInfo
from cptest.testing.archives import PINNED_LOG_PATTERNS, make_plan, rank_id, server_plan, write_archive

EXPECT = CapacityParams(multiplier=2, tolerance=0.0, log_patterns=PINNED_LOG_PATTERNS)


def _log(rows: int, logical: int) -> str:
    return (
        f"[2025-01-01 00:00:00 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {rows}, "
        "K size: 1.00 GB,"
        " V size: 1.00 GB\n"
        f"[2025-01-01 00:00:00 TP1] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {rows}, "
        "K size: 1.00 GB,"
        " V size: 1.00 GB\n"
        f"[2025-01-01 00:00:01 TP0] max_total_num_tokens={logical}, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, max_running_requests=64, context_len=8192, available_gpu_mem=10.00 GB\n"
    )


def _run(
    tmp_path: Path,
    *,
    sched: int = 2000,
    alloc: int | None = 2000,
    server: int | None = 2000,
    log: str | None = None,
):
    plan = make_plan(server_plan(world=2, dcp=2), [EXPECT])
    ranks = {
        w: [
            KvPool(rank=rank_id(w, dcp=2), rows=1000, allocator_size=alloc),
            Capacity(rank=rank_id(w, dcp=2), max_total_num_tokens=sched),
        ]
        for w in (0, 1)
    }
    runner = [ServerInfo(info={"max_total_num_tokens": server})] if server is not None else []
    write_archive(
        tmp_path,
        plan,
        ranks={"main": ranks},
        runner={"main": runner},
        logs={"main-node0.log": _log(1000, 2000) if log is None else log},
    )
    return check_loaded(load_archive(tmp_path)).verdicts[0]


def test_capacity_logical_equals_dcp_times_rows_on_every_surface_passes(tmp_path: Path) -> None:
    v = _run(tmp_path)
    assert v.status == "pass", v.reason
    assert v.figures["not_seen"] == []
    assert v.figures["log_kv_allocated"] == {"0": 1000, "1": 1000}
    assert v.figures["log_max_total_num_tokens"] == 2000


def test_capacity_per_rank_reported_as_logical_fails(tmp_path: Path) -> None:
    v = _run(tmp_path, sched=1000, server=1000, log=_log(1000, 1000))
    assert v.status == "fail"
    assert v.reason.startswith(
        "scheduler of rank 0 reports 1000 tokens, expected 2000 (= 1 x physical rows; declared 2 x)"
    )
    assert {m["surface"] for m in v.figures["mismatches"]} == {
        "scheduler",
        "server_info",
        "log max_total_num_tokens",
    }


def test_capacity_log_rows_disagreeing_with_the_probe_fail(tmp_path: Path) -> None:
    v = _run(tmp_path, log=_log(999, 2000))
    assert v.status == "fail" and v.figures["mismatches"][0]["surface"] == "log kv_allocated"


def test_capacity_without_server_info_is_unknown(tmp_path: Path) -> None:
    assert _run(tmp_path, server=None).status == "unknown"


def test_capacity_within_tolerance_passes(tmp_path: Path) -> None:
    plan_expect = EXPECT.model_copy(update={"multiplier": 2.0, "tolerance": 0.01})
    plan = make_plan(server_plan(world=1), [plan_expect])
    write_archive(
        tmp_path,
        plan,
        ranks={
            "main": {
                0: [KvPool(rank=rank_id(0), rows=1000), Capacity(rank=rank_id(0), max_total_num_tokens=1990)]
            }
        },
        runner={"main": [ServerInfo(info={"max_total_num_tokens": 1990})]},
    )
    v = check_loaded(load_archive(tmp_path)).verdicts[0]
    assert v.status == "pass", v.reason
    assert "allocator size of rank 0" in v.figures["not_seen"]


def test_capacity_missing_kv_pool_record_is_unknown(tmp_path: Path) -> None:
    plan = make_plan(server_plan(world=1), [EXPECT])
    write_archive(tmp_path, plan, ranks={"main": {0: [Capacity(rank=rank_id(0), max_total_num_tokens=1)]}})
    v = check_loaded(load_archive(tmp_path)).verdicts[0]
    assert (v.status, v.reason) == ("unknown", "no KvPool record from rank 0 of main")
