"""One scenario end to end: parse → plan → lint → run → check → archive → report, without the CLI.

Each function composes the stages and returns values; nothing here parses arguments or prints (the
CLI does, `cptest.cli`), so a test, a suite runner or a notebook can drive a whole run:

    prepared = prepare(Path("scenarios/dcp2_llama_kv1.cps"), gpu_present=False)
    outcome = run_scenario(prepared.plan, out, ProcessLauncher(), scenario_text=..., log=log,
                           models=store_dir, scenario_dir=Path("scenarios"))
    outcome.verdict.status, outcome.exit_code

Exit codes (`Outcome.exit_code`): 0 pass, 1 fail, 3 unknown or an infrastructure fault that stopped
the run. A fault never loses what was gathered: the archive is finished from the evidence it has.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from cptest import checks, paths, report, store
from cptest.checks.diff import DiffReport, diff
from cptest.engines.reference import choose
from cptest.errors import CptestError, PlanError, Problem, RunError, ScenarioError
from cptest.lang import parse_file
from cptest.outline import Logger
from cptest.plan import plan
from cptest.plan.lint import Finding, lint
from cptest.plan.model import Placement, Plan
from cptest.run.launcher import Launcher
from cptest.scenario import Scenario
from cptest.verdict import ScenarioVerdict


@dataclass(frozen=True)
class Prepared:
    """A scenario planned for the engine it will run on, with what lint found and why the engine
    was chosen (`notes`: one line each, for the user)."""

    scenario: Scenario
    plan: Plan
    engine: str
    notes: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()
    includes: Mapping[str, str] = field(default_factory=dict)
    """The `extends` files, by the name they get in the archive, with their text."""
    text: str = ""
    """The scenario file as written."""


@dataclass(frozen=True)
class Outcome:
    verdict: ScenarioVerdict
    archive: Path
    error: CptestError | None = None
    """The infrastructure fault that stopped the run, if any: the exit code is then 3, whatever the
    checks found in what was gathered (the archive is finished from that evidence)."""

    @property
    def exit_code(self) -> int:
        return 3 if self.error is not None else self.verdict.exit_code


class LintFindings(CptestError):
    """Lint found a mismatch between the scenario and its release, and nothing was launched."""

    exit_code = 1


def read_text(path: Path) -> str:
    """A scenario or archive file's text; a file that cannot be read is a ScenarioError (exit 2)."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read ({e.strerror})") from None


def include_name(include: Path, scenario_file: Path) -> str:
    """Where an extended file is stored in the archive: its path relative to the scenario, so that
    the archived scenario.cps resolves it again; a file outside the scenario's folder goes under
    includes/ by name."""
    rel = os.path.relpath(include.resolve(), scenario_file.resolve().parent)
    return rel if not rel.startswith("..") else f"includes/{include.name}"


def prepare(path: Path, *, engine: str | None = None, gpu_present: bool,
            placement: Placement | None = None) -> Prepared:
    """Parse, choose the engine, plan and lint `path`. Raises ScenarioError/PlanError on bad input.

    With no GPU an `sglang` scenario runs on the CPU reference engine (`cptest.engines.reference.
    choose` says so in a note). Lint compares the scenario with its pinned SGLang release, so it has
    nothing to say about a reference run.
    """
    text = read_text(path)
    scenario = parse_file(path)
    choice = choose(scenario, engine, gpu_present=gpu_present)
    planned = plan(choice.scenario, placement=placement)
    findings = tuple(lint(scenario)) if choice.engine == "sglang" else ()
    includes = {include_name(Path(inc), path): read_text(Path(inc)) for inc in scenario.includes}
    return Prepared(scenario, planned, choice.engine, choice.notes, findings, includes, text)


