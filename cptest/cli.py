"""The `cptest` command: parses arguments, calls `cptest.pipeline` (or one stage), prints.

Exit codes: 0 ok/pass, 1 lint findings/fail/would reformat, 2 bad input, 3 unknown verdict or
infrastructure failure; each command's are in README.md's command table (tests/test_cli_interface.py
runs every one). `--json` prints one JSON object on stdout, the command's output model or an error
(`cptest/interface.py`, served by `cptest schema --command NAME`)."""

from __future__ import annotations

import difflib
import json
import shutil
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from cptest import __version__
from cptest.errors import CptestError

RESULTS = Path("results")
"""Published evidence: what `cptest publish` copies verified archives into and `cptest matrix` reads."""
RUNS = Path(".cptest") / "runs"
"""Trial runs: where `run`, `suite` and `rerun` write unless `--results DIR` (git-ignored; only
`cptest publish` puts an archive into the published evidence)."""


def _emit(data: Any, as_json: bool, text: str) -> None:
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


def _archive_guard(fn: Callable[..., int | None]) -> Callable[..., int | None]:
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


def _guard(fn: Callable[..., int | None]) -> Callable[..., None]:
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


class _Cli(click.Group):
    """The command group: a usage error (missing argument, no such directory, bad option) is exit 2
    as click makes it, and under `--json` also an ErrorOut on stdout, like every other error."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        argv = [str(a) for a in (sys.argv[1:] if args is None else args)]
        try:
            return super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as e:
            words = argv[: argv.index("--")] if "--" in argv else argv
            if "--json" in words:
                click.echo(json.dumps({"error": "UsageError", "exit_code": e.exit_code, "problems": [
                    {"where": None, "file": None, "line": None, "col": None, "message": e.format_message(),
                     "hint": "cptest --help"}]}, indent=2))  # fmt: skip
            e.show()
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cptest")
def main() -> None:
    """Qualify SGLang prefill/decode context parallelism with rank-local evidence."""


# ------------------------------------------------------------------------------ authoring
@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@json_option
@_guard
def validate(files: tuple[Path, ...], as_json: bool) -> int:
    """Parse and check scenario files; report every problem with file:line:col."""
    from cptest.errors import ScenarioError
    from cptest.interface import problem_json
    from cptest.lang import parse_file
    from cptest.plan.flags import flag_problems

    results, code = [], 0
    for f in files:
        try:
            # The release's flag table judges each pass-through flag's values; the language stage
            # knows no release.
            bad_flags = flag_problems(parse_file(f))
            if bad_flags:
                raise ScenarioError(bad_flags, sources={str(f): _read(f)})
            results.append({"file": str(f), "ok": True, "problems": []})
            if not as_json:
                click.echo(f"ok  {f}")
        except ScenarioError as e:
            code = 2
            results.append({"file": str(f), "ok": False, "problems": [problem_json(p) for p in e.problems]})
            click.echo(e.render(), err=True)
    if as_json:
        _emit({"ok": code == 0, "files": results}, True, "")
    return code


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--check", is_flag=True, help="exit 1 with a diff if a file is not canonical; write nothing")
@json_option
@_guard
def fmt(files: tuple[Path, ...], check: bool, as_json: bool) -> int:
    """Rewrite scenario files in canonical form (comments kept)."""
    from cptest.lang import format_text

    code, done = 0, []
    for f in files:
        text = _read(f)
        out = format_text(text, str(f))
        entry: dict[str, Any] = {"file": str(f), "canonical": out == text, "written": False, "diff": None}
        done.append(entry)
        if out == text:
            continue
        if check:
            code = 1
            entry["diff"] = "".join(difflib.unified_diff(text.splitlines(True), out.splitlines(True),
                                                         str(f), f"{f} (formatted)"))  # fmt: skip
            if not as_json:
                sys.stdout.write(entry["diff"])
        else:
            f.write_text(out, encoding="utf-8")
            entry["written"] = True
            if not as_json:
                click.echo(f"formatted {f}")
    if as_json:
        _emit({"check": check, "files": done}, True, "")
    return code


@main.command()
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--evidence", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="test every release rule against the archives under this folder instead")
@json_option
@_guard
def lint(files: tuple[Path, ...], evidence: Path | None, as_json: bool) -> int:
    """Compare what each scenario expects with what its pinned SGLang release is known to do; with
    --evidence DIR, mark each release rule confirmed, refuted or untested by the archives in DIR."""
    from cptest.errors import Problem, ScenarioError
    from cptest.lang import parse_file
    from cptest.plan.lint import lint as lint_scenario

    if evidence is not None:
        if files:
            raise ScenarioError("cptest lint: give scenario files or --evidence DIR, not both")
        return _lint_evidence(evidence, as_json)
    if not files:
        raise ScenarioError(Problem(None, "cptest lint: no scenario file given",
                                    hint="cptest lint FILE... | cptest lint --evidence DIR"))

    found = []
    for f in files:
        for finding in lint_scenario(parse_file(f)):
            found.append(_finding_json(f, finding))
            if not as_json:
                click.echo(finding.render())
    if as_json:
        _emit({"files": [str(f) for f in files], "findings": found,
               "blocking": sum(x["blocks"] for x in found)}, True, "")
    elif not found:
        click.echo(f"lint: {len(files)} file(s), no findings")
    return 1 if any(x["blocks"] for x in found) else 0


def _finding_json(file: Path, finding: Any) -> dict[str, Any]:
    """A lint finding as `interface.FindingOut`: its position as text and as file, line, col."""
    span = finding.span
    return {"scenario": str(file), "file": span.file if span else str(file),
            "where": str(span) if span else None, "line": span.line if span else None,
            "col": span.col if span else None, "code": finding.code, "message": finding.message,
            "citation": finding.citation, "provenance": finding.provenance, "evidence": finding.evidence,
            "blocks": finding.blocks}  # fmt: skip


def _lint_evidence(root: Path, as_json: bool) -> int:
    """`cptest lint --evidence DIR`: exit 1 when an archive refutes a rule, else 0."""
    from cptest.checks.hypotheses import judge

    judged = judge(root)
    rows = [{"release": t.release, "rule": t.code, "stage": t.stage, "provenance": t.provenance,
             "evidence": t.evidence, "status": t.status,
             "archives": [{"archive": a, "outcome": o, "why": w} for a, o, w in t.seen]}
            for t in judged.rules]
    if as_json:
        click.echo(json.dumps({"archives": judged.archives, "rules": rows,
                               "skipped": [{"archive": a, "why": w} for a, w in judged.skipped]}, indent=2))
    else:
        click.echo(f"{judged.archives} SGLang archive(s) under {root}")
        click.echo(f"{'release':<8} {'rule':<30} {'stage':<13} {'known as':<9} {'archives say':<12} "
                   "confirm/refute/untested")
        for t in judged.rules:
            n = {o: sum(1 for _, x, _ in t.seen if x == o) for o in ("confirmed", "refuted", "untested")}
            click.echo(f"{t.release:<8} {t.code:<30} {t.stage:<13} {t.provenance:<9} {t.status:<12} "
                       f"{n['confirmed']}/{n['refuted']}/{n['untested']}")
        for t in judged.rules:
            for a, o, w in t.seen:
                if o == "refuted":
                    click.echo(f"refuted: {t.release} {t.code} by {a}: {w}")
        for a, w in judged.skipped:
            click.echo(f"skipped: {a}: {w}")
    return 1 if any(t.status == "refuted" for t in judged.rules) else 0


LWS_CLAIMS = ("cptest-models", "cptest-evidence", "cptest-source")
"""`compile --target lws`'s default volume claims: the model store, the probe's evidence, cptest's
source (the reference engine's pods run cptest from it)."""


@main.command(name="compile")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--target", type=click.Choice(["plan", "lws"]), default="plan", show_default=True,
              help="plan: the plan; lws: Kubernetes LeaderWorkerSet and Service YAML per server "
                   "(docs/kubernetes.md)")
