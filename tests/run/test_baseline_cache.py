"""Specification of cptest/run/baseline_cache.py and its use by run_plan: what makes a key, what is kept,
what a reused baseline leaves in the archive."""

from __future__ import annotations

import io
import json
from pathlib import Path

from cptest.evidence import Lifecycle, read_records
from cptest.outline import Logger, TerminalSink
from cptest.plan.model import Plan
from cptest.run.baseline_cache import BaselineCache, baseline_key
from cptest.run.process import ProcessLauncher
from cptest.run.runner import RunOptions, run_plan
from cptest.store import Layout

from conftest import fake_server, free_port, make_plan, requests  # isort: skip
from test_runner import OPTS  # isort: skip

ENV = {"weights_sha256": "ab" * 32, "sglang": "0.5.17", "torch": "2.9.1", "gpus": ["NVIDIA H200"] * 2}


def plan_with_ports(main_port: int, baseline_port: int, n: int = 4) -> Plan:
    return make_plan(fake_server("main", main_port), baseline=fake_server("baseline", baseline_port), n=n)


def key_of(plan: Plan, env: dict = ENV) -> str | None:
    got = baseline_key(plan, env)
    return None if got is None else got[0]


def test_the_key_ignores_the_http_port_a_suite_moves() -> None:
    assert key_of(plan_with_ports(30000, 30100)) == key_of(plan_with_ports(31000, 31100))


def test_the_key_changes_with_the_workload_the_weights_and_the_install() -> None:
    plan = plan_with_ports(30000, 30100)
    fewer = plan_with_ports(30000, 30100, n=3)
    longer = plan.model_copy(update={"workload": plan.workload.model_copy(
        update={"requests": requests(4, max_new=5)})})
    keys = {
        key_of(plan),
        key_of(fewer),
        key_of(longer),
        key_of(plan, ENV | {"weights_sha256": "cd" * 32}),
        key_of(plan, ENV | {"sglang": "0.5.18"}),
        key_of(plan, ENV | {"gpus": ["NVIDIA H100"] * 2}),
    }
    assert None not in keys and len(keys) == 6


def test_the_key_changes_with_the_baselines_serve_options_but_not_the_mains() -> None:
    plan = plan_with_ports(30000, 30100)
    other_main = make_plan(fake_server("main", 30000, "--token-delay", "0.01"),
                           baseline=fake_server("baseline", 30100), n=4)
    other_baseline = make_plan(fake_server("main", 30000),
                               baseline=fake_server("baseline", 30100, "--token-delay", "0.01"), n=4)
    assert key_of(other_main) == key_of(plan)
    assert key_of(other_baseline) != key_of(plan)


def test_no_key_without_a_baseline_or_without_a_weights_hash() -> None:
    assert key_of(make_plan(fake_server("main", 30000))) is None
    assert key_of(plan_with_ports(30000, 30100), ENV | {"weights_sha256": None}) is None


def run(plan: Plan, archive: Path, cache: BaselineCache) -> tuple[object, str]:
    opts = RunOptions(**{**OPTS.__dict__, "baseline_cache": cache, "baseline_key": baseline_key(plan, ENV)})
    out = io.StringIO()
    outcome = run_plan(plan, archive, launcher=ProcessLauncher(), log=Logger([TerminalSink(out)]),
                       options=opts)
    return outcome, out.getvalue()


def lifecycle(archive: Path, role: str) -> list[Lifecycle]:
    return [r for r in read_records(Layout(archive).runner_file(role))[0] if isinstance(r, Lifecycle)]


def test_a_clean_baseline_is_kept_then_reused_and_the_archive_holds_its_evidence(tmp_path: Path) -> None:
    cache = BaselineCache(tmp_path / "cache")
    plan = plan_with_ports(free_port(), free_port())
    key = key_of(plan)
    first, _ = run(plan, tmp_path / "first", cache)
    assert first.baseline.ready and first.baseline.reused is None
    cached = [e for e in lifecycle(tmp_path / "first", "main") if e.event == "baseline_cached"]
    assert [e.detail["key"] for e in cached] == [key]
    stored = json.loads((tmp_path / "cache" / key / "key.json").read_text())
    assert stored["archive"] == str(tmp_path / "first") and stored["material"]["weights_sha256"] == "ab" * 32

    # The second run's plan moves every port (as a suite does): same key, and its baseline port is
    # left closed, so a baseline that were launched anyway would be a second process on record.
    again = plan_with_ports(free_port(), free_port())
    second, said = run(again, tmp_path / "second", cache)
    assert second.baseline.reused == key and "baseline reused from the cache" in said
    reused = [e for e in lifecycle(tmp_path / "second", "main") if e.event == "baseline_reused"]
    assert [e.detail["key"] for e in reused] == [key]
    assert reused[0].detail["archive"] == str(tmp_path / "first")
    first_base, second_base = Layout(tmp_path / "first"), Layout(tmp_path / "second")
    assert second_base.runner_file("baseline").read_bytes() == first_base.runner_file("baseline").read_bytes()
    assert (second_base.logs_dir / "baseline-node0.log").read_bytes() == \
        (first_base.logs_dir / "baseline-node0.log").read_bytes()
    # The main server still ran for real: its own lifecycle, not a copy.
    assert any(e.event == "ready" for e in lifecycle(tmp_path / "second", "main"))
    assert first_base.runner_file("main").read_bytes() != second_base.runner_file("main").read_bytes()


def test_a_baseline_that_did_not_come_up_is_not_kept(tmp_path: Path) -> None:
    cache = BaselineCache(tmp_path / "cache")
    plan = make_plan(fake_server("main", free_port()),
                     baseline=fake_server("baseline", free_port(), "--reject", "no such layout"), n=2)
    outcome, _ = run(plan, tmp_path / "a", cache)
    assert not outcome.baseline.ready
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []
    assert not any(e.event == "baseline_cached" for e in lifecycle(tmp_path / "a", "main"))


def test_a_half_written_entry_is_a_miss(tmp_path: Path) -> None:
    cache = BaselineCache(tmp_path / "cache")
    (tmp_path / "cache" / "k").mkdir(parents=True)
    (tmp_path / "cache" / "k" / "key.json").write_text("{not json")
    assert cache.lookup("k") is None and cache.lookup("absent") is None
