"""Specification of cptest/contracts/capacity_adapter.py: the statement in the language, the checker on
hand-built pool and capacity records, and the checker on published SGLang archives through `cptest
check`'s own path."""

from __future__ import annotations

from pathlib import Path

import pytest

from cptest.checks import check_loaded, load_archive
from cptest.contracts import CONTRACTS
from cptest.contracts.capacity_adapter import CapacityAdapterParams, check
from cptest.evidence import Capacity, KvPool, RequestResult, ServerInfo
from cptest.lang import format_text, parse_text
from cptest.testing.archives import PINNED_LOG_PATTERNS, make_plan, rank_id, server_plan, write_archive

ROOT = Path(__file__).resolve().parents[2]
TEXT = """cptest 1
scenario t {
  engine reference
  model synthetic llama { layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 vocab 128 intermediate 128 }
  topology { gpus 2 tp 2 dcp 2 }
  workload { requests 8 concurrency 2 prompt_tokens 16 output_tokens 4 }
  expect { {expect} }
}
"""
EXPECT = CapacityAdapterParams(dcp=2, log_patterns=PINNED_LOG_PATTERNS)


def _log(logical: int) -> str:
    return (f"[2025-01-01 00:00:01 TP0] max_total_num_tokens={logical}, chunked_prefill_size=8192, "
            "max_prefill_tokens=16384, max_running_requests=64, context_len=8192, "
            "available_gpu_mem=10.00 GB\n")


def _run(tmp_path: Path, *, sched: tuple[int, int] = (1000, 1000), alloc: int | None = 2000,
         server: int | None = 1000, log: int | None = 1000, page: tuple[int, int | None] = (1, 2),
         served: int = 0):
    plan = make_plan(server_plan(world=2, dcp=2), [EXPECT])
    ranks = {
        w: [KvPool(rank=rank_id(w, dcp=2), rows=1000, allocator_size=alloc, page_size=page[0],
                   allocator_page_size=page[1]),
            Capacity(rank=rank_id(w, dcp=2), max_total_num_tokens=sched[w], context_len=1500)]
        for w in (0, 1)
    }
    runner: list = [ServerInfo(info={"max_total_num_tokens": server})] if server is not None else []
    if served:
        runner.append(RequestResult(index=0, prompt_len=served - 2, max_new_tokens=2, prompt_sha256="x",
                                    status="ok", output_ids=[1, 2]))
    write_archive(tmp_path, plan, ranks={"main": ranks}, runner={"main": runner},
                  logs={"main-node0.log": _log(log) if log is not None else "started\n"})
    return check_loaded(load_archive(tmp_path)).verdicts[0]


# ------------------------------------------------------------------------------------ language
def test_the_statement_parses_formats_back_and_comes_after_capacity_in_the_registry() -> None:
    text = TEXT.replace("{expect}", "capacity adapter   capacity logical == 2 * physical")
    out = format_text(text, "t.cps")
    assert "    capacity logical == 2 * physical\n    capacity adapter\n" in out
    assert parse_text(out, "t.cps") == parse_text(text, "t.cps")
    names = list(CONTRACTS)
    assert names.index("capacity") < names.index("capacity_adapter") < names.index("capacity_transitions")


def test_a_scenario_without_it_keeps_its_value() -> None:
    assert "capacity_adapter" not in parse_text(TEXT.replace("{expect}", "serving all_complete"), "t.cps") \
        .expect.model_dump()


# ------------------------------------------------------------------------------------ checker
def test_a_per_rank_report_is_translated_by_dcp_and_passes(tmp_path: Path) -> None:
    v = _run(tmp_path)
    assert v.status == "pass", v.reason
    assert v.figures["translation"] == 2 and v.figures["not_seen"] == []
    assert "reports each rank's rows: an adapter multiplies by dcp 2 (1000 -> 2000" in v.reason
    assert "pages of 2 tokens = page_size 1 x dcp 2" in v.reason


def test_a_logical_report_needs_no_translation(tmp_path: Path) -> None:
    v = _run(tmp_path, sched=(2000, 2000), server=2000, log=2000)
    assert v.status == "pass", v.reason
    assert v.figures["translation"] == 1 and "reports logical capacity" in v.reason


def test_surfaces_that_no_single_factor_maps_onto_the_allocator_fail(tmp_path: Path) -> None:
    # the scheduler reports per rank, /server_info logical: an adapter cannot know which it reads
    v = _run(tmp_path, server=2000)
    assert v.status == "fail"
    assert v.reason.endswith("scheduler reports 1000 tokens for rank 0's 2000 allocator slots (x2), "
                             "server_info reports 2000 tokens for rank 0's 2000 allocator slots")
    v = _run(tmp_path / "b", sched=(1000, 1500))
    assert v.status == "fail"
    assert "scheduler reports 1500 tokens for rank 1's 2000 allocator slots (neither x1 nor x2)" in v.reason


def test_pages_that_are_not_page_size_times_dcp_fail(tmp_path: Path) -> None:
    v = _run(tmp_path, page=(1, 1))
    assert v.status == "fail" and "not page_size 1 x dcp 2" in v.reason


def test_a_request_longer_than_capacity_and_context_allow_fails(tmp_path: Path) -> None:
    assert _run(tmp_path, served=1500).status == "pass"
    v = _run(tmp_path / "b", served=1501)
    assert v.status == "fail" and "longer than the 1500" in v.reason


def test_without_the_allocator_size_there_is_nothing_to_translate_onto(tmp_path: Path) -> None:
    v = _run(tmp_path, alloc=None)
    assert v.status == "unknown" and "allocator's size" in v.reason


def test_surfaces_not_recorded_are_listed_not_failed(tmp_path: Path) -> None:
    v = _run(tmp_path, server=None, log=None, page=(1, None))
    assert v.status == "pass", v.reason
    assert v.figures["not_seen"] == ["/server_info max_total_num_tokens", "'max_total_num_tokens=' log line",
                                     "the allocator's page size"]


# ------------------------------------------------------------------------------------ archives
@pytest.mark.parametrize(("archive", "dcp", "reported"), [
    ("results/dcp2_llama_kv1_eager/20261203T081109Z-3938cb53", 2, 65536),
    ("results/dcp8_llama_kv1/20261203T215348Z-ec13face", 8, 65536),
])
def test_sglangs_per_rank_report_is_what_an_adapter_translates(archive: str, dcp: int, reported: int) -> None:
    # The pinned release's capacity contract fails on these archives (per-rank figures); the
    # adapter contract states the translation and finds it holds on every surface.
    loaded = load_archive(ROOT / archive)
    v = check(loaded.evidence, CapacityAdapterParams(dcp=dcp, log_patterns=PINNED_LOG_PATTERNS))
    assert v.status == "pass", v.reason
    assert v.figures["translation"] == dcp
    assert set(v.figures["allocator_slots"].values()) == {reported * dcp}
