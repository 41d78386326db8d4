"""tools/device/crosscheck.py on fabricated archives: which scenarios the physical cross-check runs,
and how physical archives are compared with their co-located twins."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cptest.lang.parse import parse_file
from cptest.plan.build import canonical_sha256
from cptest.plan.model import Plan
from cptest.testing.archives import colocate, make_plan, server_plan, write_archive
from tests.test_device_tools import _load
from tests.test_store import finished_run

crosscheck = _load("crosscheck")

RUN = "20261201T000000Z-00000000"
LATER = "20261202T000000Z-00000000"


# ---------------------------------------------------------------- list
def _archive(results: Path, name: str, *, dcp: int = 1, attn_cp: int = 1, world: int = 2,
             colocated: bool = True, run: str = RUN) -> Path:
    """An archive of scenario `name` with a verdict: enough for `list`, which reads only plans."""
    main = server_plan(world=world, dcp=dcp, attn_cp=attn_cp,
                       cp_strategy="zigzag" if attn_cp > 1 else None)  # fmt: skip
    plan = make_plan(colocate(main) if colocated else main, scenario=name)
    return write_archive(results / name / run, plan, extra={"verdict.json": "{}"})


def _scenario_file(scenarios: Path, rel: str, name: str) -> Path:
    path = scenarios / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"cptest 1\nscenario {name} {{\n}}\n")
    return path


@pytest.fixture
def listed(tmp_path: Path) -> tuple[Path, Path]:
    """Results and scenario files of every kind `list` must tell apart."""
    results, scenarios = tmp_path / "results", tmp_path / "repo" / "scenarios"
    _archive(results, "pcp2_a", attn_cp=2)
    _archive(results, "dcp2_b", dcp=2)
    _archive(results, "dcp2_physical", dcp=2, colocated=False)
    _archive(results, "tp2_only")
    _archive(results, "dcp4_c", dcp=4, world=4)
    _archive(results, "pcp4_d", attn_cp=4, world=4)
    # the newest archive decides: co-located once, physical since
    _archive(results, "dcp2_moved", dcp=2)
    _archive(results, "dcp2_moved", dcp=2, colocated=False, run=LATER)
    for name in ("pcp2_a", "dcp2_physical", "tp2_only", "dcp4_c", "pcp4_d", "dcp2_moved"):
        _scenario_file(scenarios, f"{name}.cps", name)
    _scenario_file(scenarios, "qualification/dcp2_b.cps", "dcp2_b")
    return results, scenarios


def test_list_picks_the_colocated_dcp2_then_pcp2_scenarios_and_writes_them_under_a_header(
        listed: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results, scenarios = listed
    out = tmp_path / "crosscheck.txt"
    code = crosscheck.main(["list", "--results", str(results), "--scenarios", str(scenarios),
                            "--out", str(out)])
    assert code == 0
    expected = ["scenarios/qualification/dcp2_b.cps", "scenarios/pcp2_a.cps"]
    assert capsys.readouterr().out.splitlines() == expected
    text = out.read_text()
    assert [line for line in text.splitlines() if not line.startswith("#")] == expected
    assert text.startswith("# The physical cross-check's scenarios")
    assert "# DCP2\nscenarios/qualification/dcp2_b.cps\n# PCP2\nscenarios/pcp2_a.cps\n" in text


def test_list_names_a_scenario_without_its_file(listed: tuple[Path, Path],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    results, scenarios = listed
    (scenarios / "pcp2_a.cps").unlink()
    code = crosscheck.main(["list", "--results", str(results), "--scenarios", str(scenarios), "--out", "-"])
    got = capsys.readouterr()
    assert code == 1 and got.out.splitlines() == ["scenarios/qualification/dcp2_b.cps"]
    assert "pcp2_a: 0 files under" in got.err


# ---------------------------------------------------------------- compare
def _publish(archive: Path, results: Path, run: str = RUN, *, colocated: bool = False) -> Path:
    """A copy of `archive` as `<results>/synthetic/<run>/`, its main server co-located if asked."""
    to = results / "synthetic" / run
    shutil.copytree(archive, to)
    if colocated:
        path = to / "plan.json"
        plan = Plan.model_validate_json(path.read_text())
        path.write_text(plan.model_copy(update={"main": colocate(plan.main)}).model_dump_json(indent=2))
    return to


def _set_status(verdict_file: Path, checker: str, status: str) -> None:
    v = json.loads(verdict_file.read_text())
    (row,) = [x for x in v["verdicts"] if x["checker"] == checker]
    row["status"] = status
    verdict_file.write_text(json.dumps(v))


@pytest.fixture
def twins(tmp_path: Path) -> tuple[Path, Path]:
    """(physical results, co-located results) holding one archive of `synthetic` each, identical but
    for the placement."""
    base = finished_run(tmp_path, "base")
    physical, against = tmp_path / "physical", tmp_path / "against"
    _publish(base, physical)
    _publish(base, against, colocated=True)
    return physical, against


def _compare(physical: Path, against: Path, *extra: str) -> int:
    return crosscheck.main(["compare", str(physical), "--against", str(against), *extra])


def test_identical_twins_agree(twins: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    physical, against = twins
    assert _compare(physical, against) == 0
    text = capsys.readouterr().out
    assert "| synthetic | launch | pass | pass | agree |" in text
    assert "- scenarios compared: 1" in text and "- differences: 0" in text and "- no twin: 0" in text
    assert _compare(physical, against, "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["contracts"] == out["summary"]["contracts_agreeing"] >= 1
    assert out["compared"][0]["colocated"].startswith(str(against)) and out["exit"] == 0


def test_a_checker_whose_status_differs_is_named(twins: tuple[Path, Path],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    physical, against = twins
    _set_status(physical / "synthetic" / RUN / "verdict.json", "launch", "fail")
    assert _compare(physical, against, "--json") == 1
    out = json.loads(capsys.readouterr().out)
    assert {"scenario": "synthetic", "checker": "launch", "colocated": "pass", "physical": "fail"} in (
        out["summary"]["differences"])
    assert _compare(physical, against) == 1
    assert "  - synthetic, launch: co-located pass, physical fail" in capsys.readouterr().out


def test_the_twins_newest_reanalysis_is_the_status_that_stands(twins: tuple[Path, Path],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    physical, against = twins
    twin = against / "synthetic" / RUN
    (twin / "analyses" / LATER[:16]).mkdir(parents=True)
    reanalysis = twin / "analyses" / LATER[:16] / "verdict.json"
    shutil.copy(twin / "verdict.json", reanalysis)
    _set_status(reanalysis, "launch", "unknown")
    assert _compare(physical, against) == 1
    assert "| synthetic | launch | unknown | pass | **differ** |" in capsys.readouterr().out


def test_an_evidence_difference_that_counts_is_listed(twins: tuple[Path, Path],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    physical, against = twins
    rank = physical / "synthetic" / RUN / "evidence" / "main" / "rank0.jsonl"
    rank.write_text(rank.read_text().replace('"rows":100', '"rows":90'))
    assert _compare(physical, against, "--json") == 1
    (d,) = json.loads(capsys.readouterr().out)["summary"]["differences"]
    assert d["scenario"] == "synthetic" and d["evidence"] == "main rank 0 kv_pool rows"
    assert (d["colocated"], d["physical"]) == ("100", "90")


def test_a_physical_archive_without_a_colocated_twin_is_reported(twins: tuple[Path, Path], tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    physical, _ = twins
    only_physical = tmp_path / "only-physical"
    _publish(physical / "synthetic" / RUN, only_physical)
    assert _compare(physical, only_physical) == 3
    got = capsys.readouterr()
    assert "- no twin: 1" in got.out
    assert f"no co-located archive of synthetic under {only_physical}" in got.out
    assert "nothing compared" in got.err


@pytest.mark.parametrize("what", ["missing", "a file", "an archive", "empty"])
def test_a_path_that_is_not_a_results_folder_is_bad_input(what: str, twins: tuple[Path, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    physical, against = twins
    path = {"missing": tmp_path / "nowhere", "a file": tmp_path / "base" / "plan.json",
            "an archive": physical / "synthetic" / RUN, "empty": tmp_path / "empty"}[what]  # fmt: skip
    (tmp_path / "empty").mkdir()
    assert _compare(path, against) == 2
    assert str(path) in capsys.readouterr().err


def test_list_warns_of_a_scenario_file_that_changed_since_its_archive(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenarios = Path(crosscheck.REPO) / "scenarios"
    results = tmp_path / "results"
    same = _archive(results, "dcp2_llama_kv4", dcp=2)
    _archive(results, "dcp2_mla", dcp=2)  # its plan's hash is not the file's
    plan = Plan.model_validate_json((same / "plan.json").read_text())
    sha = canonical_sha256(parse_file(scenarios / "dcp2_llama_kv4.cps"))
    pinned = plan.model_copy(update={"pins": plan.pins.model_copy(update={"scenario_sha256": sha})})
    (same / "plan.json").write_text(pinned.model_dump_json())
    code = crosscheck.main(["list", "--results", str(results), "--scenarios", str(scenarios), "--out", "-"])
    got = capsys.readouterr()
    assert code == 0 and got.out.splitlines() == ["scenarios/dcp2_llama_kv4.cps", "scenarios/dcp2_mla.cps"]
    (warning,) = got.err.splitlines()
    assert warning.startswith("crosscheck.py list: warning: dcp2_mla: ") and "rerun it co-located" in warning
