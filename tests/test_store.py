"""Specifications of cptest/store.py: the archive's layout, name, phases, manifest and verification."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from cptest.checks import check
from cptest.contracts import LaunchParams
from cptest.evidence import Capacity, KvPool, Lifecycle, RequestResult
from cptest.pipeline import finish_archive
from cptest.plan.model import Plan
from cptest.store import (
    IntegrityError,
    Layout,
    archive_dir,
    archives_under,
    begin,
    create_archive,
    rank_file_name,
    read_file,
    verify,
    write_file,
)
from cptest.testing.archives import make_plan, rank_id, server_plan, write_archive, write_jsonl

ENV = {"python": "3.11", "reasons": {}}
EXPECT = [LaunchParams(accepted=True, source="s.cps:3:3")]


def begun(d: Path, plan: Plan, text: str = "scenario synthetic {}\n", **kw) -> dict:
    return begin(Layout(d), scenario=plan.scenario, scenario_text=text, plan_json=plan.model_dump_json(),
                 pins=plan.pins.model_dump(mode="json"), environment=ENV, **kw)


def _req(i: int, ids: list[int], lps: list[float]) -> RequestResult:
    return RequestResult(
        index=i,
        prompt_len=2,
        max_new_tokens=2,
        prompt_sha256="x",
        status="ok",
        output_ids=ids,
        output_logprobs=lps,
    )


def finished_run(tmp_path: Path, name: str = "a", *, ids=(1, 2), lps=(-0.1, -0.2), rows: int = 100) -> Path:
    """A finished archive of one TP1 server that served one request."""
    plan = make_plan(server_plan(), EXPECT)
    d = tmp_path / name
    begun(d, plan)
    write_jsonl(
        d / "evidence/main/runner.jsonl",
        [Lifecycle(event="ready", detail={"after_s": 1.0}), _req(0, list(ids), list(lps))],
    )
    write_jsonl(
        d / "evidence/main/rank0.jsonl",
        [KvPool(rank=rank_id(0), rows=rows), Capacity(rank=rank_id(0), max_total_num_tokens=rows)],
    )
    (d / "logs/main-node0.log").write_text("ready\n")
    finish_archive(d, check(d, require_finished=False), plan)
    return d


def test_archive_dir_names_utc_time_and_short_hash() -> None:
    now = datetime(2025, 3, 4, 5, 6, 7, tzinfo=timezone(timedelta(hours=2)))
    assert archive_dir("results", "dcp4", "abcdef0123456789", now) == Path(
        "results/dcp4/20250304T030607Z-abcdef01"
    )


def test_archive_dir_refuses_a_naive_time() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        archive_dir("r", "s", "0" * 64, datetime(2025, 1, 1))


@pytest.mark.parametrize("name", ["../escaped", "a/b", "..", ".hidden", "", "x" * 200, "a\nb"])
def test_archive_dir_is_built_only_from_a_validated_scenario_name(name: str) -> None:
    with pytest.raises(ValueError, match="cannot name a folder"):
        archive_dir("r", name, "0" * 64, datetime(2025, 1, 1, tzinfo=UTC))


def test_two_runs_in_the_same_second_get_two_archives(tmp_path: Path) -> None:
    # Exclusive create: the second run of the same scenario in the same second takes `-2`.
    now = datetime(2025, 1, 1, tzinfo=UTC)
    first = create_archive(tmp_path, "s", "ab" * 32, now)
    second = create_archive(tmp_path, "s", "ab" * 32, now)
    assert (first.name, second.name) == ("20250101T000000Z-abababab", "20250101T000000Z-abababab-2")
    # The folder appears only at `begin`, which drops the reservation; a name begun is never
    # handed out again, and `begin` refuses a folder that exists.
    assert not first.exists() and not second.exists()
    begun(first, make_plan(server_plan()))
    assert [p.name for p in (tmp_path / "s").iterdir()] == ["20250101T000000Z-abababab"]
    assert [p.name for p in (tmp_path / ".claims").iterdir()] == ["s.20250101T000000Z-abababab-2"]
    assert create_archive(tmp_path, "s", "ab" * 32, now).name == "20250101T000000Z-abababab-3"
    with pytest.raises(FileExistsError):
        begun(first, make_plan(server_plan()))


def test_an_archive_is_not_created_through_a_linked_scenario_folder(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "s").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="link out of"):
        create_archive(tmp_path / "results", "s", "ab" * 32, datetime(2025, 1, 1, tzinfo=UTC))
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_write_replaces_a_link_and_never_follows_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    root = tmp_path / "a"
    root.mkdir()
    (root / "junit.xml").symlink_to(victim)
    write_file(root, root / "junit.xml", "<xml/>")
    assert victim.read_text() == "keep me"
    assert not (root / "junit.xml").is_symlink() and (root / "junit.xml").read_text() == "<xml/>"
    assert [p.name for p in root.iterdir()] == ["junit.xml"]  # no temporary file left


def test_reading_an_archive_file_never_follows_a_link_or_opens_a_fifo(tmp_path: Path) -> None:
    (tmp_path / "plan.json").symlink_to("/etc/hostname")
    os.mkfifo(tmp_path / "manifest.json")
    with pytest.raises(IntegrityError, match="plan.json is a symbolic link"):
        read_file(tmp_path / "plan.json")
    with pytest.raises(IntegrityError, match="manifest.json is a FIFO"):
        read_file(tmp_path / "manifest.json")


def test_layout_names_every_file_of_the_archive_in_one_place() -> None:
    lay = Layout(Path("/a"))
    assert lay.rank_file("baseline", 3) == Path("/a/evidence/baseline") / rank_file_name(3)
    assert (lay.runner_file("main"), lay.log("main", 1)) == (
        Path("/a/evidence/main/runner.jsonl"), Path("/a/logs/main-node1.log"))
    assert lay.relative(lay.rank_file("main", 0)) == "evidence/main/rank0.jsonl"


def test_begin_writes_plan_scenario_and_a_first_manifest(tmp_path: Path) -> None:
    d = tmp_path / "x"
    m = begun(d, make_plan(server_plan()), "text", includes={"includes/defaults.cps": "d"},
              roles=["main", "baseline"])
    assert m["phase"] == "begun"
    assert sorted(m["files"]) == ["includes/defaults.cps", "plan.json", "scenario.cps"]
    assert json.loads((d / "manifest.json").read_text())["environment"] == ENV
    assert (d / "evidence/baseline").is_dir() and (d / "logs").is_dir()


@pytest.mark.parametrize("name", ["../evil.cps", "includes/../plan.json", "logs/main-node0.log",
                                  "scenario.cps", "/tmp/evil.cps"])
def test_begin_writes_includes_only_under_their_own_folder(tmp_path: Path, name: str) -> None:
    # An include can never alias cptest's own files (the engine log `log contains` reads, the
    # archived scenario) nor land outside the archive.
    with pytest.raises(ValueError, match="outside the archive's includes/ folder"):
        begun(tmp_path / "x", make_plan(server_plan()), includes={name: "x"})


def test_finished_archive_verifies_clean_and_lists_every_file(tmp_path: Path) -> None:
    d = finished_run(tmp_path)
    assert verify(d) == []
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["phase"] == "finished" and manifest["environment"] == ENV
    assert {
        "verdict.json",
        "report.md",
        "junit.xml",
        "evidence/main/rank0.jsonl",
        "logs/main-node0.log",
    } <= set(manifest["files"])


def test_verify_names_a_changed_a_missing_and_an_extra_file(tmp_path: Path) -> None:
    d = finished_run(tmp_path)
    (d / "logs/main-node0.log").write_text("tampered\n")
    (d / "report.md").unlink()
    (d / "notes.txt").write_text("x")
    msgs = [p.message for p in verify(d)]
    assert msgs == [
        "logs/main-node0.log changed since the run",
        "notes.txt is not in the manifest (added after the run?)",
        "report.md is listed in the manifest but missing",
    ]


def test_verify_flags_an_unfinished_archive(tmp_path: Path) -> None:
    d = tmp_path / "x"
    begun(d, make_plan(server_plan()), "t")
    assert "phase 'begun'" in verify(d)[0].message


def test_check_reproduces_verdict_json_exactly(tmp_path: Path) -> None:
    d = finished_run(tmp_path)
    assert check(d).to_json() == (d / "verdict.json").read_text()
    assert "timestamp" not in (d / "verdict.json").read_text()


def test_write_archive_and_begin_share_one_layout(tmp_path: Path) -> None:
    plan = make_plan(server_plan(), EXPECT)
    run = [Lifecycle(event="ready"), Lifecycle(event="shutdown_done")]
    write_archive(tmp_path / "w", plan, runner={"main": run})
    # write_archive writes no manifest: judged as evidence, not as a finished archive.
    assert check(tmp_path / "w", require_finished=False).status == "pass"
    assert check(tmp_path / "w").status == "unknown"


def test_archives_under_a_folder_leave_out_side_runs_unless_asked_for_by_name(tmp_path: Path) -> None:
    for d in ("a/20260101T000000Z-aa", "b/20260101T000000Z-bb", "_side/a/20260101T000000Z-cc", "c/x"):
        (tmp_path / d).mkdir(parents=True)
    for d in ("a/20260101T000000Z-aa", "b/20260101T000000Z-bb", "_side/a/20260101T000000Z-cc"):
        (tmp_path / d / "verdict.json").write_text("{}")
    assert [p.relative_to(tmp_path).as_posix() for p in archives_under(tmp_path)] == [
        "a/20260101T000000Z-aa", "b/20260101T000000Z-bb"]
    assert [p.name for p in archives_under(tmp_path / "_side")] == ["20260101T000000Z-cc"]


# ---------------------------------------------------------------- packed evidence (D77)
def big_run(tmp_path: Path) -> Path:
    """A finished archive whose rank file, runner file and log are over the packing size."""
    plan = make_plan(server_plan(), EXPECT)
    d = tmp_path / "big"
    begun(d, plan)
    reqs = [_req(i, [1, 2], [-0.1, -0.2]) for i in range(600)]
    write_jsonl(d / "evidence/main/runner.jsonl", [Lifecycle(event="ready", detail={"after_s": 1.0}), *reqs])
    pools = [KvPool(rank=rank_id(0), rows=100 + i) for i in range(800)]
    capacity = Capacity(rank=rank_id(0), max_total_num_tokens=100)
    write_jsonl(d / "evidence/main/rank0.jsonl", [*pools, capacity])
    (d / "logs/main-node0.log").write_text("".join(f"[t] line {i} of the engine\n" for i in range(4000)))
    (d / "logs/main-node1.log").write_text("short\n")
    finish_archive(d, check(d, require_finished=False), plan)
    return d


def test_large_evidence_and_logs_are_stored_packed_and_read_as_written(tmp_path: Path) -> None:
    from cptest.checks.load import load_archive
    from cptest.store import PACK_FROM_BYTES, existing_file, read_bytes

    d = big_run(tmp_path)
    files = set(json.loads((d / "manifest.json").read_text())["files"])
    assert {"evidence/main/runner.jsonl.xz", "evidence/main/rank0.jsonl.xz", "logs/main-node0.log.xz",
            "logs/main-node1.log", "plan.json", "verdict.json"} <= files
    assert not (d / "evidence/main/rank0.jsonl").exists() and verify(d) == []
    assert (d / "evidence/main/rank0.jsonl.xz").stat().st_size < PACK_FROM_BYTES
    layout = Layout(d)
    assert layout.rank_files("main") == {0: d / "evidence/main/rank0.jsonl"}
    assert existing_file(layout.runner_file("main")) and existing_file(layout.node_log("main", 0))
    assert read_bytes(layout.node_log("main", 0)).decode().splitlines()[3999] == "[t] line 3999 of the engine"
    loaded = load_archive(d)
    assert len(loaded.evidence.role("main").runner.requests) == 600
    assert len(loaded.evidence.role("main").ranks[0].kv_pools) == 800
    # The verdict re-derives byte for byte from the packed evidence.
    assert check(d).to_json() == (d / "verdict.json").read_text()


def test_a_file_stored_twice_a_damaged_pack_and_a_pack_too_large_are_integrity_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cptest import bounds, store

    d = big_run(tmp_path)
    rank0 = d / "evidence/main/rank0.jsonl"
    rank0.write_text("{}\n")
    with pytest.raises(IntegrityError, match="stored both as it is and packed"):
        store.read_bytes(rank0)
    rank0.unlink()
    monkeypatch.setitem(bounds.BY_SUFFIX, ".jsonl", bounds.Bound("an evidence file", 1000, line=1000))
    with pytest.raises(IntegrityError, match=r"rank0.jsonl.xz unpacks to more than an evidence file may be "
                       r"\(1,000 bytes\)"):
        store.read_bytes(rank0)
    monkeypatch.undo()
    (d / "evidence/main/rank0.jsonl.xz").write_bytes(b"not xz at all")
    with pytest.raises(IntegrityError, match="is not an xz file"):
        store.read_bytes(rank0)
    assert any("rank0.jsonl.xz changed" in p.message for p in verify(d))


def test_only_evidence_and_engine_logs_are_packed() -> None:
    from cptest.store import packable

    assert packable("evidence/main/rank0.jsonl") and packable("evidence/cptest.jsonl")
    assert packable("evidence/main/n2/rank3.jsonl") and packable("logs/main-node0.log")
    assert not packable("plan.json") and not packable("report.html") and not packable("logs/x/y.log")
    assert not packable("includes/defaults/tiny.cps")
