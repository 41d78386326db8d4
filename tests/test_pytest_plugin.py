"""The pytest plugin (`cptest/testing/pytest_plugin.py`, entry point `pytest11: cptest`): `.cps` files
as pytest items. Each test runs an inner pytest session with pytester, in its own folder (no ini file
above it, so this repository's `addopts` and `testpaths` do not apply unless a test writes its own).
"""

from __future__ import annotations

import json
import shutil
import socket
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy  # noqa: F401  (see below)
import pytest

import cptest.run.runner  # noqa: F401  (see below)
from cptest import pipeline
from cptest.errors import RunError
from cptest.lang import parse_file, parse_text
from cptest.plan import plan
from cptest.testing import pytest_plugin
from cptest.testing.ports import free_port
from cptest.verdict import Verdict, scenario_verdict

pytest_plugins = ["pytester"]

# pytester's in-process sessions drop, when they end, every module imported during them; numpy's
# extension cannot be loaded twice in a process. What the plugin imports lazily is imported here,
# outside them, so that every session finds it loaded. The runs (engine processes, torch, signal
# handlers) go in a child pytest (`runpytest_subprocess`), as a user's would.

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"

# The smallest scenario the reference engine runs: one rank, a 1-layer model of width 64, two
# requests of four tokens (about 15 s on 2 cores, most of it starting the server).
TINY = """cptest 1
scenario plugin_tiny {
  engine reference
  model synthetic llama {
    layers 1
    hidden 64
    heads 2
    kv_heads 1
    head_dim 32
    vocab 256
    intermediate 128
    seed 1
  }
  topology {
    gpus 1
    tp 1
  }
  baseline none
  workload {
    requests 2
    concurrency 2
    prompt_tokens uniform(8, 16)
    output_tokens 4
    sampling greedy
    timeout 60s
  }
  expect {
    launch accepted
    serving all_complete
    EXTRA
  }
}
"""

# DCP2 with 4 KV heads (> tp/dcp) expecting generation parity: SGLang 0.5.17 was observed to break
# it (rule mha_dcp_kv_not_replicated, observed) and no backend is set (dcp_backend_without_dcp_path,
# inferred).
OBSERVED = """cptest 1
scenario lint_observed {
  engine sglang "0.5.17"
  model synthetic llama {
    layers 1
    hidden 64
    heads 4
    kv_heads 4
    head_dim 16
    vocab 256
    intermediate 128
  }
  topology {
    gpus 2
    tp 2
    dcp 2
  }
  baseline {
    tp 2
  }
  workload {
    requests 2
    concurrency 2
    prompt_tokens uniform(8, 16)
    output_tokens 4
  }
  expect {
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
"""

# attn_cp 2 without --enable-prefill-cp, expecting rows split: only an inferred rule contradicts it.
INFERRED = """cptest 1
scenario lint_inferred {
  engine sglang "0.5.17"
  model synthetic qwen3 {
    layers 1
    hidden 64
    heads 2
    kv_heads 2
    head_dim 32
    vocab 256
    intermediate 128
  }
  topology {
    gpus 2
    tp 2
    attn_cp 2
  }
  baseline none
  workload {
    requests 2
    concurrency 2
    prompt_tokens uniform(64, 128)
    output_tokens 4
  }
  expect {
    rows split zigzag
  }
}
"""


def tiny(extra: str = "") -> str:
    return TINY.replace("    EXTRA\n", f"    {extra}\n" if extra else "")


def listed(result: pytest.RunResult) -> list[str]:
    """The node ids `--collect-only -q` printed."""
    return [line for line in result.outlines if "::" in line]


def test_the_entry_point_registers_the_plugin(pytester: pytest.Pytester) -> None:
    # Registered by `[project.entry-points.pytest11]`: no `-p` needed, in any pytest run.
    config = pytester.parseconfigure()
    assert config.pluginmanager.get_plugin("cptest") is pytest_plugin


def checkout_scenarios(pytester: pytest.Pytester) -> None:
    """The repository's scenarios/ as `scenarios` of the inner session, by a link: their real paths stay
    in the checkout, whose scenarios/ is the tree their `extends "../defaults/tiny.cps"` may read
    (D84). A copy outside the checkout would be a suite without its defaults, refused as such
    (`test_a_copy_of_the_scenarios_outside_the_checkout_is_refused_its_shared_defaults`)."""
    (pytester.path / "scenarios").symlink_to(SCENARIOS, target_is_directory=True)


