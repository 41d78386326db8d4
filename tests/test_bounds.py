"""Specifications of cptest/bounds.py and of how an archive is held to it: a file, a record, one
archive's evidence in all, or its entries over their bound are refused unread, named with the file
(and line), and judged unknown, never pass or fail; the archives of results/ keep a margin under
every bound. The CLI's exit codes for the same archives are in tests/test_tamper.py."""

from __future__ import annotations

import array
import base64
import json
import lzma
import shutil
from pathlib import Path

import pytest

from cptest import bounds, checks, pipeline, store
from cptest.analyses import current_verdict_file
from cptest.checks.load import load_archive
from cptest.errors import PlanError
from cptest.evidence import _ADAPTER, StepBlock, held_cost, line_cost

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
SOURCE = "dcp2_llama_kv1"
"""A published archive with a baseline and a control, packed evidence, and a FAIL verdict."""
MARGIN = 8
"""What every bound keeps above the largest file of its kind in results/ (cptest/bounds.py)."""


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    source = min(store.archives_under(RESULTS / SOURCE), key=lambda a: a.name)  # the first published
    copy = tmp_path / SOURCE / source.name
    shutil.copytree(source, copy)
    return copy


def put(path: Path, data: bytes) -> None:
    """The archive's file at `path` replaced by `data`, stored as it is."""
    path.unlink(missing_ok=True)
    store.packed(path).unlink(missing_ok=True)
    path.write_bytes(data)


def sparse(path: Path, size: int) -> None:
    """The archive's file at `path` replaced by `size` zero bytes that take no disk."""
    put(path, b"")
    with path.open("r+b") as f:
        f.truncate(size)


def refused_verdict(archive: Path) -> checks.ScenarioVerdict:
    """The archive's verdict, asserting what every refusal gives: unknown, every verdict unknown."""
    verdict = checks.check(archive)
    assert verdict.status == "unknown"
    assert {v.status for v in verdict.verdicts} == {"unknown"}
    assert verdict.verdicts[-1].checker == "evidence"
    return verdict


# ------------------------------------------------------------------------------------ results/
def test_every_archive_in_results_keeps_a_margin_under_every_bound() -> None:
    archives = store.archives_under(RESULTS)
    assert len(archives) >= 20
    for archive in archives:
        files = [p for p in archive.rglob("*") if p.is_file()]
        assert len(list(archive.rglob("*"))) * MARGIN <= bounds.ARCHIVE_ENTRIES, archive
        for path in files:
            name = path.with_name(path.name.removesuffix(store.PACKED))
            bound = bounds.bound_for(name.name)
            assert len(store.read_bytes(name)) * MARGIN <= bound.bytes, path
            if bound.line is not None:
                assert max(len(line) for _, line in store.read_lines(name)) * MARGIN <= bound.line, path
        budget = store.Budget()
        loaded = load_archive(archive, budget)
        assert loaded.evidence.refused == []
        charged = bounds.ARCHIVE_EVIDENCE_BYTES - budget.left
        assert charged * MARGIN <= bounds.ARCHIVE_EVIDENCE_BYTES, archive


def test_an_archive_of_results_checks_as_it_did(archive: Path) -> None:
    # The verdict it holds now: the seal's, or the newest re-analysis beside it.
    assert checks.check(archive).to_json() == current_verdict_file(archive).read_text()
    assert store.verify(archive) == []


# ------------------------------------------------------------------------------------ files
def test_an_evidence_file_over_its_bound_is_not_read_and_nothing_is_judged(archive: Path) -> None:
    sparse(archive / "evidence/main/rank0.jsonl", bounds.EVIDENCE.bytes + 1)
    verdict = refused_verdict(archive)
    assert "rank0.jsonl is 16,777,217 bytes, larger than an evidence file may be (16 MiB); not read" in (
        verdict.verdicts[-1].reason)
    assert all("not judged: evidence not read:" in v.reason for v in verdict.verdicts[:-1])
    # A fresh run's own long workload is a cause as likely as an edit, and the reason says what to do.
    assert "a longer workload makes more evidence: shorten it" in verdict.verdicts[-1].reason


