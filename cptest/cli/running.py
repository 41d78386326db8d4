"""The commands that launch engines: run, suite, rerun."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from cptest.cli.common import (
    archive_guard,
    console_log,
    emit,
    engine_option,
    engine_run_options,
    finding_json,
    guard,
    ids_option,
    ignore_lint_option,
    launcher_option,
    parse_placement,
    placement_options,
    trial_results_option,
    verdict_text,
)


@click.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@trial_results_option
@launcher_option
@ignore_lint_option("run even when lint finds a mismatch")
@engine_option("override the scenario's engine (with no GPU, sglang scenarios run on the reference)")
@ids_option("--gpus", "physical GPUs for the servers, e.g. 2,3 (default 0..n-1)")
@ids_option("--cpus", "pin every server process to these CPUs, e.g. 4-9")
@click.option("--ports", default=None, metavar="MAIN,BASELINE",
              help="HTTP ports of the main and baseline server (default: the first port slot from "
              "30000,30100 that no other cptest process holds, claimed for the run)")
@placement_options
@engine_run_options
@guard
def run(file: Path, results: Path, launcher: str, ignore_lint: bool, engine_name: str | None,
        gpus: str | None, cpus: str | None, ports: str | None, placement_mode: str,
        rank_mem_fraction: float | None, baseline_cache: Path, no_baseline_cache: bool,
        models: Path | None, as_json: bool, allow_unsafe: bool = False,
        engine_python: str | None = None) -> int:
    """Plan, lint, launch, drive the workload, inject faults, gather evidence, check, archive."""
    from cptest.run.process import install_signal_handlers
    from cptest.suite import port_claims

    # A SIGTERM or SIGHUP from the first instant is an exception, not the default death: during
    # planning it ends the run with exit 3 and nothing launched; once the archive is begun, with a
    # finished archive whose verdict says unknown.
    restore = install_signal_handlers()
    claim = None
    try:
        # Without --ports the run claims a port slot host-wide (a Slurm run's servers listen on
        # other hosts): two runs at once never pick the same ports; the claim ends with this process.
        if ports is None and launcher != "slurm":
            claim = port_claims.claim_slot()
        return _run(file, results, launcher, ignore_lint, engine_name, gpus, cpus,
                    ports if claim is None else f"{claim.main},{claim.baseline}", placement_mode,
                    rank_mem_fraction, baseline_cache, no_baseline_cache, models, as_json, allow_unsafe,
                    engine_python)
    finally:
        if claim is not None:
            claim.release()
        restore()


def _run(file: Path, results: Path, launcher: str, ignore_lint: bool, engine_name: str | None,
         gpus: str | None, cpus: str | None, ports: str | None, placement_mode: str,
         rank_mem_fraction: float | None, baseline_cache: Path, no_baseline_cache: bool,
         models: Path | None, as_json: bool, allow_unsafe: bool, engine_python: str | None) -> int:
    from cptest import pipeline
    from cptest.plan.build import require_allowed
    from cptest.run.launcher import launcher_named

    gpu = shutil.which("nvidia-smi") is not None
    prepared = pipeline.prepare(file, engine=engine_name, gpu_present=gpu,
                                placement=parse_placement(gpus, cpus, ports, rank_mem_fraction),
                                placement_mode=placement_mode, gpus_here=_gpus_here())
    require_allowed(prepared.plan, allow_unsafe)
    launcher_named(launcher, engine_python=engine_python)  # bad together (docker): exit 2 now
    for note in prepared.notes:
        click.echo(note, err=True)
    for finding in prepared.findings:
        click.echo(f"lint{'' if finding.blocks else ' (warning)'}: {finding.render()}", err=True)
    try:
        pipeline.runnable(prepared, gpu_present=gpu, ignore_lint=ignore_lint)
    except pipeline.LintFindings:
        if as_json:
            emit({"launched": False, "blocked_by": "lint",
                   "findings": [finding_json(file, f) for f in prepared.findings if f.blocks]}, True, "")
        click.echo("cptest: lint findings; nothing was launched (--ignore-lint to run anyway)", err=True)
        return 1
    out = pipeline.new_archive(results, prepared, datetime.now(UTC))
    outcome = pipeline.run_scenario(prepared.plan, out,
                                    launcher_named(launcher, engine_python=engine_python),
                                    scenario_text=prepared.text, log=console_log(as_json),
                                    includes=prepared.includes,
                                    run_options=_run_options(baseline_cache, no_baseline_cache),
                                    models=models, scenario_dir=file.parent)
    return _print_outcome(outcome, as_json)


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@trial_results_option
@ids_option("--gpus", "the GPUs the suite may use (default: every GPU)")
@ids_option("--cpus", "the CPUs the suite may use (default: all it may)")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="at most this many scenarios at once (1: one at a time)")
@launcher_option
@ignore_lint_option("run scenarios even when lint finds a mismatch")
@engine_option("override every scenario's engine")
@placement_options
@engine_run_options
@guard
def suite(paths: tuple[Path, ...], results: Path, gpus: str | None, cpus: str | None, jobs: int | None,
          launcher: str, ignore_lint: bool, engine_name: str | None, placement_mode: str,
          rank_mem_fraction: float | None, baseline_cache: Path, no_baseline_cache: bool,
          models: Path | None, as_json: bool, allow_unsafe: bool = False,
          engine_python: str | None = None) -> int:
    """Run many scenarios (files, or the .cps files of folders), concurrently where their servers fit
    on this machine's GPUs, CPUs and ports; one summary; exit code of the worst verdict. `--placement
    auto` co-locates a scenario whose server has more ranks than the suite has GPUs."""
    import os

    from cptest.plan.build import require_allowed_files
    from cptest.run.models import store_dir
    from cptest.suite.machine import discover, parse_ids
    from cptest.suite.runner import run_suite, scenario_files

    require_allowed_files(scenario_files(paths), allow_unsafe)
    if allow_unsafe:  # each scenario is a child `cptest run`: it reads the same permission
        os.environ["CPTEST_ALLOW_UNSAFE"] = "1"
    if engine_python is not None:  # and the same interpreter, by absolute path (cptest.run.interpreter)
        from cptest.run.interpreter import ENV_VAR
        from cptest.run.launcher import launcher_named

        launcher_named(launcher, engine_python=engine_python)  # bad together (docker): exit 2
        os.environ[ENV_VAR] = os.path.abspath(engine_python) if os.sep in engine_python else engine_python
    from cptest.suite.port_claims import port_base

    machine = discover(gpus=parse_ids(gpus, "--gpus") if gpus else None,
                       cpus=parse_ids(cpus, "--cpus") if cpus else None, port_base=port_base())
    done = run_suite(scenario_files(paths), machine, results=results, log=console_log(as_json),
                     engine=engine_name,
                     gpu_present=shutil.which("nvidia-smi") is not None, models=store_dir(models), jobs=jobs,
                     ignore_lint=ignore_lint, launcher=launcher,
                     baseline_cache=None if no_baseline_cache else baseline_cache,
                     placement_mode=placement_mode, rank_mem_fraction=rank_mem_fraction)
    emit(done.record | {"folder": str(done.folder)}, as_json, (done.folder / "summary.md").read_text())
    return done.exit_code


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@trial_results_option
@launcher_option
@click.option("--accept-plan-changes", is_flag=True,
              help="run even when this cptest plans the archived scenario to execute something else than "
              "the archived plan did (argv, environment, image, mounts, GPUs); refused otherwise, exit 3")
@engine_run_options
@guard
@archive_guard
def rerun(directory: Path, results: Path, launcher: str, accept_plan_changes: bool, baseline_cache: Path,
          no_baseline_cache: bool, models: Path | None, as_json: bool, allow_unsafe: bool = False,
          engine_python: str | None = None) -> int:
    """Plan an archive's scenario again (never its archived argv), run it with the same pins (the
    model found by its hash), then diff the evidence. A plan that would execute something else than
    the archived one is shown and refused (exit 3) unless --accept-plan-changes."""
    from cptest import pipeline
    from cptest.run.launcher import launcher_named

    done = pipeline.rerun(directory, results, launcher_named(launcher, engine_python=engine_python),
                          log=console_log(as_json), now=datetime.now(UTC),
                          run_options=_run_options(baseline_cache, no_baseline_cache),
                          models=models, gpu_present=shutil.which("nvidia-smi") is not None,
                          accept_plan_changes=accept_plan_changes, allow_unsafe=allow_unsafe)
    if as_json:  # one JSON document: the new run's verdict with the diff beside it
        outcome = done.outcome
        click.echo(json.dumps(json.loads(outcome.verdict.to_json()) | {"archive": str(outcome.archive),
                              "diff": done.diff.as_json()}, indent=2, sort_keys=True))  # fmt: skip
        if outcome.error is not None:
            click.echo(outcome.error.render(), err=True)
    else:
        _print_outcome(done.outcome, as_json)
        click.echo(done.diff.render())
    return done.exit_code


def _gpus_here() -> int | None:
    """How many GPUs this machine has (None: none can be read: no SGLang run here anyway)."""
    if shutil.which("nvidia-smi") is None:
        return None
    from cptest.run.gpu import gpu_totals_mib

    return len(gpu_totals_mib()) or None


def _run_options(baseline_cache: Path, no_baseline_cache: bool) -> Any:
    from cptest.run.baseline_cache import BaselineCache
    from cptest.run.runner import RunOptions

    return RunOptions(baseline_cache=None if no_baseline_cache else BaselineCache(baseline_cache))


def _print_outcome(outcome: Any, as_json: bool) -> int:
    """Print a run's verdict (and the fault that stopped it); return its exit code."""
    verdict = outcome.verdict
    emit(json.loads(verdict.to_json()) | {"archive": str(outcome.archive)}, as_json,
          verdict_text(verdict, outcome.archive))
    if outcome.error is not None:
        click.echo(outcome.error.render(), err=True)
    return outcome.exit_code


COMMANDS = (run, suite, rerun)