@click.option("--image", default=None, help="lws: the image the pods run (default: the plan's, else the "
                                            "lock's image for the engine); name it by digest")
@click.option("--models-claim", default=LWS_CLAIMS[0], show_default=True,
              help="lws: the PersistentVolumeClaim holding the model store")
@click.option("--evidence-claim", default=LWS_CLAIMS[1], show_default=True,
              help="lws: the PersistentVolumeClaim the probe writes rank files to")
@click.option("--source-claim", default=LWS_CLAIMS[2], show_default=True,
              help="lws: the PersistentVolumeClaim holding cptest's source (cptest/ at its root), which the "
                   "reference engine's pods run")
@click.option("--placement", "placement_mode", type=click.Choice(["physical", "colocated"]),
              default="physical", show_default=True,
              help="colocated: the plan of every rank as its own local node process, ranks sharing GPUs "
                   "(docs/placement.md)")
@click.option("--gpus", default=None, metavar="IDS", help="physical GPUs for the servers, e.g. 2,3")
@json_option
@_guard
def compile_(file: Path, target: str, image: str | None, models_claim: str, evidence_claim: str,
             source_claim: str, placement_mode: str, gpus: str | None, as_json: bool) -> int:
    """Print the plan of a scenario (argv, GPUs, environment, requests, faults, expectations, pins),
    or with --target lws its Kubernetes manifests."""
    from cptest.lang import parse_file
    from cptest.plan import plan

    claims = (models_claim, evidence_claim, source_claim)
    if target != "lws" and (image is not None or claims != LWS_CLAIMS):
        raise click.UsageError("--image, --models-claim, --evidence-claim and --source-claim go with "
                               "--target lws")
    if target == "lws" and placement_mode == "colocated":
        raise click.UsageError("--placement colocated is a plan for one machine; a LeaderWorkerSet places "
                               "one rank per GPU")
    place = _placement(gpus, None, None).model_copy(update={"mode": placement_mode})
    p = plan(parse_file(file), placement=place)
    if target == "lws":
        return _compile_lws(p, image, claims, as_json)
    if as_json:
        click.echo(p.model_dump_json(indent=2))
        return 0
    for server in p.servers():
        colo = server.colocation
        where = (f", co-located: ranks on GPUs {colo.rank_gpus}, mem fraction {colo.mem_fraction} "
                 f"({colo.mem_fraction_basis})" if colo else "")
        click.echo(f"{server.role}: {server.engine} {server.release}, world {server.world_size}, "
                   f"eager {server.eager}{where}")
        for node in server.nodes:
            click.echo(f"  node {node.node_rank} gpus {node.gpu_ids}: {' '.join(node.argv)}")
    w = p.workload
    click.echo(f"workload: {len(w.requests)} requests, concurrency {w.concurrency}, rate {w.rate_per_s}")
    for f in p.faults:
        click.echo(_fault_text(f))
    for e in p.expectations:
        fields = e.model_dump(exclude={"kind", "role", "expect_violation", "source"})
        click.echo(f"expect {e.kind}{' (violation expected)' if e.expect_violation else ''}: {fields}")
    return 0