def runnable(prepared: Prepared, *, gpu_present: bool, ignore_lint: bool) -> None:
    """Check before spending: raises LintFindings (exit 1) when lint found what the release was
    observed to do against the scenario (findings from inferred rules only warn: running is how
    they get tested), unless ignored, and RunError (exit 3) for an SGLang plan on a machine
    without a GPU."""
    blocking = [f for f in prepared.findings if f.blocks]
    if blocking and not ignore_lint:
        raise LintFindings([Problem(f.span, f"{f.code}: {f.message} [observed: {f.evidence}]")
                            for f in blocking])
    if prepared.plan.main.engine == "sglang" and not gpu_present:
        raise RunError("no GPU here (nvidia-smi not found): SGLang cannot run; the CPU reference engine "
                       "(`--engine reference`) is the way to draft scenarios without a GPU")


def new_archive(results: Path, prepared: Prepared, now: datetime) -> Path:
    """Where a new run of `prepared` is archived: `results/<scenario>/<UTC time>-<hash>`."""
    # The plan's hash (of the scenario as planned for its engine), as `rerun` names its archive.
    return store.archive_dir(results, prepared.scenario.name, prepared.plan.pins.scenario_sha256, now)


def run_scenario(
    planned: Plan,
    out: Path,
    launcher: Launcher,
    *,
    scenario_text: str,
    log: Logger,
    includes: Mapping[str, str] | None = None,
    environment: Mapping[str, Any] | None = None,
    run_options: Any = None,
    preflight: Mapping[str, Any] | None = None,
    models: Path | None = None,
    scenario_dir: Path | None = None,
) -> Outcome:
    """Run `planned` and archive it under `out` (which must not exist): model weights, the first
    phase of the archive, the run, the checks, the report and the last phase.

    `models` is the model store (default `cptest.run.models.store_dir()`) and `scenario_dir` the
    scenario file's folder: the directories the plan's `<models>` and `<scenario>` tokens stand for
    (`cptest.paths`). The archive keeps the plan as made and names every directory of this machine
    by its token. `environment` defaults to `cptest.run.environment.collect_environment()`.
    First `cptest.run.preflight` looks for what this machine cannot give the plan (a missing model,
    a busy port, GPUs, disk): it raises InfrastructureError (exit 3) before anything is launched
    or archived. A RunError, Ctrl-C or a crash of cptest itself during the run is recorded as the
    outcome's `error` (exit 3); the archive is finished either way, from the evidence gathered.
    """
    # A launcher that runs images (docker) checks every one against images/lock.json now, before
    # anything is archived or launched (InfrastructureError, exit 3), and pins the verified digest
    # into the plan, so that plan.json and the manifest record what ran.
    pin_images = getattr(launcher, "pin_images", None)
    if pin_images is not None:
        planned = pin_images(planned)
    from cptest.run.models import store_dir

    roots = {paths.MODELS: (models or store_dir()).resolve(), paths.ARCHIVE: out.resolve(),
             paths.SCENARIO: (scenario_dir or Path.cwd()).resolve()}
    with paths.rooted(roots):
        return _run_rooted(planned, planned.materialized(roots), out, launcher, scenario_text=scenario_text,
                           log=log, includes=includes, environment=environment, run_options=run_options,
                           preflight=preflight)


