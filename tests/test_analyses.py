"""Specifications of cptest/analyses.py and the seal it keeps: a sealed archive is never finished
again, and a re-analysis beside it verifies only while it names that seal and its chain holds."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cptest import analyses, pipeline, store
from cptest.checks import check
from tests.test_store import finished_run

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def analysed(d: Path, now: datetime = NOW) -> Path:
    return pipeline.reanalyse(d, check(d), now)


def test_a_sealed_archive_is_never_finished_again(tmp_path: Path) -> None:
    d = finished_run(tmp_path)
    sealed = (d / "manifest.json").read_bytes()
    with pytest.raises(store.IntegrityError, match="the archive is sealed"):
        pipeline.finish_archive(d, check(d))
    assert (d / "manifest.json").read_bytes() == sealed


def test_finishing_refuses_a_file_the_first_manifest_lists_that_changed(tmp_path: Path) -> None:
    d = finished_run(tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps(m | {"phase": "begun"}))  # set back by hand
    (d / "evidence/main/runner.jsonl").write_text("")
    with pytest.raises(store.IntegrityError, match="runner.jsonl changed since the run began"):
        pipeline.finish_archive(d, check(d, require_finished=False))


def test_a_reanalysis_lies_beside_the_seal_and_names_it(tmp_path: Path) -> None:
    d = finished_run(tmp_path)
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    a = analysed(d)
    assert a == d / "analyses" / "20260102T030405Z"
    assert {p: p.read_bytes() for p in before} == before  # nothing of the seal rewritten
    m = json.loads((a / "manifest.json").read_text())
    assert m["seal"] == {"file": "manifest.json", "sha256": store.seal_sha256(store.Layout(d))}
    assert m["previous"] is None and sorted(m["files"]) == ["junit.xml", "report.html", "report.md",
                                                              "verdict.json"]
    assert store.verify(d) == [] and analyses.problems(d) == []
    assert analyses.current_verdict_file(d) == a / "verdict.json"
    assert store.archives_under(tmp_path) == [d]  # an analysis is no archive of its own


def test_analyses_chain_in_the_order_they_were_written(tmp_path: Path) -> None:
    d = finished_run(tmp_path)
    first, second, third = analysed(d), analysed(d), analysed(d)  # the same second: -2, -3
    assert [p.name for p in analyses.listed(d)] == ["20260102T030405Z", "20260102T030405Z-2",
                                                    "20260102T030405Z-3"]
    link = json.loads((third / "manifest.json").read_text())["previous"]
    assert link["analysis"] == f"analyses/{second.name}"
    assert analyses.problems(d) == []
    shutil.rmtree(second)
    assert any("breaks the chain" in p.message for p in analyses.problems(d))
    assert first.is_dir()


def test_an_analysis_of_another_seal_or_an_edited_one_is_named(tmp_path: Path) -> None:
    d = finished_run(tmp_path)
    a = analysed(d)
    (a / "verdict.json").write_text("{}")
    assert [p.message for p in analyses.problems(d)] == [
        "analyses/20260102T030405Z/verdict.json changed since the analysis"]
    other = finished_run(tmp_path, "other", ids=(3, 4))
    shutil.copytree(a, other / "analyses" / a.name)
    assert any("names another seal" in p.message for p in analyses.problems(other))


def test_an_unsealed_archive_has_no_seal_to_analyse_beside(tmp_path: Path) -> None:
    d = finished_run(tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps(m | {"phase": "begun"}))
    with pytest.raises(store.IntegrityError, match="not sealed"):
        analyses.write(d, {"verdict.json": "{}"}, now=NOW, cptest_version="0")
    with pytest.raises(ValueError, match="cannot name a file"):
        analyses.write(d, {"../x": ""}, now=NOW, cptest_version="0")
