"""The pytest plugin (entry point `pytest11: cptest`): `.cps` scenario files as test items, so that
`pytest scenarios/` and pytest's own `--junitxml` fit an existing CI (docs/pytest.md).

Per scenario file, pytest lists

    scenarios/dcp2_llama_kv1.cps::validate              cptest validate: parse and check
    scenarios/dcp2_llama_kv1.cps::lint                  cptest lint: an `observed` finding fails,
                                                        an `inferred` one is a pytest warning
    scenarios/dcp2_llama_kv1.cps::contract[rows]        one per declared expectation: without
    scenarios/dcp2_llama_kv1.cps::contract[log:absent]  --cptest-run it compiles (the plan resolves
                                                        it for the engine); with it, its verdict

With `--cptest-run` each scenario runs once (the first contract item starts it; the others read the
same archive): pass is pass, fail is fail with the verdict's reason, unknown is a skip, because
unknown is what cptest says when the machine, not the engine, stopped the judgement.

What is collected: a `.cps` file only under a path named on pytest's command line (a bare `pytest`
or `python -m pytest` runs `testpaths` and collects no scenario), never a `defaults` fragment (it
is checked through every scenario that `extends` it), never a copy inside an archive (`cptest
check` judges archives), and never one inside `testpaths` unless the file itself is named: the
`.cps` files there are the Python tests' fixtures, some deliberately broken.

This module is imported by every pytest run of an environment that has cptest installed: it
imports nothing of cptest at import time (the stages are imported where an item needs them).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    from cptest.errors import CptestError
    from cptest.pipeline import Prepared
    from cptest.scenario import Scenario
    from cptest.verdict import Verdict

SUFFIX = ".cps"


class CpsLintWarning(UserWarning):
    """A lint finding of an `inferred` rule (read in SGLang's source, not yet seen): the run goes
    ahead, as `cptest run` does. `-W error::cptest.testing.pytest_plugin.CpsLintWarning` makes
    these fail too."""


class CpsFailure(Exception):
    """A scenario item's failure: its text is what cptest prints (file:line:col, caret, hint; or a
    verdict's reason), shown without a Python traceback."""


# ------------------------------------------------------------------------------------ options
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cptest", "cptest scenario files (.cps)")
    group.addoption("--cptest-run", action="store_true", default=False,
                    help="run each collected scenario once; each contract item is its verdict")
    group.addoption("--cptest-engine", choices=("sglang", "reference"), default=None,
                    help="the engine to plan and run on (default: the scenario's; with --cptest-run and "
                         "no GPU, sglang scenarios run on the CPU reference engine, as `cptest run`)")
    group.addoption("--cptest-results", default=None, metavar="DIR",
                    help="where --cptest-run archives go (default: .cptest/runs, as `cptest run`; "
                         "never the published results/)")
    group.addoption("--cptest-models", default=None, metavar="DIR",
                    help="the model store (default $CPTEST_MODELS, else .cptest/models in the checkout)")
    group.addoption("--cptest-ports", default=None, metavar="MAIN,BASELINE",
                    help="HTTP ports of the main and baseline servers (default: a free port slot "
                         "from 30000,30100, claimed for the run as `cptest run` does)")
    group.addoption("--cptest-ignore-lint", action="store_true", default=False,
                    help="run scenarios even when lint finds what the release was observed to do")
    group.addoption("--cptest-allow-unsafe", action="store_true", default=False,
                    help="run scenarios declared `unsafe` (their env or flags load code or config)")


# ------------------------------------------------------------------------------------ collection
def pytest_configure(config: pytest.Config) -> None:
    _placement(config)  # a malformed --cptest-ports is a usage error now, not an error of every item


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.File | None:
    if file_path.suffix != SUFFIX or not _wanted(file_path, parent.config):
        return None
    if _in_archive(file_path):
        return None
    if _is_fragment(file_path):
        # Named on its own, it gets one skipped item saying why, rather than pytest's "not found".
        named = file_path.resolve() in _named_paths(parent.config)
        return FragmentFile.from_parent(parent, path=file_path) if named else None
    return ScenarioFile.from_parent(parent, path=file_path)


def _named_paths(config: pytest.Config) -> list[Path]:
    """The paths on pytest's command line (node ids without their `::` part); none when pytest ran
    on `testpaths` or the invocation directory."""
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return []
    base = config.invocation_params.dir
    return [(base / a.split("::", 1)[0]).resolve() for a in config.args]


def _wanted(path: Path, config: pytest.Config) -> bool:
    """Under a path named on the command line, and not inside `testpaths` unless named itself."""
    named = _named_paths(config)
    here = path.resolve()
    if here in named:
        return True
    if not any(here.is_relative_to(p) for p in named):
        return False
    root = config.rootpath
    testpaths = [Path(m).resolve() for p in config.getini("testpaths")
                 for m in glob.glob(str(root / p), recursive=True)]
    return not any(here.is_relative_to(t) for t in testpaths)


def _is_fragment(path: Path) -> bool:
    """A `defaults` file: meant for `extends`, not a scenario. A file that does not parse is not a
    fragment: it is collected, and its `validate` item says where it breaks."""
    from cptest.errors import CptestError
    from cptest.lang.files import read_path
    from cptest.lang.syntax import read_doc

    try:
        return read_doc(read_path(str(path)), str(path)).kind == "defaults"
    except (OSError, UnicodeDecodeError, CptestError):
        return False


def _in_archive(path: Path) -> bool:
    """Inside a cptest archive (a folder holding manifest.json and plan.json, at any depth above):
    an archived scenario.cps reads its includes from the archive, `cptest check` judges it."""
    return any((d / "manifest.json").is_file() and (d / "plan.json").is_file()
               for d in path.resolve().parents)


def contract_ids(scenario: Scenario) -> list[str]:
    """The name of each declared expectation's item, in the plan's order: the contract's name, with
    its `qualifier` field for repeatable ones (`contract[graph:decode]`, `contract[log:absent]`), and
    `#n` for the n-th repeat of the same name."""
    from cptest.contracts import CONTRACTS

    seen: Counter[str] = Counter()
    out = []
    for name, entry in scenario.expect.entries():
        field = CONTRACTS[name].qualifier
        key = f"{name}:{getattr(entry, field)}" if field else name
        seen[key] += 1
        out.append(key if seen[key] == 1 else f"{key}#{seen[key]}")
    return out


@dataclass(frozen=True)
class RunResult:
    """What one `--cptest-run` of a scenario gave its contract items."""

    verdicts: tuple[Verdict, ...] = ()
    archive: Path | None = None
    bad_input: CptestError | None = None
    """The scenario does not plan (exit 2 in the CLI): every contract item fails with it."""
    not_run: str | None = None
    """Why nothing was judged, when that is not the engine's doing (infrastructure, a lint block,
    an unsafe scenario not allowed): every contract item is skipped with it."""
    stopped: str | None = None
    """The infrastructure fault that stopped a run after it began (its verdicts still stand)."""


class ScenarioFile(pytest.File):
    """One scenario: its `validate`, `lint` and one `contract[...]` item per declared expectation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parsed: Scenario | CptestError | None = None
        self._prepared: Prepared | CptestError | None = None
        self._run: RunResult | None = None

    def collect(self) -> list[pytest.Item]:
        items: list[pytest.Item] = [ValidateItem.from_parent(self, name="validate"),
                                    LintItem.from_parent(self, name="lint")]
        parsed = self.parsed()
        if isinstance(parsed, Exception):
            return items  # no expectations to list: `validate` fails with the reason
        entries = parsed.expect.entries()
        for index, (ident, (kind, entry)) in enumerate(zip(contract_ids(parsed), entries, strict=True)):
            items.append(ContractItem.from_parent(self, name=f"contract[{ident}]", index=index, kind=kind,
                                                  span=entry.span))
        return items

    def shown_path(self) -> Path:
        """The file as its messages name it: relative to the working directory when under it (as a
        user types it for `cptest validate`), else absolute. Worked out at each use, so that a
        change of directory between two uses cannot break a relative path."""
        cwd = Path.cwd()
        return self.path.relative_to(cwd) if self.path.is_relative_to(cwd) else self.path

    def parsed(self) -> Scenario | CptestError:
        """The scenario, or the ScenarioError that `cptest validate` prints; parsed once."""
        from cptest.errors import ScenarioError
        from cptest.lang import parse_file

        if self._parsed is None:
            try:
                self._parsed = parse_file(self.shown_path())
            except ScenarioError as e:
                self._parsed = e
        return self._parsed

    def prepared(self, *, gpu_present: bool) -> Prepared | CptestError:
        """The scenario planned for its engine (`pipeline.prepare`), or why it does not plan."""
        from cptest import pipeline
        from cptest.errors import PlanError, ScenarioError

        if self._prepared is None:
            try:
                engine = self.config.getoption("cptest_engine")
                self._prepared = pipeline.prepare(self.shown_path(), engine=engine, gpu_present=gpu_present,
                                                  placement=_placement(self.config))
            except (ScenarioError, PlanError) as e:
                self._prepared = e
        return self._prepared

    def run_result(self) -> RunResult:
        """The scenario's one run (made by the first contract item that asks)."""
        if self._run is None:
            self._run = _run(self)
        return self._run


class FragmentFile(pytest.File):
    """A `defaults` file named on the command line: one skipped item, `fragment`."""

    def collect(self) -> list[pytest.Item]:
        return [FragmentItem.from_parent(self, name="fragment")]


def _placement(config: pytest.Config) -> Any:
    from cptest.plan.model import Placement

    ports = config.getoption("cptest_ports")
    if not ports:
        return None
    try:
        main, baseline = (int(p) for p in ports.split(","))
        return Placement(main_port=main, baseline_port=baseline)
    except ValueError as e:
        raise pytest.UsageError(f"--cptest-ports {ports!r}: expected MAIN,BASELINE ports ({e})") from None


TRIAL_RUNS = Path(".cptest") / "runs"
"""Where --cptest-run archives go by default: where `cptest run` puts trial runs, git-ignored, never
the published `results/`."""


def _results(config: pytest.Config) -> Path:
    """--cptest-results, else `TRIAL_RUNS` under the directory pytest was started in (as `cptest
    run` takes it relative to the working folder)."""
    explicit = config.getoption("cptest_results")
    base = config.invocation_params.dir
    return (base / explicit) if explicit else base / TRIAL_RUNS


def _run(node: ScenarioFile) -> RunResult:
    """`cptest run FILE`, through the pipeline: plan, lint, preflight, run, check, archive."""
    from cptest import pipeline
    from cptest.errors import CptestError, PlanError
    from cptest.plan.model import Placement
    from cptest.suite.port_claims import claim_slot

    config = node.config
    gpu = shutil.which("nvidia-smi") is not None
    prepared = node.prepared(gpu_present=gpu)
    if isinstance(prepared, Exception):
        return RunResult(bad_input=prepared)
    if config.getoption("cptest_ports"):
        return _run_prepared(node, prepared, gpu)
    # As `cptest run` without --ports: a port slot claimed host-wide for this run, so that two test
    # sessions on one host never pick the same ports.
    try:
        claim = claim_slot()
    except CptestError as e:
        return RunResult(not_run=f"not run: {_one_line(e)}")
    try:
        placed = pipeline.prepare(node.shown_path(), engine=config.getoption("cptest_engine"),
                                  gpu_present=gpu,
                                  placement=Placement(main_port=claim.main, baseline_port=claim.baseline))
        return _run_prepared(node, placed, gpu)
    except (CptestError, PlanError) as e:
        return RunResult(bad_input=e)
    finally:
        claim.release()


def _run_prepared(node: ScenarioFile, prepared: Prepared, gpu: bool) -> RunResult:
    from cptest import pipeline
    from cptest.errors import CptestError, PlanError
    from cptest.outline import Logger, TerminalSink
    from cptest.plan.build import require_allowed
    from cptest.run.baseline_cache import BaselineCache
    from cptest.run.launcher import launcher_named
    from cptest.run.runner import RunOptions

    config = node.config
    try:
        require_allowed(prepared.plan, config.getoption("cptest_allow_unsafe"))
    except PlanError as e:
        return RunResult(not_run=f"not run: {_one_line(e)} (--cptest-allow-unsafe)")
    try:
        pipeline.runnable(prepared, gpu_present=gpu, ignore_lint=config.getoption("cptest_ignore_lint"))
    except pipeline.LintFindings:
        return RunResult(not_run="not run: lint found what the release was observed to do (see ::lint); "
                                 "--cptest-ignore-lint runs it anyway")
    except CptestError as e:  # no GPU for an SGLang plan: the machine's, not the engine's
        return RunResult(not_run=f"not run: {_one_line(e)}")
    log = Logger([TerminalSink(sys.stderr)])
    for note in prepared.notes:
        log.info(note)
    # The CLI's default baseline cache (`cptest run --baseline-cache`), so that a pytest run and a
    # `cptest run` of the same scenario share kept baselines.
    cache = Path(os.environ.get("CPTEST_BASELINE_CACHE") or "~/.cache/cptest/baselines").expanduser()
    models = config.getoption("cptest_models")
    try:
        out = pipeline.new_archive(_results(config), prepared, datetime.now(UTC))
        outcome = pipeline.run_scenario(
            prepared.plan, out, launcher_named("process"), scenario_text=prepared.text, log=log,
            includes=prepared.includes, run_options=RunOptions(baseline_cache=BaselineCache(cache)),
            models=Path(models) if models else None, scenario_dir=node.path.parent)
    except CptestError as e:
        if e.exit_code == 3:  # preflight: a missing model, a taken port, no GPU, no disk
            return RunResult(not_run=f"not run: {'; '.join(e.render().splitlines())}")
        return RunResult(bad_input=e)
    stopped = outcome.error.render() if outcome.error is not None else None
    return RunResult(tuple(outcome.verdict.verdicts), outcome.archive, stopped=stopped)


def _skip(reason: str) -> NoReturn:
    """Skip the running item, reported at the item's own location (the scenario's file and line,
    `reportinfo`) rather than at this module's line, as pytest does for its skip marks."""
    raise pytest.skip.Exception(reason, _use_item_location=True)


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


# ------------------------------------------------------------------------------------ items
def _domain(item: pytest.Item) -> str:
    """What pytest heads a failure with (`dcp2_llama_kv1.cps: contract[rows]`). Never a suffix of the
    node id: pytest would then print the node id with the dots of this text turned into `::`."""
    return f"{item.path.name}: {item.name}"


class CpsItem(pytest.Item):
    parent: ScenarioFile

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str | Any:
        if isinstance(excinfo.value, CpsFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, 0, _domain(self)


class ValidateItem(CpsItem):
    """`cptest validate FILE`: the file and its `extends` chain parse and check."""

    def runtest(self) -> None:
        parsed = self.parent.parsed()
        if isinstance(parsed, Exception):
            raise CpsFailure(parsed.render())


class LintItem(CpsItem):
    """`cptest lint FILE`: the scenario's expectations against its pinned SGLang release."""

    def runtest(self) -> None:
        from cptest.errors import CptestError
        from cptest.plan.lint import lint

        parsed = self.parent.parsed()
        if isinstance(parsed, Exception):
            _skip("the scenario does not parse (see ::validate)")
        try:
            findings = lint(parsed)
        except CptestError as e:  # an unknown release, a bad pass-through flag: exit 2 in the CLI
            raise CpsFailure(e.render()) from None
        for f in findings:
            if not f.blocks:
                # Raised at the finding's file and line, which the warnings summary prints: the
                # message leaves its own `file:line:col: ` prefix out.
                text = f.render().removeprefix(f"{f.span}: " if f.span else "")
                where = f.span.file if f.span else str(self.path)
                warnings.warn_explicit(text, CpsLintWarning, where, f.span.line if f.span else 0)
        blocking = [f for f in findings if f.blocks]
        if blocking:
            raise CpsFailure("\n".join(f.render() for f in blocking))


class FragmentItem(pytest.Item):
    def runtest(self) -> None:
        _skip("a defaults file, not a scenario: it is checked through every scenario that extends it")

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, 0, _domain(self)


class ContractItem(CpsItem):
    """One declared expectation: planned for the engine, or judged by a run with --cptest-run."""

    def __init__(self, *args: Any, index: int, kind: str, span: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.index = index
        self.kind = kind
        """The contract's name; the item judges the scenario's `index`-th expectation (plan order)."""
        self.span = span

    def reportinfo(self) -> tuple[Path, int | None, str]:
        if self.span is None:
            return super().reportinfo()
        return Path(self.span.file), self.span.line - 1, _domain(self)

    def runtest(self) -> None:
        if self.config.getoption("cptest_run"):
            self._judge(self.parent.run_result())
            return
        # Without a run: the plan resolves the expectation for the engine (what `cptest compile`
        # shows), so a statement that parses but cannot be planned fails here, at no cost.
        prepared = self.parent.prepared(gpu_present=True)
        if isinstance(prepared, Exception):
            raise CpsFailure(prepared.render())
        expectation = self._mine([e.kind for e in prepared.plan.expectations], prepared.plan.expectations)
        self.user_properties.append(("cptest_engine", prepared.plan.main.engine))
        self.user_properties.append(("cptest_expectation", json.dumps(
            expectation.model_dump(mode="json", exclude={"source"}), sort_keys=True)))

    def _mine(self, kinds: list[str], values: list[Any]) -> Any:
        """This item's entry of the plan's expectations or the run's verdicts (both in the order of
        the scenario's expectations; verdicts may add `run` ones after them)."""
        if self.index >= len(kinds) or kinds[self.index] != self.kind:
            raise AssertionError(f"cptest bug: entry {self.index + 1} is not {self.kind}: {kinds}")
        return values[self.index]

    def _judge(self, result: RunResult) -> None:
        if result.bad_input is not None:
            raise CpsFailure(result.bad_input.render())
        if result.not_run is not None:
            _skip(result.not_run)
        verdict = self._mine([v.checker for v in result.verdicts], list(result.verdicts))
        self.user_properties += [("cptest_archive", str(result.archive)), ("cptest_status", verdict.status)]
        if verdict.status == "pass":
            return
        tag = " [violation expected]" if verdict.expect_violation else ""
        declared = self.parent.shown_path().parent / verdict.source
        text = (f"{verdict.status.upper()} {verdict.checker}{tag}: {verdict.reason}\n"
                f"  declared at {declared}\n  archive: {result.archive}")
        if result.stopped:
            text += f"\n  the run was stopped: {result.stopped}"
        if verdict.status == "fail":
            raise CpsFailure(text)
        # Unknown is not a failure of the engine: evidence is missing (a launch that failed for an
        # infrastructure cause, a run cut short). pytest reports it as a skip with the reason.
        _skip("; ".join(line.strip() for line in text.splitlines()))