def test_collect_only_lists_each_scenario_its_checks_and_no_fragment(pytester: pytest.Pytester) -> None:
    checkout_scenarios(pytester)
    result = pytester.runpytest("scenarios", "--collect-only", "-q")
    assert result.ret == 0
    ids = listed(result)
    assert [i for i in ids if i.startswith("scenarios/dcp2_llama_kv1.cps::")] == [
        f"scenarios/dcp2_llama_kv1.cps::{name}" for name in (
            "validate", "lint", "contract[launch]", "contract[rows]", "contract[dcp_handoff]",
            "contract[capacity]", "contract[generation]", "contract[graph:decode]", "contract[serving]",
            "contract[shutdown]", "contract[log:contains]")]  # fmt: skip
    # Every scenario, in the top folder and under rules/, with one item per planned expectation;
    # the defaults fragments are not scenarios and give no item.
    files = sorted(p for p in (pytester.path / "scenarios").rglob("*.cps") if "defaults" not in p.parts)
    assert len(files) > 20
    for f in files:
        rel = f.relative_to(pytester.path).as_posix()
        mine = [i for i in ids if i.startswith(rel + "::")]
        kinds = [e.kind for e in plan(parse_file(f)).expectations]
        assert mine[:2] == [f"{rel}::validate", f"{rel}::lint"]
        assert [m.split("::contract[")[1].split(":")[0].split("#")[0].rstrip("]") for m in mine[2:]] == kinds
    assert not [i for i in ids if "/defaults/" in i]
    assert len(ids) == sum(2 + len(plan(parse_file(f)).expectations) for f in files)


def test_every_scenario_of_the_repository_passes_without_a_run(pytester: pytest.Pytester) -> None:
    checkout_scenarios(pytester)
    result = pytester.runpytest("scenarios")
    outcomes = result.parseoutcomes()
    assert result.ret == 0, result.stdout.str()
    assert outcomes.get("failed", 0) == 0 and outcomes["passed"] > 200


def test_a_copy_of_the_scenarios_outside_the_checkout_is_refused_its_shared_defaults(
        pytester: pytest.Pytester) -> None:
    # The checkout's scenarios/ is trusted where it lies; a copy elsewhere is a suite of its own, and
    # an extends above a scenario's folder leaves that scenario's tree (D84).
    shutil.copytree(SCENARIOS / "qualification", pytester.path / "suite" / "qualification")
    shutil.copytree(SCENARIOS / "defaults", pytester.path / "suite" / "defaults")
    result = pytester.runpytest("suite/qualification/dcp2_llama_kv1_eager.cps")
    result.assert_outcomes(failed=1, skipped=1)  # validate fails; lint skips: it does not parse
    result.stdout.fnmatch_lines([
        "*dcp2_llama_kv1_eager.cps: validate*",
        "suite/qualification/dcp2_llama_kv1_eager.cps:*: extends '../defaults/tiny.cps' lies outside"
        " the scenario tree; it was not read"])


def test_repeated_contracts_get_names_that_tell_them_apart() -> None:
    scenario = parse_text(tiny('log absent "Traceback"\n    log absent "CUDA error"\n    '
                               'log contains "ready"\n    graph decode disabled'), "x.cps")
    assert pytest_plugin.contract_ids(scenario) == [
        "launch", "graph:decode", "serving", "log:absent", "log:absent#2", "log:contains"]


def test_a_bad_scenario_fails_validate_with_file_line_col_and_a_caret(pytester: pytest.Pytester) -> None:
    pytester.makefile(".cps", bad=tiny().replace("    tp 1\n", "    tp 3\n"))
    result = pytester.runpytest("bad.cps", "-rfs")
    result.assert_outcomes(failed=1, skipped=1)  # validate fails; lint has nothing to judge
    result.stdout.fnmatch_lines([
        "*_ bad.cps: validate _*",
        "bad.cps:15:5: topology: gpus 1 != tp 3 x pp 1",
        "      gpus 1",
        "      ^^^^^^",
        "  expected: gpus 3",
        "FAILED bad.cps::validate - bad.cps:15:5: topology: gpus 1 != tp 3 x pp 1",
        "SKIPPED [1] bad.cps:1: the scenario does not parse (see ::validate)",
    ])
    assert "Traceback" not in result.stdout.str()


def test_a_scenario_that_does_not_plan_fails_its_contract_items(pytester: pytest.Pytester) -> None:
    # It parses (validate passes: releases are the plan's business), but no plan exists for it.
    pytester.makefile(".cps", old=OBSERVED.replace('"0.5.17"', '"0.4.0"'))
    result = pytester.runpytest("old.cps", "-v")
    result.stdout.fnmatch_lines(["*old.cps::validate PASSED*", "*old.cps::lint FAILED*",
                                 "*old.cps::contract?generation? FAILED*"])
    result.stdout.fnmatch_lines(['*old.cps:3:3: unknown SGLang release "0.4.0" (known: 0.5.17, 0.5.23)'])


