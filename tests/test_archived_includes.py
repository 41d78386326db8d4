"""Specifications of how an archive keeps and finds its scenario's `extends` files (D45):
`pipeline.include_name` stores them under `includes/`, `pipeline.parse_archived` finds them there
and nowhere an archive's own files are."""

from __future__ import annotations

from pathlib import Path

import pytest

from cptest import pipeline
from cptest.errors import ScenarioError
from tests.test_tamper import SCENARIO

REPO = Path(__file__).resolve().parents[1]
TINY = (REPO / "scenarios" / "defaults" / "tiny.cps").read_text()


def archive_with(tmp_path: Path, extends: str, files: dict[str, str]) -> Path:
    a = tmp_path / "results" / "tamper_dcp2" / "run"
    a.mkdir(parents=True)
    (a / "scenario.cps").write_text(SCENARIO.replace('"defaults/tiny.cps"', f'"{extends}"'))
    for name, text in files.items():
        (a / name).parent.mkdir(parents=True, exist_ok=True)
        (a / name).write_text(text)
    return a


def test_a_relative_extends_is_found_under_includes(tmp_path: Path) -> None:
    a = archive_with(tmp_path, "defaults/tiny.cps", {"includes/defaults/tiny.cps": TINY})
    assert pipeline.parse_archived(a).name == "tamper_dcp2"


def test_an_extends_above_the_scenario_is_found_under_up(tmp_path: Path) -> None:
    a = archive_with(tmp_path, "../common/tiny.cps", {"includes/@up/common/tiny.cps": TINY})
    assert pipeline.parse_archived(a).name == "tamper_dcp2"


def test_an_absolute_extends_is_found_under_abs_not_where_it_was(tmp_path: Path) -> None:
    gone = tmp_path / "elsewhere" / "tiny.cps"  # never written: the archive's copy is read
    stored = "includes/@abs/" + gone.as_posix().lstrip("/")
    a = archive_with(tmp_path, gone.as_posix(), {stored: TINY})
    assert pipeline.parse_archived(a).name == "tamper_dcp2"


def test_an_archive_before_d45_keeps_its_includes_beside_the_scenario(tmp_path: Path) -> None:
    a = archive_with(tmp_path, "defaults/tiny.cps", {"defaults/tiny.cps": TINY})
    assert pipeline.parse_archived(a).name == "tamper_dcp2"


@pytest.mark.parametrize("own", ["logs/main-node0.log", "plan.json", "evidence/main/runner.jsonl"])
def test_an_extends_never_reads_one_of_cptests_own_files(tmp_path: Path, own: str) -> None:
    a = archive_with(tmp_path, own, {own: TINY})
    with pytest.raises(ScenarioError, match=f"extends '{own}': not a scenario file"):
        pipeline.parse_archived(a)


def test_an_extends_outside_the_archive_is_not_read_from_the_machine(tmp_path: Path) -> None:
    (tmp_path / "results" / "tamper_dcp2" / "common.cps").parent.mkdir(parents=True)
    (tmp_path / "results" / "tamper_dcp2" / "common.cps").write_text(TINY)
    a = archive_with(tmp_path, "../common.cps", {})
    with pytest.raises(ScenarioError, match="cannot read extended file '../common.cps'"):
        pipeline.parse_archived(a)


def test_include_names_never_leave_the_includes_folder(tmp_path: Path) -> None:
    scenario = tmp_path / "suite" / "a.cps"
    for inc in ("x.cps", "../../x.cps", "logs/main-node0.log", "./a/../b.cps"):
        name = pipeline.include_name(tmp_path / "suite" / inc, scenario)
        assert name.startswith("includes/") and ".." not in Path(name).parts


def _prepared_includes(tmp_path: Path, extends: str) -> dict[str, str]:
    suite = tmp_path / "suite" / "qualification"
    suite.mkdir(parents=True)
    (suite / "s.cps").write_text(SCENARIO.replace('"defaults/tiny.cps"', f'"{extends}"'))
    return pipeline.prepare(suite / "s.cps", gpu_present=False).includes


def test_an_extends_above_the_scenario_names_no_directory_of_this_machine() -> None:
    """Every qualification scenario extends "../defaults/tiny.cps": its archive kept a second copy
    under includes/@abs/<this machine's path> until a GPU rerun showed it (results/_measure run16)."""
    scenario = REPO / "scenarios" / "qualification" / "dcp2_llama_kv1_eager.cps"
    includes = pipeline.prepare(scenario, gpu_present=False).includes
    assert list(includes) == ["includes/@up/defaults/tiny.cps"]
    assert not any(str(REPO).lstrip("/") in name for name in includes)


def test_an_extends_named_by_an_absolute_path_is_kept_by_that_path(tmp_path: Path) -> None:
    # The checkout's scenarios/ belongs to every scenario's tree, wherever the scenario lies.
    target = REPO / "scenarios" / "defaults" / "tiny.cps"
    includes = _prepared_includes(tmp_path, target.as_posix())
    assert "includes/@abs/" + target.as_posix().lstrip("/") in includes


def test_an_extends_above_a_scenario_outside_the_checkout_is_refused(tmp_path: Path) -> None:
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "common.cps").write_text(TINY)
    with pytest.raises(ScenarioError, match="lies outside the scenario tree; it was not read"):
        _prepared_includes(tmp_path, "../common.cps")
