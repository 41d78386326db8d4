"""CI checks on the committed evidence: every archive under results/ still says what it said.

For each archive (`results/<scenario>/<UTC time>-<hash>/`, skipping `_smoke`, which is the raw probe
smoke run and not an archive): re-checking the evidence reproduces verdict.json byte for byte, the
hashes match the manifest, and the manifest pins SGLang 0.5.17 on a named GPU with the `sglang`
engine label (a `reference` result must never pass for SGLang qualification). The README's verdict
table, once it exists, must agree with the archives.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from cptest import analyses, checks, pipeline
from cptest.plan.model import Plan

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
ARCHIVES = sorted(
    d
    for d in RESULTS.glob("*/*")
    if d.is_dir() and not d.parent.name.startswith("_") and (d / "verdict.json").is_file()
)
SGLANG_ARCHIVES = [
    d for d in ARCHIVES if json.loads((d / "plan.json").read_text())["main"]["engine"] == "sglang"
]
"""The SGLang qualification runs; archives of the CPU reference engine (if any are committed) are
checked for hashes, verdicts and labels only."""
PINNED_RELEASE = "0.5.17"
VERDICTS = {"pass", "fail", "unknown"}


def _id(d: Path) -> str:
    return f"{d.parent.name}/{d.name}"


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def test_there_is_committed_sglang_evidence():
    assert len(SGLANG_ARCHIVES) >= 5


def test_every_folder_under_results_is_an_archive_or_marked_as_not_one():
    # A run that died before verdict.json would otherwise be skipped silently by the tests below.
    for scenario_dir in RESULTS.iterdir():
        if scenario_dir.is_dir() and not scenario_dir.name.startswith("_"):
            for run in filter(Path.is_dir, scenario_dir.iterdir()):
                assert (run / "verdict.json").is_file(), f"{run} has no verdict.json"


@pytest.mark.parametrize("directory", ARCHIVES, ids=_id)
def test_rechecking_the_evidence_reproduces_verdict_json_byte_for_byte(directory: Path):
    # The held verdict: the seal's own, or the newest re-analysis `cptest check --write` put beside it.
    assert checks.check(directory).to_json() == analyses.current_verdict_file(directory).read_text()


@pytest.mark.parametrize("directory", ARCHIVES, ids=_id)
def test_every_archived_file_matches_the_manifest(directory: Path):
    assert [p.message for p in analyses.verify_archive(directory)] == []


@pytest.mark.parametrize("directory", ARCHIVES, ids=_id)
def test_every_archive_passes_what_publish_matrix_and_report_ask(directory: Path):
    # The seal, the plan's re-plan from the archived scenario (argv, env and serve included) and
    # the held verdict (a re-analysis's where one is beside the seal) recomputed from the evidence.
    judged = pipeline.judge(directory)
    assert judged.verdict.to_json() == analyses.current_verdict_file(directory).read_text()


@pytest.mark.parametrize("directory", SGLANG_ARCHIVES, ids=_id)
def test_manifest_pins_sglang_release_and_gpu_model(directory: Path):
    manifest = _json(directory / "manifest.json")
    env = manifest["environment"]
    assert manifest["pins"]["engine"] == "sglang"
    assert manifest["pins"]["release"] == PINNED_RELEASE
    assert env["sglang"] == PINNED_RELEASE, "the installed SGLang differs from the pinned release"
    assert env["sglang_wheel_sha256"] or env["sglang_record_sha256"]
    gpus = env["gpus"]
    assert gpus and all(isinstance(g, str) and g.strip() for g in gpus)
    assert manifest["scenario"] == directory.parent.name


@pytest.mark.parametrize("directory", ARCHIVES, ids=_id)
def test_verdict_is_labelled_with_the_engine_that_ran(directory: Path):
    # A reference-engine result must never read as SGLang qualification.
    engine = _json(directory / "plan.json")["main"]["engine"]
    assert _json(directory / "verdict.json")["engine"] == engine
    assert _json(directory / "manifest.json")["pins"]["engine"] == engine


@pytest.mark.parametrize("directory", SGLANG_ARCHIVES, ids=_id)
def test_verdict_is_labelled_sglang_and_its_status_is_known(directory: Path):
    verdict = _json(directory / "verdict.json")
    assert verdict["engine"] == "sglang" and verdict["release"] == PINNED_RELEASE
    assert verdict["status"] in VERDICTS
    assert all(v["status"] in VERDICTS for v in verdict["verdicts"])


@pytest.mark.parametrize("directory", SGLANG_ARCHIVES, ids=_id)
def test_archived_plan_is_a_valid_plan_for_the_gpus_it_ran_on(directory: Path):
    p = Plan.model_validate_json((directory / "plan.json").read_text())
    gpus = _json(directory / "manifest.json")["environment"]["gpus"]
    assert p.scenario == directory.parent.name
    # Every GPU a node was given was on the machine; a physical server had a GPU per rank of a node,
    # a co-located one shared them (docs/placement.md).
    assert {g for s in p.servers() for n in s.nodes for g in n.gpu_ids} <= set(range(len(gpus)))
    for s in p.servers():
        assert s.colocated or s.world_size // len(s.nodes) <= len(gpus)
        assert not s.colocated or len(s.nodes) == s.world_size


# ------------------------------------------------------------------------------ README table
def _readme_verdicts(readme: Path = ROOT / "README.md") -> dict[str, str]:
    """Rows of the README table whose header has `scenario` and `verdict` columns: scenario name ->
    verdict (loose parsing: backticks, links and bold are stripped, case-insensitive)."""
    rows: dict[str, str] = {}
    if not readme.is_file():
        return rows
    cols: tuple[int, int] | None = None
    pending: tuple[int, int] | None = None
    for line in readme.read_text().splitlines():
        if not line.lstrip().startswith("|"):
            cols = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        heads = [c.lower() for c in cells]
        if all(re.fullmatch(r":?-+:?", c) for c in cells):
            # A separator row: the row above was a header; keep the columns only if it had ours.
            cols = pending
            continue
        ours = {"scenario", "verdict"} <= set(heads)
        pending = (heads.index("scenario"), heads.index("verdict")) if ours else None
        if cols is None or len(cells) <= max(cols):
            continue
        name = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cells[cols[0]]).strip("`* ")
        raw = cells[cols[1]]
        verdict = re.sub(r"[`*]", "", raw).strip().lower().split(" ")[0] if raw else ""
        if re.fullmatch(r"[A-Za-z0-9_]+", name) and verdict in VERDICTS:
            rows[name] = verdict
    return rows


def _latest_archive_verdicts() -> dict[str, str]:
    latest: dict[str, Path] = {}
    for d in SGLANG_ARCHIVES:  # sorted: archive names start with their UTC time
        latest[d.parent.name] = d
    # The standing verdict: a re-analysis (`cptest check --write`) may have changed the seal's.
    return {name: _json(analyses.current_verdict_file(d))["status"] for name, d in latest.items()}


def test_readme_verdict_table_agrees_with_the_archives():
    table = _readme_verdicts()
    assert table, "README.md has no table with `scenario` and `verdict` columns"
    archived = _latest_archive_verdicts()
    rows = {name: verdict for name, verdict in table.items() if name in archived}
    assert rows, f"the README table names none of the archived scenarios {sorted(archived)}"
    assert rows == {name: archived[name] for name in rows}
    assert sorted(archived) == sorted(rows), "every archived scenario has a row in the README table"


def test_readme_table_parser_reads_loose_rows(tmp_path: Path):
    # The parser must find rows however the lead formats them; a table it cannot read would skip.
    readme = tmp_path / "README.md"
    readme.write_text(
        "| scenario | verdict | why |\n| --- | --- | --- |\n"
        "| `dcp2_llama_kv1` | **FAIL** | capacity |\n"
        "| [tp2_llama_kv1](results/tp2_llama_kv1/x) | pass (3/3) | ok |\n"
        "| command | what it does |\n|---|---|\n"
        "| `run` | pass |\n"
        "\n| scenario | engine | verdict |\n|---|---|---|\n| sigterm_shutdown | sglang | **PASS** |\n"
    )
    assert _readme_verdicts(readme) == {
        "dcp2_llama_kv1": "fail", "tp2_llama_kv1": "pass", "sigterm_shutdown": "pass",
    }  # fmt: skip
