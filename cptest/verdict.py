"""Verdicts: what a checker concludes, and how many conclusions merge into one.

A `Verdict` is pass, fail or unknown, with the figures it was computed from and a reason a person
can act on. `merge` keeps the worst (fail > unknown > pass, as Jepsen's `merge-valid`) and raises
on any other status, so a typo in a checker can never read as a pass. `apply_expectation` turns a
checker's raw verdict into the verdict of a *declared* contract: a scenario may declare that a
contract is violated (a no-go is a valid result), and then an observed violation passes.

Serialisation is deterministic (sorted keys, no timestamps): `cptest check DIR` must reproduce
`verdict.json` byte for byte from the evidence alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cptest.errors import Problem, Span
from cptest.topology import PlacementMode

Status = Literal["pass", "fail", "unknown"]

SEVERITY: dict[str, int] = {"pass": 0, "unknown": 1, "fail": 2}
"""Worse is larger. A failure is a finding; unknown is an honest lack of one; pass needs evidence."""

EXIT_CODES: dict[str, int] = {"pass": 0, "fail": 1, "unknown": 3}
"""What `cptest check` returns for a scenario status: a failure is 1, an unknown or an
infrastructure fault 3 (the README's exit codes)."""


class Verdict(BaseModel):
    """One checker's conclusion about one declared contract.

    `figures` holds only JSON values (numbers, strings, lists, dicts) that explain the status;
    `reason` is one line saying what was found and, for fail or unknown, where to look next.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    checker: str
    status: Status
    figures: dict[str, Any] = Field(default_factory=dict)
    reason: str = ""
    expect_violation: bool = False
    source: str = ""
    """file:line:col of the expectation in the scenario."""


class ScenarioVerdict(BaseModel):
    """All verdicts of one archive and their worst. `engine` is the label of the main server's engine:
    a `reference` result never counts as SGLang evidence (`qualifies_sglang` is False). `placement`
    is `colocated` when any server's ranks shared GPUs: such a verdict judges semantics, never speed."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    scenario: str
    engine: str
    release: str = ""
    status: Status
    verdicts: list[Verdict]
    counts: dict[str, int]
    placement: PlacementMode = Field(default="physical", exclude_if=lambda v: v == "physical")
    """Left out of verdict.json when physical, so that the verdicts of archives made before placements
    existed are re-derived byte for byte (`cptest check`)."""

    @property
    def qualifies_sglang(self) -> bool:
        return self.engine == "sglang"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def to_json(self) -> str:
        """Deterministic JSON: sorted keys, two-space indent, trailing newline."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ScenarioVerdict:
        return cls.model_validate_json(text)


def read_verdict(path: Path) -> ScenarioVerdict:
    """An archive's verdict.json. Raises IntegrityError (exit 3) naming the file when it is not a
    regular file (a link, a FIFO, a folder), is missing, or does not hold a scenario verdict."""
    from cptest.store import IntegrityError, read_file

    text = read_file(path)
    try:
        return ScenarioVerdict.from_json(text)
    except ValueError as e:
        first = e.errors()[0] if isinstance(e, ValidationError) and e.errors() else None
        what = f"{'.'.join(map(str, first['loc']))}: {first['msg']}" if first else str(e)
        hint = "`cptest check --write DIR` writes it again from the evidence"
        message = f"verdict.json is not a scenario verdict ({what})"
        raise IntegrityError(Problem(Span(str(path), 1, 1), message, hint=hint)) from None


def merge(statuses: list[str]) -> Status:
    """The worst of `statuses`; pass for an empty list. Raises ValueError on a status it does not know."""
    worst: Status = "pass"
    for s in statuses:
        if s not in SEVERITY:
            raise ValueError(f"unknown verdict status {s!r} (known: pass, fail, unknown)")
        if SEVERITY[s] > SEVERITY[worst]:
            worst = s  # type: ignore[assignment]
    return worst


def apply_expectation(raw: Verdict, expect_violation: bool, source: str) -> Verdict:
    """The verdict of a declared contract from the checker's raw verdict of the contract itself.

    Without `expect_violation` the raw verdict stands. With it, an observed violation (raw fail)
    passes and keeps its figures; a contract that holds (raw pass) fails; unknown stays unknown,
    because missing evidence shows neither.
    """
    if not expect_violation:
        return raw.model_copy(update={"expect_violation": False, "source": source})
    if raw.status == "fail":
        status: Status = "pass"
        reason = f"violation expected and observed: {raw.reason}"
    elif raw.status == "pass":
        status = "fail"
        reason = f"violation expected but the contract held: {raw.reason}"
    else:
        status = "unknown"
        reason = raw.reason
    return raw.model_copy(
        update={"status": status, "reason": reason, "expect_violation": True, "source": source}
    )


def scenario_verdict(scenario: str, engine: str, release: str, verdicts: list[Verdict],
                     placement: PlacementMode = "physical") -> ScenarioVerdict:
    counts = {s: 0 for s in SEVERITY}
    for v in verdicts:
        counts[v.status] += 1
    return ScenarioVerdict(
        scenario=scenario,
        engine=engine,
        release=release,
        status=merge([v.status for v in verdicts]),
        verdicts=verdicts,
        counts=counts,
        placement=placement,
    )


def passed(checker: str, reason: str, **figures: Any) -> Verdict:
    return Verdict(checker=checker, status="pass", figures=figures, reason=reason)


def failed(checker: str, reason: str, **figures: Any) -> Verdict:
    return Verdict(checker=checker, status="fail", figures=figures, reason=reason)


def unknown(checker: str, reason: str, **figures: Any) -> Verdict:
    return Verdict(checker=checker, status="unknown", figures=figures, reason=reason)


def combine(checker: str, parts: list[tuple[str, Status, str]], **figures: Any) -> Verdict:
    """One verdict from named parts (name, status, reason): the worst status; the reason lists the
    parts that are not pass (or all parts when everything passed)."""
    status = merge([s for _, s, _ in parts])
    shown = [p for p in parts if p[1] != "pass"] or parts
    reason = "; ".join(f"{name}: {why}" for name, _, why in shown)
    figures = {**figures, "parts": {name: s for name, s, _ in parts}}
    return Verdict(checker=checker, status=status, figures=figures, reason=reason)
