"""checks: an archive's evidence -> verdicts. Pure: reads only the archive; no clock, network or processes.

Entry points: `check(archive_dir) -> ScenarioVerdict` and `check_loaded(archive) -> ScenarioVerdict`.
Each expectation of the plan is judged by its contract's checker (`cptest.contracts`) inside
`guarded`, which turns an exception into `unknown` with its text: a crashing checker never reads as
pass, and never hides the other verdicts. The scenario status is the worst of its checkers' (fail >
unknown > pass); `ScenarioVerdict.exit_code` is what `cptest check` returns (0 pass, 1 fail, 3
unknown). Results of the `reference` engine are labelled `engine: reference` and never count as
SGLang evidence; results of co-located ranks are labelled `placement: colocated` (the plan's).
"""

from __future__ import annotations

from pathlib import Path

from cptest.checks.infrastructure import launch_cause
from cptest.checks.load import Archive, load_archive, load_plan
from cptest.contracts import CONTRACTS, Expectation
from cptest.evidence import Evidence
from cptest.store import Layout, is_finished
from cptest.verdict import EXIT_CODES, ScenarioVerdict, Verdict, apply_expectation, scenario_verdict, unknown

__all__ = [
    "EXIT_CODES",
    "Archive",
    "ScenarioVerdict",
    "Verdict",
    "check",
    "check_loaded",
    "guarded",
    "load_archive",
    "load_plan",
]


def guarded(evidence: Evidence, expect: Expectation) -> Verdict:
    """The verdict of one declared expectation: its contract's checker, the declared violation
    applied (a no-go is a valid result); never raises."""
    contract = CONTRACTS[expect.kind]
    try:
        raw = contract.check(evidence, expect)
        if raw.checker != expect.kind:
            raw = raw.model_copy(update={"checker": expect.kind})
    except Exception as e:  # the guard is the point: a crash is unknown, with its text
        raw = unknown(expect.kind, f"checker crashed: {type(e).__name__}: {e}", error=type(e).__name__)
    verdict = apply_expectation(raw, expect.expect_violation, expect.source)
    if expect.violated_on and not expect.expect_violation:
        elsewhere = f"declared violated on {expect.violated_on} only: expected to hold here"
        verdict = verdict.model_copy(update={"reason": f"{verdict.reason} ({elsewhere})"})
    return verdict


def check_loaded(archive: Archive, *, finished: bool = True) -> ScenarioVerdict:
    """Verdicts of every expectation of the plan, in plan order, and their worst.

    `finished` False: the archive was never closed (no final manifest), so even complete-looking
    evidence is judged like an unfinished run.
    """
    plan = archive.plan
    if archive.evidence.refused:
        return not_judged(archive)
    verdicts = [guarded(archive.evidence, e) for e in plan.expectations]
    unfinished = run_unfinished(archive) or (
        None if finished else "the archive was never finished: cptest stopped after gathering evidence "
        "and before writing its verdict, so nothing certifies that the evidence is complete"
    )
    cause = launch_cause(archive.evidence, [s.role for s in plan.servers()])
    if cause is not None:
        # Nothing the engine did is judged: every launch verdict (a rejection looks the same) and
        # every failure the missing run produced becomes unknown, with the cause.
        verdicts = [
            v.model_copy(update={"status": "unknown", "reason": f"not judged: {cause.describe()}"})
            if v.checker == "launch" or v.status == "fail" else v
            for v in verdicts
        ] + [unknown("run", cause.describe(), infrastructure=cause.code)]
    if unfinished is not None:
        # What is missing because the run stopped early is not evidence of a broken contract:
        # absence-based failures become unknown; violations seen in what was gathered stay fail.
        verdicts = [
            v.model_copy(update={"status": "unknown", "reason": f"run unfinished: {v.reason}"})
            if v.checker in ABSENCE_BASED and v.status == "fail" else v
            for v in verdicts
        ] + [unknown("run", unfinished)]
    return scenario_verdict(plan.scenario, plan.main.engine, plan.main.release, verdicts, plan.placement)


SHOWN_REFUSED = 3
"""How many refused files a verdict's reason names before `and N more`."""


def not_judged(archive: Archive) -> ScenarioVerdict:
    """The verdict of an archive whose evidence was refused for its size (`cptest.bounds`): every
    expectation unknown with the files named, never pass or fail. What a checker would judge is
    incomplete, and which checkers a file's records feed is not recorded (a checker may compare
    every rank with the runner), so none is run on what is left."""
    refused = archive.evidence.refused
    why = "; ".join(refused[:SHOWN_REFUSED])
    if len(refused) > SHOWN_REFUSED:
        why += f"; and {len(refused) - SHOWN_REFUSED} more"
    plan = archive.plan
    verdicts = [apply_expectation(unknown(e.kind, f"not judged: evidence not read: {why}"),
                                  e.expect_violation, e.source) for e in plan.expectations]
    verdicts.append(unknown("evidence", f"evidence larger than cptest reads was not read: {why} (a longer "
                            "workload makes more evidence: shorten it, or raise the figures in "
                            "cptest/bounds.py with their memory cost)", refused=len(refused)))
    return scenario_verdict(plan.scenario, plan.main.engine, plan.main.release, verdicts, plan.placement)


ABSENCE_BASED = frozenset(c.name for c in CONTRACTS.values() if c.absence_based)
"""Contracts whose failures an interrupted run can produce by itself: a hung request and an
unrecorded exit look alike when cptest was killed, and tearing an engine down mid-run prints
tracebacks into its log (`Contract.absence_based`)."""


def run_unfinished(archive: Archive) -> str | None:
    """Why the run did not finish, or None when every planned server's lifecycle is complete.

    A server is complete with a `shutdown_done` or a `launch_failed` record. Servers run baseline,
    control, eager twin, main (older archives: main, then baseline only when main became
    ready). A server the runner skipped by rule is not required: the baseline of an older archive
    whose main server did not become ready, the control when the baseline gave nothing to score,
    and the eager twin where the baseline was skipped.
    """
    main = archive.evidence.role("main").runner
    if main is None:
        return "the run did not finish: no runner evidence for the main server"
    plan = archive.plan
    base = archive.evidence.role("baseline").runner
    roles = ["main"]
    if plan.baseline is not None and (base is not None or main.events("ready")):
        roles.append("baseline")
    if plan.control is not None and base is not None and any(r.status == "ok" for r in base.requests):
        roles.append("control")
    # The eager twin runs wherever the baseline does, and before main when nothing is scored
    # and there is no baseline.
    if plan.eager is not None and (plan.workload.score_topk or plan.baseline is None or main.events("ready")):
        roles.append("eager")
    for role in roles:
        runner = archive.evidence.role(role).runner
        if runner is None:
            return f"the run did not finish: no runner evidence for the {role} server"
        interrupted = runner.events("interrupted")
        if interrupted:
            reason = interrupted[0].detail.get("reason", "")
            return f"the run was interrupted ({reason}) during the {role} server"
        if not runner.events("shutdown_done") and not runner.events("launch_failed"):
            return f"the run did not finish: the {role} server has no shutdown record (cptest was killed?)"
    return None


def check(archive_dir: Path | str, *, require_finished: bool = True) -> ScenarioVerdict:
    """Load `archive_dir` and check it. Raises EvidenceError for an unreadable archive.

    `require_finished` (the default, for re-checking archives): an archive whose manifest is not in
    its `finished` phase is judged unfinished. The run that is finishing it checks it first, so it
    passes False.
    """
    finished = is_finished(Layout(Path(archive_dir))) if require_finished else True
    return check_loaded(load_archive(archive_dir), finished=finished)