def _compile_lws(p: Any, image: str | None, claims: tuple[str, str, str], as_json: bool) -> int:
    """`compile --target lws`: the manifests on stdout (YAML, or CompileLwsOut under --json), what the
    user must still do (an image to pin, cptest's source to provide) on stderr."""
    from cptest.k8s import image as images
    from cptest.k8s.render import Volumes, render
    from cptest.k8s.yaml_text import dump

    out = render(p, images.resolve(p, image), Volumes(*claims))
    text = dump(out.objects, [f"cptest compile --target lws: scenario {p.scenario}, plan sha256 "
                              f"{out.plan_sha256}", "rendered offline, never applied by cptest "
                              "(docs/kubernetes.md)"])
    if as_json:
        kinds = [{"kind": o["kind"], "name": o["metadata"]["name"],
                  "role": o["metadata"]["labels"]["cptest/role"]} for o in out.objects]
        _emit({"target": "lws", "scenario": p.scenario, "plan_sha256": out.plan_sha256,
               "objects": kinds, "manifests": out.objects, "yaml": text, "notes": out.notes}, True, "")
    else:
        click.echo(text, nl=False)
    for note in out.notes:
        click.echo(f"cptest: {note}", err=True)
    return 0


def _fault_text(f: Any) -> str:
    """Every field of a planned fault, its trigger included: `fault 0: kill rank 1 after 8 requests
    (process title sglang::scheduler_TP1)`; a field without a phrase of its own is shown as `name value`."""
    words = [f"fault {f.index}: {f.action} {f.target}" + (f" {f.rank}" if f.rank is not None else "")]
    phrases = {"at_s": "at {} s", "after_requests": "after {} requests",
               "after_decode_steps": "after {} decode steps", "heal_after_s": "healed (SIGCONT) after {} s",
               "process_title": "(process title {})"}  # fmt: skip
    shown = {"index", "action", "target", "rank"}
    for name, value in f.model_dump().items():
        if name in shown or value is None:
            continue
        words.append(phrases[name].format(value) if name in phrases else f"{name} {value}")
    return " ".join(words)