def _run_rooted(planned: Plan, launched: Plan, out: Path, launcher: Launcher, *, scenario_text: str,
                log: Logger, includes: Mapping[str, str] | None, environment: Mapping[str, Any] | None,
                run_options: Any, preflight: Mapping[str, Any] | None) -> Outcome:
    from cptest.run.environment import collect_environment
    from cptest.run.models import ensure_synthetic, model_tree_sha256, weights_sha256
    from cptest.run.preflight import require
    from cptest.run.process import install_signal_handlers
    from cptest.run.runner import run_plan

    model_dir = launched.main.nodes[0].model_mount
    synthetic = planned.pins.model.synthetic
    if synthetic is not None:  # into the model store, not the archive: before preflight judges it
        with log.step("writing synthetic weights"):
            digest = ensure_synthetic(synthetic.model_dump(), Path(model_dir or "."))
        log.info(f"synthetic weights sha256 {digest}")
    require(launched, results=out, **(preflight or {}))
    env = dict(collect_environment(Path.cwd()) if environment is None else environment)
    env["weights_sha256"] = weights_sha256(model_dir)
    pins = planned.pins.model_dump(mode="json")
    if model_dir and Path(model_dir).is_dir():
        # The model pinned by content, whatever named it: what a rerun elsewhere looks it up by.
        pins["model"]["sha256"] = model_tree_sha256(Path(model_dir))
    if run_options is not None and getattr(run_options, "baseline_cache", None) is not None:
        from dataclasses import replace

        from cptest.run.baseline_cache import baseline_key, control_key

        run_options = replace(run_options, baseline_key=baseline_key(planned, env),
                              control_key=control_key(planned, env))
    layout = store.Layout(out)
    store.begin(
        layout, scenario=planned.scenario, scenario_text=scenario_text,
        plan_json=planned.model_dump_json(indent=2), pins=pins,
        environment=paths.portable_value(env), roles=roles_of(planned), includes=includes,
    )  # fmt: skip
    log.info(f"archive: {out}")
    restore = install_signal_handlers()
    error: CptestError | None = None
    try:
        run_plan(launched, out, launcher=launcher, log=log, options=run_options)
    except RunError as e:
        error = e  # evidence gathered so far is kept; the verdict says unknown with the reason
    except KeyboardInterrupt:
        # Ctrl-C: the runner tore everything down; the archive still gets an (unknown) verdict.
        error = RunError("interrupted by Ctrl-C; every started process was torn down")
    except Exception as e:  # cptest's own bug: never the engine's verdict
        error = _crashed(out, e)
    finally:
        restore()
    verdict = checks.check(out, require_finished=False)  # this run is the one finishing it
    finish_archive(out, verdict, planned)
    return Outcome(verdict, out, error)


class CptestCrash(RunError):
    """cptest itself raised an unexpected exception during a run: exit 3, not the engine's doing."""


def _crashed(out: Path, e: Exception) -> CptestCrash:
    """The crash as the run's error, its traceback kept in the archive (logs/cptest-crash.txt)."""
    import traceback

    where = store.Layout(out).logs_dir / "cptest-crash.txt"
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(paths.portable("".join(traceback.format_exception(e))), encoding="utf-8")
    return CptestCrash(f"unknown (cptest_crash): cptest crashed ({type(e).__name__}: {e}), a bug in cptest, "
                       f"not the engine's behaviour; the traceback is in {paths.portable(str(where))}: "
                       "please report it")


def roles_of(planned: Plan) -> list[str]:
    return [s.role for s in planned.servers()]


def finish_archive(root: Path, verdict: ScenarioVerdict, planned: Plan | None = None) -> dict[str, Any]:
    """The last phase of an archive: verdict.json, report.md, junit.xml and the final manifest."""
    layout = store.Layout(root)
    if planned is None:
        planned = checks.load_plan(root)
    return store.finish(
        layout, verdict_json=verdict.to_json(), report_md=report.render(verdict, planned),
        junit_xml=report.render_junit(verdict), scenario=planned.scenario,
        pins=planned.pins.model_dump(mode="json"),
    )  # fmt: skip


@dataclass(frozen=True)
class Recheck:
    verdict: ScenarioVerdict
    differs: bool
    """The stored verdict.json is not what the evidence gives now."""

    @property
    def exit_code(self) -> int:
        return max(self.verdict.exit_code, 1) if self.differs else self.verdict.exit_code


def check_archive(root: Path, *, write: bool = False) -> Recheck:
    """Recompute an archive's verdicts from its evidence alone; with `write`, finish the archive with
    them (an explicit act, so the archive need not have been finished before)."""
    verdict = checks.check(root, require_finished=not write)
    layout = store.Layout(root)
    if write:
        finish_archive(root, verdict)
        return Recheck(verdict, False)
    differs = layout.verdict.is_file() and read_text(layout.verdict) != verdict.to_json()
    return Recheck(verdict, differs)


@dataclass(frozen=True)
class Rerun:
    outcome: Outcome
    diff: DiffReport

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code if self.diff.same else max(self.outcome.exit_code, 1)


