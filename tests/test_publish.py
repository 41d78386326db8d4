"""`cptest publish`: a trial run's archive into the published evidence, checked first, copied
atomically, never overwriting (docs/decisions.md D51). The archive is a committed SGLang one (it
passes `verify` and `check`), copied where a trial run would be."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cptest import pipeline, store
from cptest.store import archives_under, claim_path

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = next(p for p in sorted((ROOT / "results" / "pcp_dcp_rejected").iterdir()) if p.is_dir())


def _trial(tmp_path: Path) -> Path:
    d = tmp_path / "runs" / ARCHIVE.parent.name / ARCHIVE.name
    shutil.copytree(ARCHIVE, d)
    return d


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


def test_publish_copies_the_checked_archive_under_its_scenario_and_run(tmp_path: Path):
    source, results = _trial(tmp_path), tmp_path / "results"
    done = pipeline.publish(source, results)
    target = results / ARCHIVE.parent.name / ARCHIVE.name
    assert (done.archive, done.already) == (target, False)
    assert _tree(target) == _tree(source) and store.verify(target) == []
    assert (target / "manifest.json").read_bytes() == (source / "manifest.json").read_bytes()
    assert sorted(os.listdir(results)) == [ARCHIVE.parent.name]  # no claim, no copy left beside it
    assert os.listdir(target.parent) == [ARCHIVE.name]
    assert archives_under(results) == [target]


def test_publishing_the_same_archive_again_copies_nothing(tmp_path: Path):
    source, results = _trial(tmp_path), tmp_path / "results"
    first = pipeline.publish(source, results)
    before = (first.archive / "manifest.json").stat().st_mtime_ns
    again = pipeline.publish(source, results)
    assert again.already and again.archive == first.archive
    assert (first.archive / "manifest.json").stat().st_mtime_ns == before


def test_another_archive_of_that_name_is_never_overwritten(tmp_path: Path):
    source, results = _trial(tmp_path), tmp_path / "results"
    target = results / ARCHIVE.parent.name / ARCHIVE.name
    target.mkdir(parents=True)
    (target / "note.txt").write_text("someone else's")
    with pytest.raises(pipeline.PublishRefused, match="never overwritten") as e:
        pipeline.publish(source, results)
    assert e.value.exit_code == 2
    assert _tree(target) == ["note.txt"] and sorted(os.listdir(target.parent)) == [ARCHIVE.name]


def test_a_name_a_run_has_reserved_is_refused_and_its_claim_kept(tmp_path: Path):
    source, results = _trial(tmp_path), tmp_path / "results"
    claim = claim_path(results / ARCHIVE.parent.name / ARCHIVE.name)
    claim.parent.mkdir(parents=True)
    claim.write_text("")
    with pytest.raises(pipeline.PublishRefused, match="a run is writing"):
        pipeline.publish(source, results)
    assert claim.exists()  # the run's reservation stays; nothing was published
    assert not (results / ARCHIVE.parent.name / ARCHIVE.name).exists()


@pytest.mark.parametrize("damage", ["evidence byte", "forged verdict", "fifo", "unfinished"])
def test_a_damaged_or_forged_archive_is_refused_and_nothing_is_written(tmp_path: Path, damage: str):
    source, results = _trial(tmp_path), tmp_path / "results"
    if damage == "evidence byte":
        f = next(p for p in sorted((source / "evidence").rglob("*.jsonl")) if p.stat().st_size)
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 1
        f.write_bytes(bytes(data))
    elif damage == "forged verdict":  # consistent: verify passes, check's recomputation does not
        verdict = json.loads((source / "verdict.json").read_text())
        verdict["status"] = "fail"
        (source / "verdict.json").write_text(json.dumps(verdict))
        manifest = json.loads((source / "manifest.json").read_text())
        manifest["files"]["verdict.json"] = store.sha256_file(source / "verdict.json")
        (source / "manifest.json").write_text(json.dumps(manifest))
        assert store.verify(source) == []
    elif damage == "fifo":
        os.mkfifo(source / "logs" / "extra.log")
    else:
        manifest = json.loads((source / "manifest.json").read_text())
        manifest["phase"] = "begun"
        (source / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(store.IntegrityError) as e:
        pipeline.publish(source, results)
    assert e.value.exit_code == 3
    assert _tree(results) in ([], [ARCHIVE.parent.name])  # nothing of the archive, no claim


def test_a_copy_in_progress_and_the_claims_are_never_read_as_archives(tmp_path: Path):
    results = tmp_path / "results"
    shutil.copytree(ARCHIVE, results / "s" / ".publish-x-123")
    shutil.copytree(ARCHIVE, results / ".claims" / "odd")
    shutil.copytree(ARCHIVE, results / "s" / ARCHIVE.name)
    assert archives_under(results) == [results / "s" / ARCHIVE.name]


def test_the_command_says_what_it_did_and_matrix_then_reads_it(tmp_path: Path):
    source, results = _trial(tmp_path), tmp_path / "results"

    def cptest(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cptest", *map(str, args)], capture_output=True,
                              text=True, cwd=ROOT, timeout=120)

    done = cptest("publish", source, "--results", results)
    target = results / ARCHIVE.parent.name / ARCHIVE.name
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"published: {source} -> {target} (pcp_dcp_rejected: PASS")
    assert "verified and checked" in done.stdout
    matrix = cptest("matrix", results)
    assert matrix.returncode == 0 and "| pcp_dcp_rejected | sglang, co-located | **PASS**" in matrix.stdout
    assert f"1 archive(s) under {results}: published evidence" in matrix.stderr
    trial = cptest("matrix", "--json", source.parent.parent)
    assert trial.returncode == 0 and json.loads(trial.stdout)["rows"][0]["archive"] == str(source)


def test_matrix_says_once_whether_it_read_trial_runs_or_published_evidence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from cptest import cli
    from cptest.cli import archives

    runs = tmp_path / "runs"
    shutil.copytree(ARCHIVE, runs / ARCHIVE.parent.name / ARCHIVE.name)
    monkeypatch.setattr(archives, "RUNS", runs)  # where `matrix` reads which folders are trial runs
    trial = CliRunner().invoke(cli.main, ["matrix", str(runs)])
    assert trial.exit_code == 0, trial.output
    assert f"1 archive(s) under {runs}: trial runs, not published evidence" in trial.stderr
    assert "trial runs in .cptest/runs are not read" not in trial.stderr
