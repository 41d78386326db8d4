"""scenarios/rules/: one scenario per inferred SGLang 0.5.17 rule, whose real run tests that rule.

`cptest lint --evidence DIR` (cptest/checks/hypotheses.py) marks a rule confirmed or refuted by an
archive whose configuration the rule applies to: a rejecting rule by the `launch` verdict, a silent
one by the raw verdicts of the contracts it contradicts (`plan.lint.CONTRADICTS`). So each file here,
named after its rule, must be a valid 0.5.17 scenario on at most 2 GPUs that lint's prediction
(`admission.predict`, recorded in the plan as `admission`) applies that rule to, and no other rule
that the scenario's contracts would judge; and it must declare the contracts the rule is judged by.
The scenarios state the predicted defect as `violated ...`, so lint reports nothing for them and the
run goes ahead; with the violation taken back, lint must report exactly the file's rule.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cptest.engines.sglang.admission import launch_config, predict
from cptest.engines.sglang.releases import get_release
from cptest.lang import parse_file
from cptest.plan import plan
from cptest.plan.lint import CONTRADICTS, lint
from cptest.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
RULES = sorted((ROOT / "scenarios" / "rules").glob("*.cps"))
RELEASE = get_release("0.5.17")

IMPLIED = {
    "dcp_backend_without_dcp_path": {"dcp_disables_prefill_graph"},
    "interleave_short_batch": {"interleave_no_attention"},
}
"""Rules whose condition every configuration of the file's rule also meets (any dcp > 1; interleave
on a model that is not DSA), so they are predicted beside it. A scenario must not declare a contract
that judges them (checked below), or its archive would test them too."""

NOT_COVERED = {
    "dcp_at_least_1_worker": "dcp < 1 is refused at parse time by dcp_at_least_1 (server_args.py:3818-3823) "
    "before any worker starts, and admission has no condition for it",
    "dcp_platform": "needs a platform other than CUDA or HIP; the GPU machine is CUDA and a scenario "
    "cannot name a platform (LaunchConfig.platform is always cuda)",
    "interleave_no_attention": "needs an attention backend that runs interleave CP attention (fa3); the "
    "GPU machine's SGLang has fa3 stripped",
    "pcp_attention_dp_gather_wide": "needs attention DP 3 or more with attention CP 2: tp 6 divides neither "
    "the tiny models' heads nor their MLP, and tp 8 (attention DP 4) is eight co-located nodes; SGLang's "
    "own gather runs on the CPU instead (tests/sglang_src/test_dp_gather_differential.py)",
    "pcp_cp_v1_unobserved": "what it predicts is that the probe's row evidence cannot judge the split, so "
    "no contract judges it; the CP-v2 switch it hangs on is compared with SGLang's on the CPU "
    "(tests/sglang_src/test_rules_differential.py)",
}
"""Inferred 0.5.17 rules without a scenario here, and why."""


def _prediction(s: Scenario) -> tuple[str | None, set[str]]:
    adm = predict(RELEASE, launch_config(s))
    return adm.rule, {w.code for w in adm.warnings}


def _taken_back(s: Scenario) -> Scenario:
    """The scenario with every declared violation but the launch's turned into a claim that the
    contract holds (a `violated launch rejected` states that the launch is accepted: kept)."""
    e = s.expect
    update: dict[str, object] = {}
    for name in {name for name, d in e.entries() if d.violated and name != "launch"}:
        value = getattr(e, name)
        if isinstance(value, list):
            update[name] = [
                x.model_copy(update={"violated": False, "because": None, "violated_on": None}) for x in value
            ]
        else:
            update[name] = value.model_copy(update={"violated": False, "because": None, "violated_on": None})
    return s.model_copy(update={"expect": e.model_copy(update=update)})


def test_there_are_rule_scenarios():
    assert RULES


@pytest.mark.parametrize("path", RULES, ids=lambda p: p.stem)
def test_the_scenario_is_a_valid_run_of_0_5_17_on_two_gpus(path: Path):
    s = parse_file(path)  # raises ScenarioError if invalid
    assert (s.engine.kind, s.engine.release) == ("sglang", "0.5.17")
    assert s.topology.gpus <= 2
    assert s.name == path.stem
    assert s.workload.requests <= 16


@pytest.mark.parametrize("path", RULES, ids=lambda p: p.stem)
def test_lint_predicts_exactly_the_rule_the_file_is_named_after(path: Path):
    s = parse_file(path)
    rule = path.stem
    assert rule in RELEASE.rules, f"{rule} is not a rule of SGLang 0.5.17's table"
    rejecting, warnings = _prediction(s)
    if RELEASE.rules[rule].exception is not None:
        assert (rejecting, warnings) == (rule, set())
    else:
        assert rejecting is None
        assert warnings == {rule} | IMPLIED.get(rule, set())
    # What the archive will record: hypotheses.py reads the plan's admission first.
    admission = plan(s).admission
    assert admission is not None
    assert (admission.rule, {w.code for w in admission.warnings}) == (rejecting, warnings)


@pytest.mark.parametrize("path", RULES, ids=lambda p: p.stem)
def test_the_scenario_declares_what_the_rule_is_judged_by_and_nothing_else(path: Path):
    s = parse_file(path)
    rule, declared = path.stem, {name for name, _ in s.expect.entries()}
    if RELEASE.rules[rule].exception is not None:
        launch = s.expect.launch
        assert launch is not None and not launch.accepted and not launch.violated
    elif rule == "dcp_disables_prefill_graph":
        # No contract judges it in hypotheses.py (CONTRADICTS has no entry): the graph verdict shows it.
        assert any(g.phase == "prefill" and g.mode == "captured" and g.violated for g in s.expect.graph)
    else:
        assert set(CONTRADICTS[rule]) & declared
    for other in IMPLIED.get(rule, set()):
        assert not set(CONTRADICTS.get(other, ())) & declared, f"the archive would also judge {other}"


@pytest.mark.parametrize("path", RULES, ids=lambda p: p.stem)
def test_lint_lets_it_run_and_names_the_rule_once_the_violation_is_taken_back(path: Path):
    s = parse_file(path)
    rule = path.stem
    assert [f.render() for f in lint(s)] == []
    if RELEASE.rules[rule].exception is None:
        assert [f.code for f in lint(_taken_back(s))] == [rule]


def test_every_inferred_0_5_17_rule_has_a_scenario_or_a_reason():
    inferred = {code for code, r in RELEASE.rules.items() if r.provenance == "inferred"}
    covered = {p.stem for p in RULES}
    assert not covered & set(NOT_COVERED)
    assert inferred - covered - set(NOT_COVERED) == set()