@main.command()
@click.option("--command", "command_name", metavar="NAME",
              help="the JSON Schema of this command's --json output instead (`cptest schema --list`)")
@click.option("--list", "list_", is_flag=True, help="the commands whose --json output has a schema")
@json_option
@_guard
def schema(command_name: str | None, list_: bool, as_json: bool) -> int:
    """Print the JSON Schema of the scenario model; with --command NAME, the schema of that command's
    --json output (every command has one); --list names them."""
    from cptest import interface
    from cptest.errors import Problem, ScenarioError, did_you_mean, one_of
    from cptest.scenario import json_schema

    if list_:
        _emit({"commands": list(interface.OUTPUTS)}, as_json, "\n".join(interface.OUTPUTS))
        return 0
    if command_name is None:
        click.echo(json.dumps(json_schema(), indent=2))
        return 0
    name = interface.command_name(command_name)
    if name is None:
        near = did_you_mean(command_name, interface.OUTPUTS)
        raise ScenarioError(Problem(None, f"cptest schema: no command {command_name!r}",
                                    expected=one_of(interface.OUTPUTS),
                                    hint=f"did you mean {near!r}?" if near else "cptest schema --list"))
    click.echo(json.dumps(interface.schema_of(name), indent=2))
    return 0


# ------------------------------------------------------------------------------ running
@main.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=RUNS,
              show_default=True, help="where the archive goes (trial runs; `cptest publish` puts a verified "
              "archive into results/)")
@click.option("--launcher", type=click.Choice(["process", "docker", "slurm"]), default="process",
              show_default=True)
@click.option("--ignore-lint", is_flag=True, help="run even when lint finds a mismatch")
@click.option("--engine", "engine_name", type=click.Choice(["sglang", "reference"]), default=None,
              help="override the scenario's engine (with no GPU, sglang scenarios run on the reference)")
@click.option("--gpus", default=None, metavar="IDS",
              help="physical GPUs for the servers, e.g. 2,3 (default 0..n-1)")
@click.option("--cpus", default=None, metavar="IDS", help="pin every server process to these CPUs, e.g. 4-9")
@click.option("--ports", default=None, metavar="MAIN,BASELINE",
              help="HTTP ports of the main and baseline server (default: the first port slot from "
              "30000,30100 that no other cptest process holds, claimed for the run)")
@placement_options
@baseline_options
@models_option
@engine_python_option
@unsafe_option
@json_option
@_guard
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
                                placement=_placement(gpus, cpus, ports, rank_mem_fraction),
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
            _emit({"launched": False, "blocked_by": "lint",
                   "findings": [_finding_json(file, f) for f in prepared.findings if f.blocks]}, True, "")
        click.echo("cptest: lint findings; nothing was launched (--ignore-lint to run anyway)", err=True)
        return 1
    out = pipeline.new_archive(results, prepared, datetime.now(UTC))
    outcome = pipeline.run_scenario(prepared.plan, out,
                                    launcher_named(launcher, engine_python=engine_python),
                                    scenario_text=prepared.text, log=_log(as_json),
                                    includes=prepared.includes,
                                    run_options=_run_options(baseline_cache, no_baseline_cache),
                                    models=models, scenario_dir=file.parent)
    return _outcome(outcome, as_json)


def _placement(gpus: str | None, cpus: str | None, ports: str | None,
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


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=RUNS,
              show_default=True, help="where the archive goes (trial runs; `cptest publish` puts a verified "
              "archive into results/)")
@click.option("--gpus", default=None, metavar="IDS", help="the GPUs the suite may use (default: every GPU)")
@click.option("--cpus", default=None, metavar="IDS", help="the CPUs the suite may use (default: all it may)")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="at most this many scenarios at once (1: one at a time)")
@click.option("--launcher", type=click.Choice(["process", "docker", "slurm"]), default="process",
              show_default=True)
@click.option("--ignore-lint", is_flag=True, help="run scenarios even when lint finds a mismatch")
@click.option("--engine", "engine_name", type=click.Choice(["sglang", "reference"]), default=None,
              help="override every scenario's engine")
