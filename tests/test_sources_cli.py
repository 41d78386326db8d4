"""`cptest sources check` against the pinned SGLang 0.5.17 wheel (cptest/sources_cli.py).

The wheel is fetched once into the user cache (as the command does); where it cannot be fetched the
wheel tests skip, except under CI=true, where they fail: CI reaches PyPI, so a missing wheel there
is a fault to see, not a test to drop."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from cptest.cli import main
from cptest.engines.sglang import citations, sources
from tests.engines.sglang.fake_source import fake_source

PIN = citations.load("0.5.17").wheel


@pytest.fixture(scope="module")
def pinned_wheel() -> Path:
    try:
        return sources.fetch(PIN)
    except sources.SourceUnavailable as e:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must reach the pinned wheel: {e}")
        pytest.skip(f"the pinned wheel cannot be fetched here: {e}")


def _check(*args: str) -> tuple[int, dict]:
    r = CliRunner().invoke(main, ["sources", "check", *args, "--json"])
    return r.exit_code, json.loads(r.stdout)


def test_every_registered_citation_holds_in_the_pinned_wheel(pinned_wheel: Path):
    code, out = _check("--wheel", str(pinned_wheel))
    assert (code, out["problems"]) == (0, [])
    assert out["citations"] == len(citations.load("0.5.17").citations)
    assert out["flag_declarations"] == len(citations.flag_declarations("0.5.17")) > 400


def test_a_flag_declared_one_line_lower_is_named_with_its_flag_table_line(pinned_wheel: Path, tmp_path: Path):
    flag = next(c for c in citations.flag_declarations("0.5.17") if c.key == "flag:--dcp-size")
    with zipfile.ZipFile(pinned_wheel) as wheel:
        wheel.extract(flag.wheel_path, tmp_path)
    path = tmp_path / flag.wheel_path
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:flag.start - 1] + ["\n"] + lines[flag.start - 1:]))

    code, out = _check("--wheel", str(tmp_path))
    assert code == 1
    found = {p["key"]: p for p in out["problems"]}
    assert found[flag.key]["status"] == "moved" and flag.start + 1 in found[flag.key]["found_at"]
    where = found[flag.key]["cited_by"][0]
    table = (citations.ROOT / where.rpartition(":")[0]).read_text().splitlines()
    assert '"--dcp-size": {' in table[int(where.rpartition(":")[2]) - 1]


def test_a_blank_line_above_a_cited_range_is_named_with_where_its_anchor_went(pinned_wheel: Path,
                                                                             tmp_path: Path):
    registry = citations.load("0.5.17")
    with zipfile.ZipFile(pinned_wheel) as wheel:
        for name in sorted({c.wheel_path for c in registry.citations}):
            wheel.extract(name, tmp_path)
    moved = registry.get("parallel_state.moe_dp_is_attn_cp")
    path = tmp_path / moved.wheel_path
    lines = path.read_text().splitlines(keepends=True)
    was = next(i for i in range(moved.start, moved.end + 1) if moved.anchor in lines[i - 1])
    path.write_text("".join(lines[:moved.start - 1] + ["\n"] + lines[moved.start - 1:]))

    code, out = _check("--wheel", str(tmp_path))
    assert code == 1
    found = {p["key"]: p for p in out["problems"]}
    assert found[moved.key]["status"] == "moved"
    assert found[moved.key]["found_at"] == [was + 1]
    assert "docs/sglang.md" in " ".join(found[moved.key]["cited_by"])
    assert {p["file"] for p in out["problems"]} == {moved.file}  # other files are untouched


def test_a_wheel_that_is_not_there_or_not_the_pinned_one_is_exit_3(tmp_path: Path):
    assert _check("--wheel", str(tmp_path / PIN.filename))[0] == 3
    other = tmp_path / PIN.filename
    other.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: a wheel, but not the pinned one
    code, out = _check("--wheel", str(other))
    assert code == 3 and "sha256" in json.dumps(out)


def test_the_cached_wheel_is_verified_before_use(tmp_path: Path):
    (tmp_path / PIN.filename).write_bytes(b"not the wheel")
    with pytest.raises(sources.SourceUnavailable, match="not the pinned"):
        sources.fetch(PIN, tmp_path)


def test_the_cache_follows_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert sources.cache_dir() == tmp_path / "cptest" / "sglang-wheels"


def test_installed_reads_the_sglang_package_this_interpreter_imports(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch):
    root = fake_source(citations.load("0.5.17"), tmp_path)
    (root / "sglang" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(root))
    code, out = _check("--installed")
    assert (code, out["problems"]) == (0, [])
    assert str(root / "sglang") in out["source"]


def test_the_environment_names_a_local_wheel_or_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(sources.WHEEL_ENV, str(fake_source(citations.load("0.5.17"), tmp_path)))
    assert _check()[0] == 0


def test_a_folder_without_sglang_is_no_source(tmp_path: Path):
    assert _check("--wheel", str(tmp_path))[0] == 3


def test_pip_failing_to_fetch_is_exit_3_with_what_pip_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution found for sglang")
    monkeypatch.setattr(sources.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(sources.SourceUnavailable, match="No matching distribution") as e:
        sources.fetch(PIN, tmp_path)
    assert e.value.exit_code == 3
