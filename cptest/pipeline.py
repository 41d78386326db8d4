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
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from cptest import analyses, bounds, checks, paths, report, store
from cptest.checks.archived import _absolute_include, archived_reader, include_name, parse_archived
from cptest.checks.diff import DiffReport, diff
from cptest.engines.reference import choose
from cptest.errors import CptestError, PlanError, Problem, RunError, ScenarioError, Span
from cptest.lang import parse_file
from cptest.lang.files import read_path
from cptest.outline import Logger
from cptest.plan import plan
from cptest.plan.archive_reader import placement_of
from cptest.plan.build import require_allowed
from cptest.plan.compare import FAILED, integrity_differences, plan_changes, short
from cptest.plan.flags import flag_problems
from cptest.plan.lint import Finding, lint
from cptest.plan.model import Placement, Plan
from cptest.run.launcher import Launcher
from cptest.scenario import Scenario
from cptest.verdict import ScenarioVerdict, read_verdict


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
    """A scenario file's text, read as the parser reads it (`lang.files.read_path`: a regular file
    of bounded size, never a FIFO or /dev/zero); a file that cannot be read is a ScenarioError (exit 2)."""
    try:
        return read_path(str(path))
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


PLACEMENT_CHOICES = ("auto", "physical", "colocated")
"""`--placement`: `auto` co-locates an SGLang plan on a machine with fewer GPUs than its widest
server has ranks (and says so), `physical` never does (such a plan is then `unknown
(gpus_missing)`), `colocated` always does (docs/placement.md)."""