@placement_options
@baseline_options
@models_option
@engine_python_option
@unsafe_option
@json_option
@_guard
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
    done = run_suite(scenario_files(paths), machine, results=results, log=_log(as_json), engine=engine_name,
                     gpu_present=shutil.which("nvidia-smi") is not None, models=store_dir(models), jobs=jobs,
                     ignore_lint=ignore_lint, launcher=launcher,
                     baseline_cache=None if no_baseline_cache else baseline_cache,
                     placement_mode=placement_mode, rank_mem_fraction=rank_mem_fraction)
    _emit(done.record | {"folder": str(done.folder)}, as_json, (done.folder / "summary.md").read_text())
    return done.exit_code


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=RUNS,
              show_default=True, help="where the archive goes (trial runs; `cptest publish` puts a verified "
              "archive into results/)")
@click.option("--launcher", type=click.Choice(["process", "docker", "slurm"]), default="process",
              show_default=True)
@click.option("--accept-plan-changes", is_flag=True,
              help="run even when this cptest plans the archived scenario to execute something else than "
              "the archived plan did (argv, environment, image, mounts, GPUs); refused otherwise, exit 3")
@baseline_options
@models_option
@engine_python_option
@unsafe_option
@json_option
@_guard
@_archive_guard
def rerun(directory: Path, results: Path, launcher: str, accept_plan_changes: bool, baseline_cache: Path,
          no_baseline_cache: bool, models: Path | None, as_json: bool, allow_unsafe: bool = False,
          engine_python: str | None = None) -> int:
    """Plan an archive's scenario again (never its archived argv), run it with the same pins (the
    model found by its hash), then diff the evidence. A plan that would execute something else than
    the archived one is shown and refused (exit 3) unless --accept-plan-changes."""
    from cptest import pipeline
    from cptest.run.launcher import launcher_named

    done = pipeline.rerun(directory, results, launcher_named(launcher, engine_python=engine_python),
                          log=_log(as_json),
                          now=datetime.now(UTC), run_options=_run_options(baseline_cache, no_baseline_cache),
                          models=models, gpu_present=shutil.which("nvidia-smi") is not None,
                          accept_plan_changes=accept_plan_changes, allow_unsafe=allow_unsafe)
    if as_json:  # one JSON document: the new run's verdict with the diff beside it
        outcome = done.outcome
        click.echo(json.dumps(json.loads(outcome.verdict.to_json()) | {"archive": str(outcome.archive),
                              "diff": done.diff.as_json()}, indent=2, sort_keys=True))  # fmt: skip
        if outcome.error is not None:
            click.echo(outcome.error.render(), err=True)
    else:
        _outcome(done.outcome, as_json)
        click.echo(done.diff.render())
    return done.exit_code


def _log(as_json: bool = False) -> Any:
    """The outline of a long command on stderr (`cptest.console`): a live display on a terminal, plain
    lines otherwise, no live display under --json or NO_COLOR (stdout stays the JSON document)."""
    from cptest.console import console_sink
    from cptest.outline import Logger

    return Logger([console_sink(sys.stderr, live_allowed=not as_json)])


def _outcome(outcome: Any, as_json: bool) -> int:
    """Print a run's verdict (and the fault that stopped it); return its exit code."""
    verdict = outcome.verdict
    _emit(json.loads(verdict.to_json()) | {"archive": str(outcome.archive)}, as_json,
          _verdict_text(verdict, outcome.archive))
    if outcome.error is not None:
        click.echo(outcome.error.render(), err=True)
    return outcome.exit_code


def _verdict_text(verdict: Any, out: Path) -> str:
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


# ------------------------------------------------------------------------------ archives
@main.command()
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--write", is_flag=True,
              help="write the verdicts as a re-analysis beside the sealed archive (analyses/<UTC time>/, "
                   "never over the seal; the archive must match its seal); finish an archive that was "
                   "never finished")
