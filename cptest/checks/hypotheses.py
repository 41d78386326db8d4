"""Lint rules tested against archives: `cptest lint --evidence DIR`.

Every rule of an SGLang release table (`cptest.engines.sglang.releases`) is a claim about what that
release does with a configuration. An archive of a real run of that release is a test of every
rule that applies to its configuration. For each finished SGLang archive under DIR this module
predicts what the release's table says about the archived scenario (`admission.predict`, the same
prediction lint makes) and reads what the run showed:

- a rule that rejects the launch (parse, worker start, first forward) is *confirmed* when the
  server did not come up, *refuted* when it did;
- a silent rule is judged by the contracts it contradicts (`plan.lint.CONTRADICTS`), on their raw
  verdicts (the checker's finding before a declared violation is applied): *confirmed* when one of
  them failed, *refuted* when those present all passed;
- a rule no contract of the archive observes (or whose contracts were unknown) stays *untested*
  for that archive.

A rule is then `refuted` if any archive refutes it, `confirmed` if some confirm it and none refute
it, and `untested` otherwise. Pure: reads archives, never runs anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cptest.checks.load import load_plan
from cptest.engines.sglang.admission import Admission, launch_config, predict
from cptest.engines.sglang.releases import KNOWN_RELEASES, Release
from cptest.errors import CptestError
from cptest.plan.lint import CONTRADICTS
from cptest.store import Layout, existing_file, is_finished, read_file, require_plain

Outcome = Literal["confirmed", "refuted", "untested"]


@dataclass
class RuleTest:
    """One rule of one release, against every archive that applied it."""

    release: str
    code: str
    stage: str
    provenance: str
    evidence: str
    seen: list[tuple[str, Outcome, str]] = field(default_factory=list)
    """(archive, what it showed, why) for every archive whose configuration the rule applies to."""

    @property
    def status(self) -> Outcome:
        outcomes = {o for _, o, _ in self.seen}
        if "refuted" in outcomes:
            return "refuted"
        return "confirmed" if "confirmed" in outcomes else "untested"


@dataclass
class Judged:
    rules: list[RuleTest]
    archives: int
    """SGLang archives read."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(archive, why) for archives that could not be read as tests."""


def archives_under(root: Path) -> list[Path]:
    """Every archive folder under `root` (a folder with plan.json and manifest.json), sorted."""
    found = []
    for plan in sorted(root.rglob("plan.json")):
        d = plan.parent
        if (d / "manifest.json").is_file() and not any(p.is_symlink() for p in (d, plan)):
            found.append(d)
    return found


def judge(root: Path) -> Judged:
    tests: dict[tuple[str, str], RuleTest] = {}
    for name, release in KNOWN_RELEASES.items():
        for code, rule in release.rules.items():
            tests[name, code] = RuleTest(name, code, rule.stage, rule.provenance, rule.evidence)
    skipped: list[tuple[str, str]] = []
    read = 0
    for archive in archives_under(root):
        where = str(archive)
        try:
            require_plain(archive)  # a link or FIFO anywhere: not read at all
            plan = load_plan(archive)
        except CptestError as e:
            skipped.append((where, f"plan unreadable: {e.problems[0].message}"))
            continue
        if plan.main.engine != "sglang" or plan.main.release not in KNOWN_RELEASES:
            continue
        if not is_finished(Layout(archive)) or not existing_file(Layout(archive).verdict):
            skipped.append((where, "not finished"))
            continue
        release = KNOWN_RELEASES[plan.main.release]
        # Today's table is what is tested: the prediction the plan recorded is the table of the day
        # of the run, kept only for an archived scenario that no longer parses.
        admission = _predicted(archive, release) or plan.admission
        if admission is None:
            skipped.append((where, "no admission in the plan and the archived scenario does not parse here"))
            continue
        try:
            verdicts = json.loads(read_file(Layout(archive).verdict))["verdicts"]
        except (CptestError, ValueError, KeyError, TypeError):
            skipped.append((where, "verdict.json unreadable"))
            continue
        read += 1
        raw = {v["checker"]: _raw(v) for v in verdicts}
        if not admission.accepted and admission.rule:
            launched = _launched(plan, raw)
            outcome: Outcome = "untested" if launched is None else ("refuted" if launched else "confirmed")
            why = {None: "launch not judged", True: "the server came up", False: "the server did not come up"}
            tests[plan.main.release, admission.rule].seen.append((where, outcome, why[launched]))
        for w in admission.warnings:
            if (plan.main.release, w.code) in tests:
                tests[plan.main.release, w.code].seen.append((where, *_silent(w.code, raw)))
    return Judged(sorted(tests.values(), key=lambda t: (t.release, t.code)), read, skipped)


def _predicted(archive: Path, release: Release) -> Admission | None:
    """What the release's table says today about the archived scenario, read with the includes the
    run stored; None when it does not parse."""
    from cptest.checks.archived import parse_archived

    try:
        return predict(release, launch_config(parse_archived(archive)))
    except CptestError:
        return None


def _raw(v: dict[str, object]) -> str:
    """The checker's own finding: a declared violation turns fail into pass and back."""
    status = str(v["status"])
    if v.get("expect_violation") and status in ("pass", "fail"):
        return "fail" if status == "pass" else "pass"
    return status


def _launched(plan: object, raw: dict[str, str]) -> bool | None:
    launch = next((e for e in plan.expectations if e.kind == "launch"), None)  # type: ignore[attr-defined]
    status = raw.get("launch")
    if launch is None or status not in ("pass", "fail"):
        return None
    return (status == "pass") == launch.accepted


def _silent(code: str, raw: dict[str, str]) -> tuple[Outcome, str]:
    contracts = [c for c in CONTRADICTS.get(code, ()) if raw.get(c) in ("pass", "fail")]
    if not contracts:
        return "untested", "no contract of this archive observes it"
    failed = [c for c in contracts if raw[c] == "fail"]
    if failed:
        return "confirmed", f"{', '.join(failed)} failed"
    return "refuted", f"{', '.join(contracts)} held"