def test_an_observed_lint_finding_fails_and_an_inferred_one_warns(pytester: pytest.Pytester) -> None:
    pytester.makefile(".cps", observed=OBSERVED, inferred=INFERRED)
    result = pytester.runpytest("observed.cps", "inferred.cps", "-v")
    result.stdout.fnmatch_lines(["observed.cps::lint FAILED*", "inferred.cps::lint PASSED*"])
    out = result.stdout.str()
    failure = out.split("observed.cps: lint ___")[1].split("warnings summary")[0]
    # The failure is the observed finding, positioned at the expectation; not the inferred one.
    assert "observed.cps:28:5: mha_dcp_kv_not_replicated:" in failure
    assert "[observed: results/dcp2_llama_kv4/" in failure
    assert "dcp_backend_without_dcp_path" not in failure
    # Inferred findings are pytest warnings at the scenario's line, of both files.
    summary = out.split("warnings summary")[1]
    assert "inferred.cps:26: CpsLintWarning: attn_cp_without_prefill_cp:" in summary
    assert "observed.cps:28: CpsLintWarning: dcp_backend_without_dcp_path:" in summary
    assert result.parseoutcomes()["warnings"] == 2


def test_inferred_findings_fail_when_warnings_are_errors(pytester: pytest.Pytester) -> None:
    pytester.makefile(".cps", inferred=INFERRED)
    result = pytester.runpytest("inferred.cps", "-W", "error::cptest.testing.pytest_plugin.CpsLintWarning")
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(["*attn_cp_without_prefill_cp*"])


def test_junitxml_holds_every_item_and_the_failure_text(pytester: pytest.Pytester) -> None:
    pytester.makefile(".cps", good=tiny(), bad=tiny().replace("    tp 1\n", "    tp 3\n"))
    result = pytester.runpytest(".", "--junitxml=out.xml")
    assert result.ret == 1
    cases = ET.parse(pytester.path / "out.xml").getroot().iter("testcase")
    by_name = {(c.get("classname"), c.get("name")): c for c in cases}
    assert set(by_name) == {("bad.cps", "validate"), ("bad.cps", "lint"), ("good.cps", "validate"),
                            ("good.cps", "lint"), ("good.cps", "contract[launch]"),
                            ("good.cps", "contract[serving]")}
    failure = by_name[("bad.cps", "validate")].find("failure")
    assert failure is not None and "bad.cps:15:5: topology: gpus 1 != tp 3 x pp 1" in (failure.text or "")
    assert by_name[("bad.cps", "lint")].find("skipped") is not None
    # A contract item records what the plan resolved it to.
    serving = by_name[("good.cps", "contract[serving]")]
    props = {p.get("name"): p.get("value") for p in serving.iter("property")}
    assert props["cptest_engine"] == "reference"
    assert json.loads(props["cptest_expectation"])["kind"] == "serving"


