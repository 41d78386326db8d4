"""The commands that read archives: check, verify, diff, matrix, startup, report, publish."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from cptest.cli.common import (
    RESULTS,
    RUNS,
    archive_guard,
    emit,
    guard,
    json_option,
    output_option,
    verdict_text,
)


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--write", is_flag=True,
              help="write the verdicts as a re-analysis beside the sealed archive (analyses/<UTC time>/, "
                   "never over the seal; the archive must match its seal); finish an archive that was "
                   "never finished")
@json_option
@guard
@archive_guard
def check(directory: Path, write: bool, as_json: bool) -> int:
    """Recompute verdicts from an archive's evidence alone (no GPU); compare with the verdict it holds
    (its newest re-analysis's, else verdict.json). The plan is first compiled again from the
    archived scenario: a plan.json that differs from it (expectations, argv, environment, serve
    options) is an integrity failure (exit 3), as is a link, FIFO or folder where a file belongs."""
    from cptest import pipeline

    done = pipeline.check_archive(directory, write=write, integrity=True, now=datetime.now(UTC))
    emit(json.loads(done.verdict.to_json()) | {"archive": str(directory), "differs": bool(done.differs)},
          as_json, verdict_text(done.verdict, directory))
    if done.differs:
        click.echo(f"cptest: the recomputed verdict differs from {done.against}", err=True)
    if done.analysis is not None:
        click.echo(f"cptest: re-analysis written beside the seal: {done.analysis} (the seal, the evidence "
                   "and the original verdict.json are unchanged)", err=True)
    return done.exit_code


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@json_option
@guard
@archive_guard
def verify(directory: Path, as_json: bool) -> int:
    """Check the sha256 of every archived file against the seal (manifest.json), and each
    re-analysis beside it (analyses/) against its own manifest, the seal it names and the chain."""
    from cptest import analyses
    from cptest.errors import render_problem
    from cptest.interface import problem_json

    problems = analyses.verify_archive(directory)
    if as_json:
        emit({"archive": str(directory), "ok": not problems,
               "problems": [problem_json(p) for p in problems]}, True, "")
    for p in problems:
        click.echo(render_problem(p, None), err=True)
    if not problems and not as_json:
        count = len(analyses.listed(directory))
        beside = f"; {count} re-analysis(es) beside it, each naming this seal" if count else ""
        click.echo(f"ok  {directory}: every file matches the seal{beside}")
    return 3 if problems else 0


@click.command()
@click.argument("a", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.argument("b", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--other-scenario", is_flag=True,
              help="compare archives of different scenarios (refused otherwise, exit 2)")
@json_option
@guard
@archive_guard
def diff(a: Path, b: Path, other_scenario: bool, as_json: bool) -> int:
    """Compare the evidence of two archives within the declared tolerances: token ids, K/V ownership
    and statuses exactly, logprobs and capacity within the plan's tolerances; timings are shown,
    never counted. Exit 0 no difference, 1 differences, 2 archives of different scenarios."""
    from cptest.checks.diff import diff as diff_archives

    report = diff_archives(a, b, other_scenario=other_scenario)
    emit(report.as_json(), as_json, report.render())
    return 0 if report.same else 1


@click.command()
@click.argument("directories", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option("--support", is_flag=True,
              help="the support matrix instead: every cell of family x KV regime x mode x backend x decode, "
                   "run (archive, verdicts), ruled out (SGLang source lines) or not yet run (the scenario)")
@click.option("--scenarios", "scenario_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=Path("scenarios"), show_default=True,
              help="with --support: the scenarios that could run")
@click.option("--release", default=None,
              help="with --support: the SGLang release (default: the one cptest has cell rules for)")
@output_option("with --support: write the markdown there (docs/support-matrix.md) instead of stdout")
@json_option
@guard
@archive_guard
def matrix(directories: tuple[Path, ...], support: bool, scenario_dir: Path, release: str | None,
           output: Path | None, as_json: bool) -> int:
    """A markdown table of scenario x verdict over the published evidence: the archives under
    results/ (or the folders named; side runs in `_`-named folders below them are left out). Trial
    runs (.cptest/runs) are not published evidence: `cptest publish DIR` puts one into results/.
    With --support, the support matrix of docs/support-matrix.md."""
    from cptest.report import matrix_rows, render_matrix
    from cptest.store import archives_under

    folders = directories or (RESULTS,)
    if not directories and not RESULTS.is_dir():
        from cptest.errors import Problem, ScenarioError

        raise ScenarioError(Problem(None, f"cptest matrix: no published evidence here ({RESULTS}/ does not "
                                    "exist)", hint="run from the checkout, name the folders, or "
                                    "`cptest publish DIR` an archive"))  # fmt: skip
    if support:
        return _support_matrix(folders, scenario_dir, release, output, as_json)
    archives = sorted({a for d in folders for a in archives_under(Path(d))})
    click.echo(f"cptest matrix: {len(archives)} archive(s) under {', '.join(map(str, folders))}"
               f"{_what_matrix_reads(folders)}", err=True)
    judged = matrix_judge()
    text = render_matrix(archives, judged)
    rows = [{"scenario": r["scenario"], "engine": r["engine"], "placement": r["placement"],
             "status": r["status"], "contracts": r["by"], "archive": str(r["dir"]), "older": r["older"],
             "analysis": r.get("analysis")}
            for r in matrix_rows(archives, judged)[0]]
    emit({"published": [str(d) for d in folders], "rows": rows, "markdown": text}, as_json, text)
    return 0


def matrix_judge() -> Callable[[Path], tuple[Any, str | None] | None]:
    """How the matrix reads an archive: `pipeline.judge`'s recomputed verdict and its re-analysis
    label (an archive that does not match its seal, or whose held verdict is not what its evidence
    gives, stops the matrix: exit 3); None (`not checked`) for an archive never finished, which
    has neither a seal nor a verdict.json."""
    from cptest import pipeline, store

    def judged(d: Path) -> tuple[Any, str | None] | None:
        layout = store.Layout(d)
        if not store.existing_file(layout.verdict) and not store.is_finished(layout):
            return None
        done = pipeline.judge(d)
        return done.verdict, done.label

    return judged


def _what_matrix_reads(folders: tuple[Path, ...]) -> str:
    """What the archives `matrix` read are, said once: trial runs where every folder is under
    .cptest/runs, published evidence otherwise (results/, or where `publish --results` put them)."""
    if all(Path(d).resolve().is_relative_to(RUNS.resolve()) for d in folders):
        return ": trial runs, not published evidence (`cptest publish DIR` publishes one)"
    return ": published evidence (trial runs in .cptest/runs are not read)"


def _support_matrix(folders: tuple[Path, ...], scenario_dir: Path, release: str | None, output: Path | None,
                    as_json: bool) -> int:
    """`matrix --support`: read the scenarios and the published archives, print or write the matrix."""
    from cptest.engines.sglang.releases import get_release
    from cptest.report.support import as_json as support_json
    from cptest.report.support import read_inputs, render_support, support_matrix

    if release is None:
        from cptest.engines.sglang.cells import default_release

        release = default_release()
    rel = get_release(release)
    scenarios, runs, skipped = read_inputs(rel, scenario_dir, [Path(d) for d in folders], matrix_judge())
    m = support_matrix(rel, scenarios, runs)
    # Folders by name only: the document is the same from any working folder (the staleness test).
    text = render_support(m, sources=(f"{scenario_dir.resolve().name}/",
                                      *(f"{Path(d).resolve().name}/" for d in folders)))
    for s in skipped:
        click.echo(f"cptest matrix --support: skipped {s}", err=True)
    c = m.counts()
    click.echo(f"cptest matrix --support: {c['grid cells']} cells: {c['run']} run, {c['ruled out']} ruled "
               f"out, {c['not yet run']} not yet run ({c['no scenario']} with no scenario); "
               f"{c['outside the grid']} scenarios outside the grid", err=True)
    if output is not None:
        output.write_text(text, encoding="utf-8")
    data = {**support_json(m), "output": str(output) if output else None, "skipped": skipped,
            "markdown": text}
    emit(data, as_json, f"wrote {output}" if output is not None else text.rstrip("\n"))
    return 0


@click.command()
@click.argument("directories", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False, path_type=Path))
@json_option
@guard
@archive_guard
def startup(directories: tuple[Path, ...], as_json: bool) -> int:
    """Where each server's startup went (imports, weights, KV pool, graphs, JIT warm-up), from the
    engine's log lines, for archives or folders of archives (side runs in `_` folders included).
    Archives are read as `check` reads them: a link, FIFO or folder where a file belongs, or a
    malformed log, is exit 3 with a message naming it."""
    from cptest.errors import ScenarioError
    from cptest.report.startup import render_table
    from cptest.report.startup import startup as phases
    from cptest.store import archives_under

    for d in directories:  # click lets a FIFO or socket through as "not a file"
        if not d.is_dir():
            raise ScenarioError(f"{d}: not a folder (an archive, or a folder of archives)")
    archives = sorted({a for d in directories for a in archives_under(Path(d), side_runs=True)})
    rows = [r for a in archives for role in ("main", "baseline") if (r := phases(a, role)) is not None]
    emit({"servers": [r.as_json() for r in rows]}, as_json, render_table(rows))
    return 0


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--html", "as_html", is_flag=True,
              help="the self-contained HTML report (plots inline, no network); of a suite folder: its index")
@output_option("write the report to FILE instead of printing it")
@json_option
@guard
@archive_guard
def report(directory: Path, as_html: bool, output: Path | None, as_json: bool) -> int:
    """Print an archive's report, its verdicts recomputed from its evidence; `--html` for the page
    with plots (docs/reports.md). The archive is judged first as `publish` judges it: one that does
    not match its seal, whose plan is not what its scenario plans, or whose held verdict is not
    what its evidence gives is refused (exit 3). A re-analysis beside the seal is said on stderr."""
    from cptest import pipeline, store

    suite = (directory / "suite.json").is_file() and not (directory / "plan.json").exists()
    if as_html and suite:
        from cptest.report.html import render_suite_html

        text = render_suite_html(directory)
    elif suite:  # a suite folder's report is the summary the suite wrote; each archive has its own
        from cptest.errors import EvidenceError

        summary = directory / "summary.md"
        if not summary.is_file():
            raise EvidenceError(f"{summary}: the suite folder has no summary.md (the suite was cut short?)")
        text = store.read_file(summary)  # never through a link, never past its bound
    else:
        judged = pipeline.judge(directory)
        if judged.label is not None:
            click.echo(f"cptest: {directory}: the verdicts of its {judged.label}", err=True)
        if as_html:
            from cptest.report.html import render_html

            text = render_html(directory, judged.verdict, judged.plan)
        else:
            from cptest.report import render

            text = render(judged.verdict, judged.plan)
    if output is not None:
        output.write_text(text, encoding="utf-8")
    emit({"archive": str(directory), "html" if as_html else "markdown": text,
           "output": str(output) if output else None}, as_json, text if output is None else f"wrote {output}")
    return 0


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=RESULTS,
              show_default=True, help="the published evidence to put the archive into")
@json_option
@guard
@archive_guard
def publish(directory: Path, results: Path, as_json: bool) -> int:
    """Put a trial run's archive into the published evidence (results/<scenario>/<run>), after
    checking it as `cptest verify` and `cptest check` do: a damaged or forged archive is refused
    (exit 3), an archive is never overwritten (exit 2); nothing is written when refused."""
    from cptest import pipeline

    done = pipeline.publish(directory, results)
    what = "already published, identical: nothing copied" if done.already else "published"
    emit({"source": str(directory), "archive": str(done.archive), "scenario": done.verdict.scenario,
           "run": done.archive.name, "status": done.verdict.status, "already_published": done.already},
          as_json, f"{what}: {directory} -> {done.archive} ({done.verdict.scenario}: "
          f"{done.verdict.status.upper()}, engine {done.verdict.engine}"
          f"{', co-located' if done.verdict.placement == 'colocated' else ''}; verified and checked)")
    return 0


COMMANDS = (check, verify, diff, matrix, startup, report, publish)