def prepare(path: Path, *, engine: str | None = None, gpu_present: bool,
            placement: Placement | None = None, archived: bool = False,
            placement_mode: str | None = None, gpus_here: int | None = None) -> Prepared:
    """Parse, choose the engine, plan and lint `path`. Raises ScenarioError/PlanError on bad input.

    With no GPU an `sglang` scenario runs on the CPU reference engine (`cptest.engines.reference.
    choose` says so in a note). Lint compares the scenario with its pinned SGLang release, so it has
    nothing to say about a reference run. `archived`: `path` is an archive's scenario.cps, parsed by
    `parse_archived` (its includes from the archive's `includes/` folder, never through a link).
    `placement_mode` `auto` (`PLACEMENT_CHOICES`) decides between `placement`'s physical and
    co-located form from `gpus_here`, the GPUs this machine has; any other mode replaces
    `placement.mode`; None keeps `placement` as given. A co-located plan's first note says so.
    """
    if archived:
        text = store.read_file(path)
        scenario = parse_archived(path.parent)
    else:
        text = read_text(path)
        scenario = parse_file(path)
    # The flags are judged against the release the scenario names, even where the reference engine
    # stands in for it and passes none: the same file is refused on every machine.
    bad_flags = flag_problems(scenario)
    if bad_flags:
        raise PlanError(bad_flags)
    choice = choose(scenario, engine, gpu_present=gpu_present)
    place = placement or Placement()
    notes = list(choice.notes)
    if placement_mode in ("physical", "colocated"):
        place = place.model_copy(update={"mode": placement_mode})
    auto = placement_mode == "auto" and place.mode == "physical" and choice.engine == "sglang"
    have = len(place.gpus) if place.gpus is not None else gpus_here
    if auto and have is not None:
        # Planned co-located first: a physical plan of more GPUs than named is no plan at all.
        planned = plan(choice.scenario, placement=place.model_copy(update={"mode": "colocated"}))
        widest = max(s.topology.world_size // max(s.topology.nodes, 1) for s in planned.servers())
        if widest > have:
            notes.insert(0, colocated_note(planned, f"this machine gives {have} GPU(s) and a server has "
                                                    f"{widest} ranks per node"))
        else:
            planned = plan(choice.scenario, placement=place)
    else:
        planned = plan(choice.scenario, placement=place)
    if not auto and planned.placement == "colocated":
        why = "--placement colocated" if placement_mode == "colocated" else "the placement it was given"
        notes.insert(0, colocated_note(planned, why))
    _require_archivable(scenario, planned)
    findings = tuple(lint(scenario)) if choice.engine == "sglang" else ()
    read = archived_reader(path.parent) if archived else read_path
    includes = {}
    texts = {str(path): text}
    for inc in scenario.includes:
        name, included = include_name(Path(inc), path), read(inc)
        includes[name] = included
        texts[inc] = included
    for inc in _named_absolutely(texts):
        # An extends named by an absolute path resolves to that path, not relative to the archive:
        # kept there too (`archived_reader`). Only then: an `includes/@abs/` copy of every file above
        # the scenario's folder named this machine's directories in every archive of the
        # qualification scenarios (`extends "../defaults/tiny.cps"`).
        if inc in texts:
            includes[_absolute_include(inc)] = texts[inc]
    return Prepared(scenario, planned, choice.engine, tuple(notes), findings, includes, text)


def _require_archivable(scenario: Scenario, planned: Plan) -> None:
    """PlanError (exit 2) when the plan, as `begin` archives it, is larger than cptest reads of an
    archive's plan.json (`bounds.PLAN`): cptest never writes an archive it would refuse to read."""
    size = len(planned.model_dump_json(indent=2).encode())
    most = bounds.PLAN.bytes
    if size > most:
        raise PlanError(Problem(
            scenario.workload.where("requests"), f"the plan would be {bounds.size_text(size)}, more than an "
            f"archive's plan.json may be ({bounds.size_text(most)})",
            hint="fewer requests or shorter prompts: the plan stores every prompt's token ids "
            "(cptest/bounds.py says why the figure is what it is)"))  # fmt: skip


def colocated_note(planned: Plan, why: str) -> str:
    """The line a co-located run starts with: why, where the ranks go, what it cannot show."""
    colo = [s.colocation for s in planned.servers() if s.colocation is not None]
    gpus = sorted({g for c in colo for g in c.rank_gpus})
    most = max(c.ranks_per_gpu for c in colo)
    where = (f"up to {most} on one GPU (GPU {', '.join(map(str, gpus))})" if planned.main.engine == "sglang"
             else "on this machine's CPUs")
    return (f"cptest: co-located placement ({why}): each rank runs as its own local node process, {where}, "
            f"{colo[0].transport}; every verdict and report is labelled co-located and says nothing about "
            "speed (docs/placement.md)")


def _named_absolutely(texts: dict[str, str]) -> set[str]:
    """The extends targets that one of the chain's files names by an absolute path."""
    from cptest.lang.syntax import read_doc

    out = set()
    for name, text in texts.items():
        for stmt in read_doc(text, name).stmts:
            if stmt.block == "" and stmt.key == "extends" and os.path.isabs(str(stmt.value)):
                out.add(os.path.normpath(str(stmt.value)))
    return out


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
    """A free archive path for a run of `prepared`: `results/<scenario>/<UTC time>-<hash>`, reserved
    exclusively (`store.create_archive`: a run that took the name in the same second leaves it
    `-2`); `begin` creates it. Raises PlanError for a scenario name that cannot name a folder."""
    # The plan's hash (of the scenario as planned for its engine), as `rerun` names its archive.
    return _create(results, prepared.plan.scenario, prepared.plan.pins.scenario_sha256, now)


def _create(results: Path, scenario: str, sha: str, now: datetime) -> Path:
    try:
        return store.create_archive(results, scenario, sha, now)
    except ValueError as e:
        raise PlanError(f"no archive written: {e}") from None


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
    try:
        with paths.rooted(roots):
            return _run_rooted(planned, planned.materialized(roots), out, launcher,
                               scenario_text=scenario_text, log=log, includes=includes,
                               environment=environment, run_options=run_options, preflight=preflight)
    except BaseException:
        # Stopped before `begin` (preflight): the name `new_archive` reserved is released, and the
        # scenario's and the results' folders it made go when they are left empty.
        store.release_claim(out)
        for folder in (out.parent, out.parent.parent):
            if not folder.is_dir() or folder.is_symlink() or any(folder.iterdir()):
                break
            folder.rmdir()
        raise


def _run_rooted(planned: Plan, launched: Plan, out: Path, launcher: Launcher, *, scenario_text: str,
                log: Logger, includes: Mapping[str, str] | None, environment: Mapping[str, Any] | None,
                run_options: Any, preflight: Mapping[str, Any] | None) -> Outcome:
    from cptest.run.environment import collect_environment
    from cptest.run.interpreter import inspect_launched, manifest_facts
    from cptest.run.models import ensure_synthetic, model_tree_sha256, weights_sha256
    from cptest.run.preflight import require
    from cptest.run.process import Interrupted, install_signal_handlers
    from cptest.run.runner import run_plan

    model_dir = launched.main.nodes[0].model_mount
    synthetic = planned.pins.model.synthetic
    if synthetic is not None:  # into the model store, not the archive: before preflight judges it
        with log.step("writing synthetic weights"):
            digest = ensure_synthetic(synthetic.model_dump(), Path(model_dir or "."))
        log.info(f"synthetic weights sha256 {digest}")
    # A launcher with a cluster behind it (slurm) says whether it can run the plan now: no client,
    # no controller, too few nodes are infrastructure (InfrastructureError, exit 3), never FAIL.
    launcher_preflight = getattr(launcher, "preflight", None)
    if launcher_preflight is not None:
        from cptest.run.preflight import InfrastructureError

        causes = launcher_preflight(launched)
        if causes:
            raise InfrastructureError(causes)
    engine_python = inspect_launched(launched, launcher)
    require(launched, results=out, engine_python=engine_python, **(preflight or {}))
    env = dict(collect_environment(Path.cwd()) if environment is None else environment)
    env.update(manifest_facts(env, engine_python, launcher))
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
    # From here a SIGTERM or SIGHUP is an exception (the CLI installs the same handler earlier). One
    # that comes while the archive is being begun waits until it is, and is raised inside the `try`
    # below: a begun archive always ends finished, its verdict unknown.
    restore = install_signal_handlers()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    try:
        store.begin(
            layout, scenario=planned.scenario, scenario_text=scenario_text,
            plan_json=planned.model_dump_json(indent=2), pins=pins,
            environment=paths.portable_value(env), roles=roles_of(planned), includes=includes,
        )  # fmt: skip
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        restore()
        raise
    error: CptestError | None = None
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        log.info(f"archive: {out}")
        run_plan(launched, out, launcher=launcher, log=log, options=run_options)
    except RunError as e:
        error = e  # evidence gathered so far is kept; the verdict says unknown with the reason
    except KeyboardInterrupt as e:
        # Ctrl-C or SIGTERM: the runner tore everything down; the archive still gets an (unknown) verdict.
        by = signal.Signals(e.signum).name if isinstance(e, Interrupted) else "Ctrl-C"
        error = RunError(f"interrupted by {by}; every started process was torn down")
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
    """The last phase of an archive: verdict.json, report.md, report.html, junit.xml and the final
    manifest. `cptest check --write` comes here too, so a re-finished archive gets all of them."""
    from cptest.report.html import render_html  # matplotlib: imported only when an archive is finished

    layout = store.Layout(root)
    if planned is None:
        planned = checks.load_plan(root)
    return store.finish(
        layout, verdict_json=verdict.to_json(), report_md=report.render(verdict, planned),
        junit_xml=report.render_junit(verdict), scenario=planned.scenario,
        pins=planned.pins.model_dump(mode="json"), report_html=render_html(root, verdict, planned),
    )  # fmt: skip


@dataclass(frozen=True)
class Recheck:
    verdict: ScenarioVerdict
    differs: bool
    """The verdict the archive holds now (`against`) is not what the evidence gives."""
    against: Path | None = None
    """The verdict.json compared with: the newest re-analysis's, else the seal's own."""
    analysis: Path | None = None
    """The re-analysis `check --write` wrote beside the seal, if it wrote one."""

    @property
    def exit_code(self) -> int:
        return max(self.verdict.exit_code, 1) if self.differs else self.verdict.exit_code


def check_archive(root: Path, *, write: bool = False, integrity: bool = True,
                  now: datetime | None = None) -> Recheck:
    """Recompute an archive's verdicts from its evidence alone and compare them with the verdict it
    holds now (the newest re-analysis's verdict.json, else the seal's own).

    `write` on a sealed archive (its manifest is finished) writes a re-analysis beside the seal
    (`reanalyse`, named by `now`), never over it; the archive must match its seal first. `write` on
    an archive that was never finished (cptest stopped before its last phase) finishes it: the
    seal's first writing, refused when a file the first manifest lists (scenario, includes, plan)
    changed since, or when the archive has no manifest at all (cptest began no archive there).

    With `integrity` (the default, and what `cptest check` does) the plan is first compiled again
    from the archived scenario.cps and its includes, and a plan.json that differs from it in what
    judges or runs (`integrity_problems`) is refused: IntegrityError (exit 3) naming each
    difference. `integrity=False` is for archives built from a hand-made plan with no real scenario
    behind it (tests, synthetic fixtures): a library caller judging an archive it was given gets
    the same check as the CLI unless it says otherwise.
    Either way an archive holding a link, a FIFO or a folder where a file belongs is an
    IntegrityError, and nothing is read or written through a link."""
    from datetime import UTC

    store.require_plain(root)
    layout = store.Layout(root)
    sealed = store.is_finished(layout)
    if write and sealed:
        _require_seal(root)
    if write and not sealed and not store.existing_file(layout.manifest):
        raise store.IntegrityError(Problem(Span(str(layout.manifest), 1, 1), "archive has no manifest.json: "
                                           "cptest began no archive here, so there is nothing to finish; "
                                           "nothing written"))
    if integrity:
        problems = integrity_problems(root)
        if problems:
            raise store.IntegrityError(problems)
    verdict = checks.check(root, require_finished=not write)
    if write and sealed:
        return Recheck(verdict, False, analysis=reanalyse(root, verdict, now or datetime.now(UTC)))
    if write:
        finish_archive(root, verdict)
        return Recheck(verdict, False, against=layout.verdict)
    current = analyses.current_verdict_file(root)
    differs = store.existing_file(current) and store.read_file(current) != verdict.to_json()
    return Recheck(verdict, differs, against=current)


def _require_seal(root: Path) -> None:
    """IntegrityError naming every file that does not match the archive's seal or its analyses."""
    problems = analyses.verify_archive(root)
    if problems:
        raise store.IntegrityError(problems)


def reanalyse(root: Path, verdict: ScenarioVerdict, now: datetime) -> Path:
    """Write `verdict` of the sealed archive at `root` as a re-analysis beside its seal
    (`analyses.write`): verdict.json, report.md, report.html and junit.xml rendered as `finish_archive`
    renders them, under `analyses/<UTC time>/` with a manifest naming the seal. Returns its folder."""
    from cptest import __version__
    from cptest.report.html import render_html  # matplotlib: imported only when an analysis is written

    planned = checks.load_plan(root)
    files = {store.VERDICT: verdict.to_json(), store.REPORT: report.render(verdict, planned),
             store.REPORT_HTML: render_html(root, verdict, planned),
             store.JUNIT: report.render_junit(verdict)}
    return analyses.write(root, files, now=now, cptest_version=__version__)


@dataclass(frozen=True)
class Judged:
    """A sealed archive judged before anything it says is shown or published (`judge`)."""

    verdict: ScenarioVerdict
    """Recomputed from the evidence; equal to the verdict the archive holds now."""
    plan: Plan
    seal: str
    """The sha256 of the archive's manifest.json."""
    analysis: Path | None
    """The newest re-analysis beside the seal, whose verdict this is; None: the seal's own."""

    @property
    def label(self) -> str | None:
        """`re-analysis <name> of seal <sha256[:12]>`, or None for the seal's own verdict."""
        if self.analysis is None:
            return None
        return f"re-analysis {self.analysis.name} of seal {self.seal[:12]}"


def judge(root: Path) -> Judged:
    """What `verify`, `publish`, `matrix` and `report` ask of an archive before they show or copy
    anything of it: every file matches the seal and every re-analysis its own manifest, the seal
    it names and the chain (`analyses.verify_archive`); the plan is what the archived scenario plans
    (`integrity_problems`: argv, environment and serve included); and the verdict the archive holds
    now (the newest re-analysis's, else the seal's) is what the evidence gives when judged again.
    Anything else is an IntegrityError (exit 3) naming the file."""
    store.require_plain(root)
    _require_seal(root)
    problems = integrity_problems(root)
    if problems:
        raise store.IntegrityError(problems)
    verdict = checks.check(root)
    current = analyses.current_verdict_file(root)
    if store.read_file(current) != verdict.to_json():
        rel = current.relative_to(root).as_posix()
        try:
            held = read_verdict(current).status
        except CptestError:
            held = "unreadable"
        raise store.IntegrityError(Problem(
            Span(str(current), 1, 1), f"{rel} is not what the evidence gives (recomputed: {verdict.status}, "
            f"archived: {held})", hint=f"`cptest check {root}` shows both; `cptest check --write {root}` "
            "writes a re-analysis beside the seal"))  # fmt: skip
    seal = store.seal_sha256(store.Layout(root))
    return Judged(verdict, checks.load_plan(root), seal, analyses.newest(root))


class PublishRefused(CptestError):
    """`publish` would overwrite another archive, or the name is being written by a run: exit 2,
    nothing written (the archive itself may be fine)."""


@dataclass(frozen=True)
class Published:
    source: Path
    archive: Path
    verdict: ScenarioVerdict
    already: bool
    """The same archive was already published there: nothing was copied."""


def publish(source: Path, results: Path) -> Published:
    """Put a trial run's archive into the published evidence: `results/<scenario>/<run>`.

    The archive must pass `judge` (every file matches the seal, which is finished, and every
    re-analysis its own manifest; the plan is what the archived scenario compiles to; the verdict
    it holds now is what the evidence gives): anything else is an IntegrityError (exit 3) and
    nothing is written.
    The copy is checked again before it is renamed into place (`store.copy_archive`), so what lands
    in the results is what was checked. Never overwrites: another archive of that name is
    PublishRefused (exit 2)."""
    def judged(root: Path) -> ScenarioVerdict:
        return judge(root).verdict

    verdict = judged(source)
    manifest = store.read_file(store.Layout(source).manifest)

    def same_archive(copy: Path) -> None:  # the copy is the archive judged above, and judges the same
        if store.read_file(store.Layout(copy).manifest) != manifest or judged(copy) != verdict:
            raise store.IntegrityError(Problem(Span(str(source), 1, 1), "the archive changed while it "
                                               "was being published; nothing published"))

    try:
        target, already = store.copy_archive(source, results, verdict.scenario, source.name, same_archive)
    except FileExistsError as e:
        raise PublishRefused(Problem(None, f"cptest publish: {e}", hint="nothing was written; a "
                                     "published archive is never replaced")) from None
    except ValueError as e:
        raise PublishRefused(Problem(None, f"cptest publish: {e}; nothing was written")) from None
    return Published(source, target, verdict, already)


def recompile(archive: Path, archived: Plan, *, gpu_present: bool = True) -> Prepared:
    """The archived scenario planned again by this cptest, for the archived engine, ports and GPUs.
    Raises ScenarioError/PlanError when it does not plan, IntegrityError when the archived plan's
    placement is not one (a port out of range)."""
    try:
        placement = placement_of(archived)
    except ValueError as e:
        where = Span(str(store.Layout(archive).plan), 1, 1)
        message = f"plan.json places its servers impossibly: {_first_line(e)}"
        raise store.IntegrityError(Problem(where, message)) from None
    return prepare(store.Layout(archive).scenario, engine=archived.main.engine, gpu_present=gpu_present,
                   placement=placement, archived=True)


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def integrity_problems(archive: Path) -> list[Problem]:
    """What the archive's plan.json says that its scenario.cps, compiled again, does not
    (`plan.compare.integrity_differences`: expectations, servers, what each node executes, serve
    options, faults, workload, layout contracts). What legitimately differs between the run and now,
    and what an older planner wrote differently, is left out (`plan.archive_reader`). A scenario that
    no longer parses or plans is a problem too."""
    layout = store.Layout(archive)
    archived = checks.load_plan(archive)
    hint = "plan.json or scenario.cps was edited after the run: restore the archive from a copy you trust"
    try:
        planned = recompile(archive, archived).plan
    except (ScenarioError, PlanError) as e:
        return [Problem(Span(str(layout.scenario), 1, 1), f"{FAILED}: the archived scenario.cps does not "
                        f"compile: {_first_line(e)}", hint=hint)]
    return integrity_differences(archived, planned, str(layout.plan), hint)


@dataclass(frozen=True)
class Rerun:
    outcome: Outcome
    diff: DiffReport

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code if self.diff.same else max(self.outcome.exit_code, 1)


class PlanChanged(CptestError):
    """A rerun would execute something else than the archived run did (argv, environment, image,
    model mounts, GPUs): refused unless the user trusts the change (`--accept-plan-changes`)."""

    exit_code = 3


def rerun(archive: Path, results: Path, launcher: Launcher, *, log: Logger, now: datetime,
          environment: Mapping[str, Any] | None = None, run_options: Any = None,
          models: Path | None = None, gpu_present: bool = True, accept_plan_changes: bool = False,
          allow_unsafe: bool = False) -> Rerun:
    """Run an archive's scenario again into a new archive under `results`, then diff the evidence
    (`environment`, `run_options` and `models` as for `run_scenario`).

    Nothing of the archived plan is executed: the run is planned afresh from the archived
    scenario.cps and its includes (`recompile`), on the archived engine, ports and GPUs, by this
    cptest, and the new archive is named by the re-planned scenario (a validated name). What the new
    plan would execute is compared with the archived plan (`plan_changes`); any difference is shown
    and refused (PlanChanged, exit 3) unless `accept_plan_changes`, before anything is written or
    launched. An archive holding a link or a FIFO is refused (IntegrityError, exit 3).
    The model is found by content: the manifest's tree hash pins it (a synthetic checkpoint is
    written again and must come out the same; a local one is looked up in the model store by its
    hash when it is not next to the scenario), and anything else stops the rerun as `unknown`
    before launch."""
    from cptest.run.models import find_by_tree_sha256, store_dir
    from cptest.run.preflight import Cause, InfrastructureError

    store.require_plain(archive)
    layout = store.Layout(archive)
    archived = checks.load_plan(archive)
    prepared = recompile(archive, archived, gpu_present=gpu_present)
    planned = prepared.plan
    # An archived scenario declared `unsafe` loads its own code into the engine: a rerun asks for the
    # same permission a run does (PlanError, exit 2), whoever made the archive.
    require_allowed(planned, allow_unsafe)
    manifest = store.read_manifest(layout) or {}
    pins = manifest.get("pins") if isinstance(manifest.get("pins"), dict) else {}
    model_pin = pins.get("model") if isinstance(pins.get("model"), dict) else {}
    pinned = model_pin.get("sha256") or archived.pins.model.sha256
    if pinned is not None and not (isinstance(pinned, str) and len(pinned) == 64
                                   and all(c in "0123456789abcdef" for c in pinned)):
        message = f"the model's pinned tree hash {short(pinned, 80)} is not a sha256"
        raise store.IntegrityError(Problem(Span(str(layout.manifest), 1, 1), message))
    # A launcher that runs images pins each node's image now, as the run will (its preflight):
    # compared before, a docker archive's pinned image would read as a change.
    pin_images = getattr(launcher, "pin_images", None)
    changes = plan_changes(archived, pin_images(planned) if pin_images is not None else planned)
    if changes and not accept_plan_changes:
        raise PlanChanged([Problem(None, f"refused: this cptest would run {archive} differently from the "
                                   f"archived plan ({len(changes)} difference(s) below); nothing was run",
                                   hint="re-plan deliberately with `cptest rerun --accept-plan-changes DIR` "
                                   "if you trust what the new plan executes")] + changes)
    for change in changes:
        log.warning(f"plan change accepted: {change.message} ({change.found} -> {change.expected})")
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
    out = _create(results, planned.scenario, planned.pins.scenario_sha256, now)
    outcome = run_scenario(planned, out, launcher, scenario_text=prepared.text, log=log,
                           includes=prepared.includes, environment=environment, run_options=run_options,
                           models=store_root, scenario_dir=archive)
    # Accepted changes may include the scenario's name: the user asked for this comparison.
    return Rerun(outcome, diff(archive, out, other_scenario=accept_plan_changes))