@json_option
@_guard
@_archive_guard
def check(directory: Path, write: bool, as_json: bool) -> int:
    """Recompute verdicts from an archive's evidence alone (no GPU); compare with the verdict it holds
    (its newest re-analysis's, else verdict.json). The plan is first compiled again from the
    archived scenario: a plan.json that differs from it (expectations, argv, environment, serve
    options) is an integrity failure (exit 3), as is a link, FIFO or folder where a file belongs."""
    from cptest import pipeline

    done = pipeline.check_archive(directory, write=write, integrity=True, now=datetime.now(UTC))
    _emit(json.loads(done.verdict.to_json()) | {"archive": str(directory), "differs": bool(done.differs)},
          as_json, _verdict_text(done.verdict, directory))
    if done.differs:
        click.echo(f"cptest: the recomputed verdict differs from {done.against}", err=True)
    if done.analysis is not None:
        click.echo(f"cptest: re-analysis written beside the seal: {done.analysis} (the seal, the evidence "
                   "and the original verdict.json are unchanged)", err=True)
    return done.exit_code


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@json_option
@_guard
@_archive_guard
def verify(directory: Path, as_json: bool) -> int:
    """Check the sha256 of every archived file against the seal (manifest.json), and each
    re-analysis beside it (analyses/) against its own manifest, the seal it names and the chain."""
    from cptest import analyses
    from cptest.errors import render_problem
    from cptest.interface import problem_json

    problems = analyses.verify_archive(directory)
    if as_json:
        _emit({"archive": str(directory), "ok": not problems,
               "problems": [problem_json(p) for p in problems]}, True, "")
    for p in problems:
        click.echo(render_problem(p, None), err=True)
    if not problems and not as_json:
        count = len(analyses.listed(directory))
        beside = f"; {count} re-analysis(es) beside it, each naming this seal" if count else ""
        click.echo(f"ok  {directory}: every file matches the seal{beside}")
    return 3 if problems else 0


@main.command()
@click.argument("a", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.argument("b", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--other-scenario", is_flag=True,
              help="compare archives of different scenarios (refused otherwise, exit 2)")
@json_option
@_guard
@_archive_guard
def diff(a: Path, b: Path, other_scenario: bool, as_json: bool) -> int:
    """Compare the evidence of two archives within the declared tolerances: token ids, K/V ownership
    and statuses exactly, logprobs and capacity within the plan's tolerances; timings are shown,
    never counted. Exit 0 no difference, 1 differences, 2 archives of different scenarios."""
    from cptest.checks.diff import diff as diff_archives

    report = diff_archives(a, b, other_scenario=other_scenario)
    _emit(report.as_json(), as_json, report.render())
    return 0 if report.same else 1


@main.command()
@click.argument("directories", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option("--support", is_flag=True,
              help="the support matrix instead: every cell of family x KV regime x mode x backend x decode, "
                   "run (archive, verdicts), ruled out (SGLang source lines) or not yet run (the scenario)")
@click.option("--scenarios", "scenario_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=Path("scenarios"), show_default=True,
              help="with --support: the scenarios that could run")
@click.option("--release", default=None,
              help="with --support: the SGLang release (default: the one cptest has cell rules for)")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="with --support: write the markdown there (docs/support-matrix.md) instead of stdout")
@json_option
@_guard
@_archive_guard
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
    _emit({"published": [str(d) for d in folders], "rows": rows, "markdown": text}, as_json, text)
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
        from cptest.engines.sglang.cells import SUPPORT_RELEASE

        release = SUPPORT_RELEASE
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
    _emit(data, as_json, f"wrote {output}" if output is not None else text.rstrip("\n"))
    return 0


@main.command()
@click.argument("directories", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False, path_type=Path))
@json_option
@_guard
@_archive_guard
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
    _emit({"servers": [r.as_json() for r in rows]}, as_json, render_table(rows))
    return 0


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--html", "as_html", is_flag=True,
              help="the self-contained HTML report (plots inline, no network); of a suite folder: its index")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the report to FILE instead of printing it")
@json_option
@_guard
@_archive_guard
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
    _emit({"archive": str(directory), "html" if as_html else "markdown": text,
           "output": str(output) if output else None}, as_json, text if output is None else f"wrote {output}")
    return 0


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=RESULTS,
              show_default=True, help="the published evidence to put the archive into")
@json_option
@_guard
@_archive_guard
def publish(directory: Path, results: Path, as_json: bool) -> int:
    """Put a trial run's archive into the published evidence (results/<scenario>/<run>), after
    checking it as `cptest verify` and `cptest check` do: a damaged or forged archive is refused
    (exit 3), an archive is never overwritten (exit 2); nothing is written when refused."""
    from cptest import pipeline

    done = pipeline.publish(directory, results)
    what = "already published, identical: nothing copied" if done.already else "published"
    _emit({"source": str(directory), "archive": str(done.archive), "scenario": done.verdict.scenario,
           "run": done.archive.name, "status": done.verdict.status, "already_published": done.already},
          as_json, f"{what}: {directory} -> {done.archive} ({done.verdict.scenario}: "
          f"{done.verdict.status.upper()}, engine {done.verdict.engine}"
          f"{', co-located' if done.verdict.placement == 'colocated' else ''}; verified and checked)")
    return 0