def test_scenarios_are_collected_only_under_named_paths(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ntestpaths = tests\n")
    pytester.mkdir("tests")
    (pytester.path / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
    # A deliberately broken fixture of a Python test, inside testpaths.
    (pytester.path / "tests" / "broken.cps").write_text("cptest 1\nscenario {\n")
    pytester.mkdir("scenarios")
    (pytester.path / "scenarios" / "good.cps").write_text(tiny())
    # An archive's copy of a scenario (its includes live in the archive): `cptest check` judges it.
    archive = pytester.path / "scenarios" / "results" / "good" / "20260101T000000Z-0123abcd"
    archive.mkdir(parents=True)
    for name in ("manifest.json", "plan.json"):
        (archive / name).write_text("{}")
    (archive / "scenario.cps").write_text("cptest 1\nscenario {\n")

    bare = pytester.runpytest("--collect-only", "-q")  # testpaths: the repo's own test command
    assert listed(bare) == ["tests/test_x.py::test_x"]
    named = pytester.runpytest(".", "--collect-only", "-q")
    assert listed(named) == ["scenarios/good.cps::validate", "scenarios/good.cps::lint",
                             "scenarios/good.cps::contract[launch]", "scenarios/good.cps::contract[serving]",
                             "tests/test_x.py::test_x"]
    assert listed(pytester.runpytest("tests", "--collect-only", "-q")) == ["tests/test_x.py::test_x"]
    # Named itself, a file inside testpaths is collected (and fails, as asked).
    one = pytester.runpytest("tests/broken.cps")
    one.assert_outcomes(failed=1, skipped=1)


def test_a_fragment_named_alone_is_one_skipped_item(pytester: pytest.Pytester) -> None:
    shutil.copytree(SCENARIOS / "defaults", pytester.path / "defaults")
    result = pytester.runpytest("defaults/tiny.cps", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED ?1? defaults/tiny.cps:1: a defaults file, not a scenario*"])


def test_verdicts_map_to_pass_fail_and_skip_from_one_run(pytester: pytest.Pytester,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # The run stage replaced by one that returns set verdicts (the in-process session uses this
    # process's cptest.pipeline): each status's mapping, without an engine.
    runs: list[Path] = []

    def run_scenario(planned: Any, out: Path, launcher: Any, **_: Any) -> pipeline.Outcome:
        runs.append(out)
        verdicts = [Verdict(checker="launch", status="pass", reason="main became ready"),
                    Verdict(checker="serving", status="unknown", reason="not judged: the launch failed on "
                            "an infrastructure cause (port_taken)", source="tiny.cps:29:5"),
                    Verdict(checker="log", status="fail", reason="'x' not found in any log of main",
                            source="tiny.cps:30:5")]
        return pipeline.Outcome(scenario_verdict("plugin_tiny", "reference", "builtin", verdicts), out,
                                RunError("interrupted by Ctrl-C; every started process was torn down"))

    monkeypatch.setattr(pipeline, "run_scenario", run_scenario)
    pytester.makefile(".cps", tiny=tiny('log contains "x"'))
    result = pytester.runpytest("tiny.cps", "-rs", "--cptest-run", "--cptest-results", "res")
    result.assert_outcomes(passed=3, skipped=1, failed=1)
    assert len(runs) == 1
    result.stdout.fnmatch_lines([
        "*_ tiny.cps: contract?log:contains? _*",
        "FAIL log: 'x' not found in any log of main",
        "  declared at tiny.cps:30:5",
        f"  archive: {runs[0]}",
        "  the run was stopped: interrupted by Ctrl-C; every started process was torn down",
    ])
    # Unknown is a skip, its text on one line, at the expectation's line.
    result.stdout.fnmatch_lines([
        "SKIPPED ?1? tiny.cps:29: UNKNOWN serving: not judged: the launch failed on an infrastructure cause "
        f"(port_taken); declared at tiny.cps:29:5; archive: {runs[0]}; the run was stopped: interrupted*"])


def test_a_run_that_the_machine_cannot_give_is_skipped_not_failed(pytester: pytest.Pytester) -> None:
    # The main server's port is taken: preflight stops the run before launch (unknown, exit 3 in the
    # CLI); each contract item is a skip naming the cause, and nothing is archived.
    pytester.makefile(".cps", tiny=tiny())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = pytester.runpytest_subprocess("tiny.cps", "-rs", "--cptest-run", "--cptest-results", "res",
                                    "--cptest-models", "models", f"--cptest-ports={port},{free_port()}")
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines([f"SKIPPED * tiny.cps:*: not run: unknown (port*{port}*"] * 2)
    assert not list((pytester.path / "res").rglob("verdict.json"))


def test_a_real_run_on_the_reference_engine_judges_each_contract_once(pytester: pytest.Pytester) -> None:
    pytest.importorskip("torch")  # the reference engine
    # `launch` and `serving` hold; the log line is never printed: a real FAIL with its reason.
    pytester.makefile(".cps", tiny=tiny('log contains "a line no engine prints"'))
    result = pytester.runpytest_subprocess(
        "tiny.cps", "-v", "--cptest-run", "--cptest-engine", "reference", "--cptest-results", "res",
        "--cptest-models", "models", f"--cptest-ports={free_port()},{free_port()}", "--junitxml=out.xml",
        timeout=300)
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*tiny.cps::contract?launch? PASSED*",
                                 "*tiny.cps::contract?serving? PASSED*",
                                 "*tiny.cps::contract?log:contains? FAILED*"])
    archives = [p.parent for p in (pytester.path / "res").rglob("verdict.json")]
    assert len(archives) == 1, "the scenario must run once for all its contract items"
    verdict = json.loads((archives[0] / "verdict.json").read_text())
    log = next(v for v in verdict["verdicts"] if v["checker"] == "log")
    assert log["status"] == "fail"
    failure = result.stdout.str().split("tiny.cps: contract[log:contains] ___")[1]
    assert f"FAIL log: {log['reason']}" in failure
    assert f"archive: {archives[0]}" in failure
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "out.xml").getroot().iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["contract[serving]"].iter("property")}
    assert props["cptest_status"] == "pass" and Path(props["cptest_archive"]).name == archives[0].name
