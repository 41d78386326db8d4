"""cptest/report/startup.py on a real archive of SGLang 0.5.17 (results/_suite-check): the phases
of a cold start (JIT builds in the warm-up) and a warm one."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from cptest.report.startup import ORDER, render_table, startup

PACKED = Path(__file__).resolve().parents[2] / "results" / "_suite-check" / "files.tar.xz"


@pytest.fixture(scope="module")
def check(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """results/_suite-check unpacked (its files travel packed: docs/decisions.md D76)."""
    out = tmp_path_factory.mktemp("suite-check")
    with tarfile.open(PACKED) as tar:
        tar.extractall(out, filter="data")
    return out


def _one(check: Path, folder: str, scenario: str) -> Path:
    (archive,) = (check / folder / scenario).iterdir()
    return archive


def test_a_cold_start_spends_a_minute_in_the_first_forward_and_a_warm_one_does_not(check: Path) -> None:
    cold = startup(_one(check, "1-packed-cold", "dcp2_llama_kv1"))
    warm = startup(_one(check, "4-packed-warm", "dcp2_llama_kv1"))
    assert cold is not None and warm is not None
    assert cold.phases["warmup"] == 62 and warm.phases["warmup"] == 4
    assert cold.total_s == 125.9 and warm.total_s == 55.8
    assert cold.phases["graphs"] == 0  # CUDA graphs disabled: no capture lines
    # the phases add up to the total, up to the logs' one-second stamps
    assert abs(sum(v for v in cold.phases.values() if v is not None) - cold.total_s) < 1.0
    assert list(cold.phases) == list(ORDER)


def test_a_role_without_a_log_has_no_startup_and_the_table_lists_each_server(check: Path) -> None:
    archive = _one(check, "1-packed-cold", "sigterm_shutdown")
    assert startup(archive, "baseline") is None
    table = render_table([startup(archive)])
    assert table.splitlines()[2].startswith("| sigterm_shutdown | main | 24.1 | 28 |")