def _read(path: Path) -> str:
    from cptest.pipeline import read_text

    return read_text(path)


# ------------------------------------------------------------------------------ images
@main.group()
def image() -> None:
    """Images cptest makes itself from pinned inputs (images/lock.json; docs/containers.md)."""


@image.command(name="build")
@click.argument("name", type=click.Choice(["reference"]))
@click.option("--update-lock", is_flag=True,
              help="take the inputs from this machine and re-pin images/lock.json with the new digest")
@click.option("--force", is_flag=True, help="build and check even when the engine holds the pinned image")
@json_option
@_guard
def image_build(name: str, update_lock: bool, force: bool, as_json: bool) -> int:
    """Build an image from its pinned inputs, load it into the container engine ($DOCKER_HOST), check
    its digest against images/lock.json and that it runs; exit 3 when anything differs."""
    from cptest.image.build import RECIPES, build
    from cptest.image.lock import lock_path
    from cptest.run.docker import engine_client

    built = build(RECIPES[name], lock_path=lock_path(), client=engine_client(), log=_log(as_json),
                  update_lock=update_lock, force=force)
    how = (f"built and loaded: {built.layer_bytes / 1e6:.0f} MB, {built.files} entries, {built.seconds:.0f} s"
           if built.loaded else "already in the engine")
    _emit(built.to_json(), as_json, f"{built.reference}  {built.digest}  ({how})")
    return 0


if __name__ == "__main__":  # pragma: no cover
    main()


# ------------------------------------------------------------------------------ model store
@main.group()
def models() -> None:
    """The model store: checkpoints runs and reruns find by name and by tree hash."""


@models.command(name="make")
@click.argument("names", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="every tiny model of the suite")
@models_option
@json_option
@_guard
def models_make(names: tuple[str, ...], all_: bool, models: Path | None, as_json: bool) -> int:
    """Write the suite's tiny models (synthetic weights) into the store; `--all` writes every one."""
    from cptest.errors import ScenarioError
    from cptest.run.models import TINY, make_named, store_dir

    wanted = list(TINY) if all_ else list(names)
    unknown = [n for n in wanted if n not in TINY]
    if not wanted or unknown:
        what = f"unknown model {', '.join(unknown)}" if unknown else "no model named"
        raise ScenarioError(f"models make: {what}; expected one of {', '.join(TINY)} or --all")
    store = store_dir(models)
    made = []
    for name in wanted:
        directory, tree = make_named(name, store)
        made.append({"name": name, "directory": str(directory), "tree_sha256": tree})
        if not as_json:
            click.echo(f"{name}  {tree}  {directory}")
    if as_json:
        _emit({"store": str(store), "models": made}, True, "")
    return 0


@models.command(name="list")
@models_option
@json_option
@_guard
def models_list(models: Path | None, as_json: bool) -> int:
    """The checkpoints in the store, with their tree hashes and the names that link to them."""
    from cptest.run.models import store_dir, store_entries

    store = store_dir(models)
    entries = store_entries(store)
    text = "\n".join(f"{e['name']}  {e['tree_sha256']}  {', '.join(e['aliases'])}".rstrip() for e in entries)
    _emit({"store": str(store), "models": entries}, as_json, text or f"(no model in {store})")
    return 0


@models.command(name="add")
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@models_option
@json_option
@_guard
def models_add(directory: Path, models: Path | None, as_json: bool) -> int:
    """Copy a local checkpoint into the store, where reruns find it by its tree hash."""
    from cptest.errors import Problem, ScenarioError
    from cptest.run.models import add_checkpoint, store_dir

    if not (directory / "config.json").is_file():  # an empty folder would be stored as a "checkpoint"
        raise ScenarioError(Problem(None, f"models add: {directory} holds no checkpoint (no config.json)",
                                    hint="give the folder of a Hugging Face checkpoint"))
    target, tree = add_checkpoint(directory, store_dir(models))
    _emit({"directory": str(target), "tree_sha256": tree}, as_json, f"{tree}  {target}")
    return 0