def test_a_packed_file_is_refused_as_soon_as_it_unpacks_past_its_bound(archive: Path) -> None:
    runner = archive / "evidence/main/runner.jsonl"
    chunk = b'{"kind":"lifecycle","event":"ready"}\n' * 30_000  # about 1 MiB of valid records
    put(runner, b"")
    runner.unlink()
    stream = lzma.compress(chunk, format=lzma.FORMAT_XZ)
    store.packed(runner).write_bytes(stream * (bounds.EVIDENCE.bytes // len(chunk) + 1))
    verdict = refused_verdict(archive)
    reason = verdict.verdicts[-1].reason
    assert "runner.jsonl.xz unpacks to more than an evidence file may be (16 MiB)" in reason
    with pytest.raises(store.OverBound, match="unpacks to more than"):
        store.read_bytes(runner)


def test_a_record_over_its_bound_is_named_by_file_and_line(archive: Path) -> None:
    runner = archive / "evidence/main/runner.jsonl"
    first = store.read_bytes(runner).split(b"\n")[0]
    put(runner, first + b"\n" + b'{"kind":"log","line":"' + b"x" * bounds.EVIDENCE.line + b'"}\n')
    verdict = refused_verdict(archive)
    assert "runner.jsonl:2: a record longer than a line of an evidence file may be (4 MiB); not read" in (
        verdict.verdicts[-1].reason)
    assert "evidence/main/runner.jsonl:2: a record" in verdict.verdicts[-1].reason
    assert str(archive) not in verdict.to_json()  # the verdict names no directory of this machine


def test_an_engine_log_over_its_bound_is_not_read(archive: Path) -> None:
    sparse(archive / "logs/main-node0.log", bounds.LOG.bytes + 1)
    assert "main-node0.log is 8,388,609 bytes, larger than an engine log may be" in (
        refused_verdict(archive).verdicts[-1].reason)


def test_a_plan_or_manifest_over_its_bound_is_an_integrity_error(archive: Path) -> None:
    sparse(archive / "manifest.json", bounds.MANIFEST.bytes + 1)
    over = r"manifest.json is 1,048,577 bytes, larger than a manifest"
    with pytest.raises(store.OverBound, match=over) as e:
        checks.check(archive)
    # No workload makes a manifest this large, so the hint asks about an edit and never says to
    # shorten anything.
    assert "was the archive edited or made elsewhere" in str(e.value.problems[0].hint)
    assert "workload" not in str(e.value.problems[0].hint)
    sparse(archive / "plan.json", 2 << 30)
    with pytest.raises(store.OverBound, match=r"plan.json is 2,048 MiB, larger than a plan may be \(16 MiB"):
        checks.load_plan(archive)


def test_one_archive_s_evidence_is_bounded_in_all(archive: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounds, "ARCHIVE_EVIDENCE_BYTES", 256 * bounds.KiB)
    reason = refused_verdict(archive).verdicts[-1].reason
    assert "the archive's evidence and logs come to more than one check reads (256 KiB in all); not read" in (
        reason)


# ------------------------------------------------------------------------------------ verify
def test_verify_names_a_file_stored_over_its_bound_and_does_not_hash_it(archive: Path) -> None:
    sparse(archive / "plan.json", 64 << 30)  # hashed, it would take a minute
    problems = [p.message for p in store.verify(archive)]
    assert problems == ["plan.json is 65,536 MiB, larger than a plan may be (16 MiB)"]


def test_verify_tells_an_evidence_file_a_long_workload_can_outgrow(archive: Path) -> None:
    sparse(archive / "evidence/main/rank0.jsonl", bounds.EVIDENCE.bytes + 1)
    # verify also names the file's hash, which no longer matches the seal; the size is its own problem.
    [problem] = [p for p in store.verify(archive) if "larger than an evidence file may be" in p.message]
    assert problem.message.startswith("evidence/main/rank0.jsonl is 16,777,217 bytes")
    assert "a longer workload makes a larger one: shorten the scenario's workload" in str(problem.hint)


def test_an_archive_of_more_entries_than_it_may_hold_is_refused_unwalked(archive: Path) -> None:
    extra = archive / "logs" / "extra"
    extra.mkdir()
    for k in range(bounds.ARCHIVE_ENTRIES):
        (extra / str(k)).touch()
    message = "the archive holds more than 4,096 files and folders; not read"
    with pytest.raises(store.IntegrityError, match=message):
        checks.check(archive)
    assert [p.message for p in store.verify(archive)] == [message]


# ------------------------------------------------------------------------------------ charges
def test_a_line_is_charged_for_the_records_and_containers_it_parses_into() -> None:
    assert line_cost(b'{"kind":"probe_note","message":""}') == bounds.RECORD_BYTES
    assert line_cost(b"[" * 100) == 100 * bounds.LIST_BYTES
    assert line_cost(b'{"a":0}' * 10) == 10 * bounds.DICT_BYTES
    long = b'{"kind":"probe_note","message":"' + b"x" * 1000 + b'"}'
    assert line_cost(long) == len(long)
    n, b = 3, 500
    pos = base64.b64encode(array.array("i", range(n * b)).tobytes()).decode()
    block = _ADAPTER.validate_json(
        f'{{"kind":"steps","t":[0,0,0],"rank":{{"world":0}},"rids":{json.dumps([str(k) for k in range(b)])},'
        f'"step":[1,2,3],"rows_in":[{b},{b},{b}],"attn_rows":[0,0,0],"ffn_rows":[0,0,0],"logits_rows":[0,0,0],'
        f'"pos":"{pos}","kv":"all"}}')
    assert isinstance(block, StepBlock) and len(block.rids) == b
    # Each of its 3 steps holds every request twice (positions and the K/V it wrote).
    assert held_cost(block, 100) == bounds.ENTRY_BYTES * 2 * n * b
    assert held_cost(block, 10**6) == 3 * 10**6


def test_planning_refuses_a_plan_larger_than_an_archive_may_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = ROOT / "scenarios" / "dcp2_llama_kv1.cps"
    size = len(pipeline.prepare(scenario, gpu_present=False).plan.model_dump_json(indent=2))
    monkeypatch.setattr(bounds, "PLAN", bounds.Bound("a plan", size - 1))
    with pytest.raises(PlanError, match=f"the plan would be {size:,} bytes, more than an archive's plan.json "
                       f"may be \\({size - 1:,} bytes\\)"):
        pipeline.prepare(scenario, gpu_present=False)
