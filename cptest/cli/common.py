"""What every `cptest` command shares: where results go, how output and errors are printed, and
the option stacks several commands take (composed once here, so each reads the same everywhere)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from cptest.errors import CptestError

RESULTS = Path("results")
"""Published evidence: what `cptest publish` copies verified archives into and `cptest matrix` reads."""
RUNS = Path(".cptest") / "runs"
"""Trial runs: where `run`, `suite` and `rerun` write unless `--results DIR` (git-ignored; only
`cptest publish` puts an archive into the published evidence)."""


def emit(data: Any, as_json: bool, text: str) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True) if as_json else text)


def _fail(err: CptestError, as_json: bool = False) -> None:
    if as_json:
        from cptest.interface import problem_json

        out: dict[str, Any] = {"error": type(err).__name__, "exit_code": err.exit_code,
                               "problems": [problem_json(p) for p in err.problems]}
        causes = getattr(err, "causes", None)
        if causes is not None:  # preflight: the machine, not the engine (exit 3, verdict unknown)
            out |= {"status": "unknown", "causes": [{"code": c.code, "message": c.message, "remedy": c.remedy}
                                                    for c in causes]}
        click.echo(json.dumps(out, indent=2))
    click.echo(err.render(), err=True)
    sys.exit(err.exit_code)


def archive_guard(fn: Callable[..., int | None]) -> Callable[..., int | None]:
    """For the commands that read archives (check, verify, diff, matrix, report, rerun): whatever an
    archive holds becomes a message and exit 3, never a traceback. The store and the checks raise
    IntegrityError/EvidenceError for what they recognise; this catches what a malformed file makes
    the standard library raise underneath, as a last resort."""

    def wrapper(*args: Any, **kwargs: Any) -> int | None:
        from cptest.errors import EvidenceError

        try:
            return fn(*args, **kwargs)
        except CptestError:
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as e:
            where = next((v for v in (*args, *kwargs.values()) if isinstance(v, Path)), None)
            raise EvidenceError(f"cptest: cannot read the archive{f' {where}' if where else ''}: "
                                f"{type(e).__name__}: {e}; the archive is damaged or was edited "
                                "(`cptest verify DIR` names what changed)") from None

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def guard(fn: Callable[..., int | None]) -> Callable[..., None]:
    """Run a command; a CptestError becomes its message and exit code (never a traceback)."""

    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            code = fn(*args, **kwargs)
        except CptestError as e:
            _fail(e, kwargs.get("as_json", False))
        except KeyboardInterrupt:
            if kwargs.get("as_json", False):
                click.echo(json.dumps({"error": "Interrupted", "exit_code": 3, "problems": [
                    {"where": None, "file": None, "line": None, "col": None, "message": "interrupted"}]}))
            click.echo("cptest: interrupted", err=True)
            sys.exit(3)
        sys.exit(code or 0)

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


json_option = click.option("--json", "as_json", is_flag=True, help="machine-readable output on stdout")
BASELINES = Path("~/.cache/cptest/baselines").expanduser()


def baseline_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--no-baseline-cache", is_flag=True,
                      help="run every baseline even when an identical one was kept")(fn)
    return click.option("--baseline-cache", type=click.Path(file_okay=False, path_type=Path),
                        default=BASELINES, show_default=True, envvar="CPTEST_BASELINE_CACHE",
                        help="where identical baselines are kept and reused")(fn)


def models_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--models", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help="the model store (default $CPTEST_MODELS, else .cptest/models in the "
                             "checkout)")(fn)


engine_python_option = click.option(
    "--engine-python", metavar="PATH", default=None,
    help="the interpreter of the SGLang environment SGLang servers run on (default $CPTEST_SGLANG_PYTHON, "
         "else the first python3 on PATH); checked before launch to import the plan's SGLang release")


unsafe_option = click.option(
    "--allow-unsafe", is_flag=True, envvar="CPTEST_ALLOW_UNSAFE",
    help="run scenarios declared `unsafe \"reason\"` (their env or flags load code or config)")


def placement_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--rank-mem-fraction", type=click.FloatRange(0.0, 1.0, min_open=True), default=None,
                      metavar="F", help="co-located: each rank's --mem-fraction-static (default: the "
                      "scenario's mem_fraction divided by the ranks sharing a GPU)")(fn)
    return click.option("--placement", "placement_mode", type=click.Choice(["auto", "physical", "colocated"]),
                        default="auto", show_default=True,
                        help="physical: one rank per GPU; colocated: every rank its own local node process, "
                        "ranks sharing GPUs (docs/placement.md); auto: colocated when this machine has fewer "
                        "GPUs than a server has ranks")(fn)


Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def stack(*decorators: Decorator) -> Decorator:
    """Several decorators as one, applied as if written one above the other in this order (so
    `--help` lists their options in this order)."""

    def apply(fn: Callable[..., Any]) -> Callable[..., Any]:
        for decorator in reversed(decorators):
            fn = decorator(fn)
        return fn

    return apply


trial_results_option = click.option(
    "--results", type=click.Path(file_okay=False, path_type=Path), default=RUNS, show_default=True,
    help="where the archive goes (trial runs; `cptest publish` puts a verified archive into results/)")
launcher_option = click.option("--launcher", type=click.Choice(["process", "docker", "slurm"]),
                               default="process", show_default=True)


def ignore_lint_option(help: str) -> Decorator:
    return click.option("--ignore-lint", is_flag=True, help=help)


def engine_option(help: str) -> Decorator:
    return click.option("--engine", "engine_name", type=click.Choice(["sglang", "reference"]), default=None,
                        help=help)


def ids_option(name: str, help: str) -> Decorator:
    """`--gpus` or `--cpus`: device ids as a list or ranges (`suite.machine.parse_ids`)."""
    return click.option(name, default=None, metavar="IDS", help=help)


def output_option(help: str) -> Decorator:
    return click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        help=help)


engine_run_options = stack(baseline_options, models_option, engine_python_option, unsafe_option, json_option)
"""What every command that launches an engine (run, suite, rerun) takes, after its own options."""


def console_log(as_json: bool = False) -> Any:
    """The outline of a long command on stderr (`cptest.console`): a live display on a terminal, plain
    lines otherwise, no live display under --json or NO_COLOR (stdout stays the JSON document)."""
    from cptest.console import console_sink
    from cptest.outline import Logger

    return Logger([console_sink(sys.stderr, live_allowed=not as_json)])


def verdict_text(verdict: Any, out: Path) -> str:
    """The verdicts for a terminal: a reason may quote an engine's log line, whose control
    characters are shown as text (`report.text.plain_text`), never sent to the terminal. A
    co-located verdict says so on its first line: it judges semantics, never speed."""
    from cptest.report.text import plain_text

    placed = ", co-located" if verdict.placement == "colocated" else ""
    lines = [f"{verdict.scenario}: {verdict.status.upper()} (engine {verdict.engine}{placed})"]
    for v in verdict.verdicts:
        tag = " [violation expected]" if v.expect_violation else ""
        lines.append(f"  {v.status:7} {v.checker}{tag}: {v.reason}")
    lines.append(f"archive: {out}")
    return plain_text("\n".join(lines))


def finding_json(file: Path, finding: Any) -> dict[str, Any]:
    """A lint finding as `interface.FindingOut`: its position as text and as file, line, col."""
    span = finding.span
    return {"scenario": str(file), "file": span.file if span else str(file),
            "where": str(span) if span else None, "line": span.line if span else None,
            "col": span.col if span else None, "code": finding.code, "message": finding.message,
            "citation": finding.citation, "provenance": finding.provenance, "evidence": finding.evidence,
            "blocks": finding.blocks}  # fmt: skip


def parse_placement(gpus: str | None, cpus: str | None, ports: str | None,
               rank_mem_fraction: float | None = None) -> Any:
    """The `--gpus/--cpus/--ports/--rank-mem-fraction` of `cptest run` as a plan Placement (bad
    values: exit 2); `--placement` is applied by `pipeline.prepare`."""
    from cptest.errors import ScenarioError
    from cptest.plan.model import Placement
    from cptest.suite.machine import parse_ids

    try:
        main_port, baseline_port = (30000, 30100)
        if ports is not None:
            main_port, baseline_port = (int(x) for x in ports.split(","))
        return Placement(main_port=main_port, baseline_port=baseline_port,
                         gpus=parse_ids(gpus, "--gpus") if gpus else None,
                         cpus=parse_ids(cpus, "--cpus") if cpus else None,
                         rank_mem_fraction=rank_mem_fraction)
    except (ValueError, CptestError) as e:
        msg = (e.problems[0].message if isinstance(e, CptestError)
               else f"--ports {ports!r}: expected two port numbers, MAIN,BASELINE")
        raise ScenarioError(msg) from None