def rerun(archive: Path, results: Path, launcher: Launcher, *, log: Logger, now: datetime,
          environment: Mapping[str, Any] | None = None, run_options: Any = None,
          models: Path | None = None, gpu_present: bool = True) -> Rerun:
    """Run an archive's scenario again into a new archive under `results`, then diff the evidence
    (`environment`, `run_options` and `models` as for `run_scenario`).

    The run is planned afresh from the archived scenario.cps and its includes, on the archived
    engine, ports and GPUs, by this cptest: nothing of the machine that made the archive is needed.
    The model is found by content: the manifest's tree hash pins it (a synthetic checkpoint is
    written again and must come out the same; a local one is looked up in the model store by its
    hash when it is not next to the scenario), and anything else stops the rerun as `unknown`
    before launch."""
    from cptest.run.models import find_by_tree_sha256, store_dir
    from cptest.run.preflight import Cause, InfrastructureError

    layout = store.Layout(archive)
    try:
        archived = Plan.model_validate_json(read_text(layout.plan))
    except ValueError as e:
        raise PlanError(f"{layout.plan}: not a plan this cptest can read ({e})") from None
    prepared = prepare(layout.scenario, engine=archived.main.engine, gpu_present=gpu_present,
                       placement=_placement_of(archived))
    planned = prepared.plan
    manifest = store.read_manifest(layout) or {}
    pinned = ((manifest.get("pins") or {}).get("model") or {}).get("sha256") or archived.pins.model.sha256
    store_root = (models or store_dir()).resolve()
    if pinned and planned.pins.model.kind == "local":
        location = planned.main.nodes[0].model_mount or ""
        roots = {paths.SCENARIO: archive.resolve(), paths.MODELS: store_root}
        here = Path(paths.materialize(location, roots))
        if not here.is_dir():
            found = find_by_tree_sha256(store_root, pinned)
            if found is None:
                raise InfrastructureError([Cause(
                    "model_missing", f"no checkpoint with tree sha256 {pinned} in the model store "
                    f"{store_root} (the archive's model was {location})",
                    f"put a copy there: cptest models add DIR --models {store_root}")])  # fmt: skip
            planned = planned.with_model_location(location, f"{paths.MODELS}/{found.name}")
    if pinned:
        planned = planned.model_copy(update={"pins": planned.pins.model_copy(update={
            "model": planned.pins.model.model_copy(update={"sha256": pinned})})})  # fmt: skip
    if planned.pins.scenario_sha256 != archived.pins.scenario_sha256:
        log.warning("the archived scenario plans to another scenario hash than the archive records "
                    f"({planned.pins.scenario_sha256[:12]} vs {archived.pins.scenario_sha256[:12]})")
    out = store.archive_dir(results, planned.scenario, planned.pins.scenario_sha256, now)
    outcome = run_scenario(planned, out, launcher, scenario_text=prepared.text, log=log,
                           includes=prepared.includes, environment=environment, run_options=run_options,
                           models=store_root, scenario_dir=archive)
    return Rerun(outcome, diff(archive, out))


def _placement_of(archived: Plan) -> Placement:
    """Where the archived run's servers ran: the same ports and GPUs (CPUs only where this machine
    has them all, else unpinned)."""
    node = archived.main.nodes[0]
    base = archived.baseline.nodes[0].port if archived.baseline is not None else Placement().baseline_port
    cpus = node.cpus
    if cpus and not set(cpus) <= set(os.sched_getaffinity(0)):
        cpus = None
    return Placement(main_port=node.port, baseline_port=base, gpus=list(node.gpu_ids) or None, cpus=cpus)


def launcher_named(name: str) -> Launcher:
    """The launcher the CLI's `--launcher` names: `process` (local process trees) or `docker`."""
    if name == "docker":
        from cptest.run.docker import DockerLauncher

        return DockerLauncher()
    from cptest.run.process import ProcessLauncher

    return ProcessLauncher()


