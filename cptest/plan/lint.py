"""Lint: what a scenario expects vs what its pinned SGLang release is known to do.

Pure. The knowledge is `cptest.engines.sglang.admission.predict` (rules and silent-wrongness
warnings as data per release); this module only compares it with the scenario's `expect` block.
A finding is a mismatch the user should resolve: either the expectation is wrong, or the scenario
should say `violated ... because "..."` to qualify a known no-go on purpose.

Each finding carries its rule's provenance (`releases.Rule`): a finding from an `observed` rule
(an archive or a test showed the release do it) blocks `cptest run` unless `--ignore-lint`; one
from an `inferred` rule (read in the source) is a hypothesis, so it is printed as a warning and the
run goes ahead: running it is how the hypothesis gets tested.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from cptest.contracts import Declared
from cptest.engines.sglang.admission import Admission, launch_config, predict
from cptest.engines.sglang.releases import Provenance, Rule, get_release
from cptest.errors import PlanError, Problem, Span
from cptest.plan.flags import flag_problems
from cptest.scenario import Scenario

# Which expectation a silent-wrongness warning contradicts when that expectation is declared to
# hold: (checker, extra condition on the entry). The warning codes are admission.CONDITIONS'.
CONTRADICTS: dict[str, tuple[str, ...]] = {
    "zigzag_short_prompt": ("rows",),
    "interleave_short_batch": ("rows",),
    "attn_cp_without_prefill_cp": ("rows",),
    "prefill_cp_needs_attn_cp": ("rows",),
    "pcp_cp_v1_unobserved": ("rows", "pcp_rows"),
    # not `rows`: it fails a fallback too, which is not this rule's claim (the shards' order is)
    "pcp_cp_v1_interleave_zigzag": ("pcp_rows",),
    "llama_pcp_silent": ("generation",),
    "llama_attention_dp": ("generation",),
    "interleave_no_attention": ("generation", "serving"),
    "mha_dcp_kv_not_replicated": ("generation",),
    "dcp_backend_without_dcp_path": ("rows", "generation"),
    "pcp_with_dcp": ("generation",),
    "pcp_attention_dp_gather_wide": ("serving", "generation"),
}


@dataclass(frozen=True)
class Finding:
    span: Span | None
    code: str
    message: str
    citation: str = ""
    provenance: Provenance = "inferred"
    evidence: str = ""

    @property
    def blocks(self) -> bool:
        """Only what a release was seen to do stops a run; an inferred rule is what runs test."""
        return self.provenance == "observed"

    def render(self) -> str:
        where = f"{self.span}: " if self.span else ""
        cite = f" (SGLang {self.citation})" if self.citation else ""
        known = f" [observed: {self.evidence}]" if self.blocks else " [inferred: a hypothesis, not blocking]"
        return f"{where}{self.code}: {self.message}{cite}{known}"


def lint(scenario: Scenario) -> list[Finding]:
    """Every mismatch between the scenario's expectations and the release's known behaviour."""
    if scenario.engine.kind != "sglang":
        return []
    try:
        release = get_release(scenario.engine.release)
    except PlanError as e:  # positioned at the engine statement, as `plan` does
        raise PlanError([Problem(scenario.engine.where("release"), p.message, hint=p.hint)
                         for p in e.problems]) from None
    bad = flag_problems(scenario)
    if bad:  # bad input, as `compile` says: exit 2 at the flag, not a finding
        raise PlanError(bad)
    admission = predict(release, launch_config(scenario))
    findings = _launch_findings(scenario, admission)
    if admission.accepted:
        findings += _warning_findings(scenario, admission)
    return [_known(f, release.rules.get(_rule_of(f, admission))) for f in findings]


def _rule_of(f: Finding, adm: Admission) -> str:
    """The release rule a finding comes from: the rejecting rule for launch findings, else its code."""
    return (adm.rule or "") if f.code.startswith("launch-") else f.code


def _known(f: Finding, rule: Rule | None) -> Finding:
    if rule is None:
        return f  # no rule of the release says it (`launch-mismatch` about a rule that is absent)
    return replace(f, provenance=rule.provenance, evidence=rule.evidence)


def _launch_findings(scenario: Scenario, adm: Admission) -> list[Finding]:
    launch = scenario.expect.launch
    release = scenario.engine.release
    if launch is None:
        if adm.accepted:
            return []
        return [Finding(scenario.topology.span, "launch-rejected",
                        f"SGLang {release} rejects this launch at {adm.stage}: {adm.message}; "
                        "declare `launch rejected matching \"...\"`", adm.citation)]  # fmt: skip
    # `violated launch accepted` means: the scenario expects the launch NOT to be accepted.
    expects_accepted = launch.accepted != launch.violated
    if expects_accepted and not adm.accepted:
        return [Finding(launch.span, "launch-mismatch",
                        f"expects the launch to be accepted, but SGLang {release} rejects it at "
                        f"{adm.stage}: {adm.message}", adm.citation)]  # fmt: skip
    if not expects_accepted and adm.accepted:
        return [Finding(launch.span, "launch-mismatch",
                        f"expects the launch to be rejected, but SGLang {release} has no rule that "
                        "rejects it", "")]  # fmt: skip
    if not expects_accepted and launch.matching and adm.message and not launch.violated:
        try:
            matched = re.search(launch.matching, adm.message) is not None
        except re.error:
            matched = False
        if not matched:
            return [Finding(launch.span, "launch-message",
                            f"the rejection pattern {launch.matching!r} does not match SGLang {release}'s "
                            f"message {adm.message!r}", adm.citation)]  # fmt: skip
    return []


def _holds(entry: Declared | None) -> bool:
    return entry is not None and not entry.violated


def _warning_findings(scenario: Scenario, adm: Admission) -> list[Finding]:
    findings = []
    entries = dict(scenario.expect.entries())
    for w in adm.warnings:
        for checker in CONTRADICTS.get(w.code, ()):
            entry = entries.get(checker)
            if _holds(entry):
                statement = checker.replace("_", " ")  # as the scenario writes it: `pcp rows`, not pcp_rows
                findings.append(Finding(
                    entry.span, f"{w.code}",
                    f"expects {statement} to hold, but {w.message}; mark it "
                    f"`violated {statement} ... because \"...\"` if this scenario qualifies the no-go",
                    w.citation,
                ))  # fmt: skip
                break
    for g in scenario.expect.graph:
        if g.phase == "prefill" and g.mode == "captured" and not g.violated and scenario.topology.dcp > 1:
            findings.append(Finding(g.span, "dcp_disables_prefill_graph",
                                    "expects prefill CUDA graphs, but SGLang turns them off under DCP"))
    return findings
