"""Specification of `cptest.plan.lint.lint`: what a scenario expects vs what SGLang 0.5.17 is known to do.

Each kind of finding has a small inline scenario (synthetic model, so no file is read); the test
names the finding's code and the line of the expectation it is about. Marking the expectation
`violated ... because "..."` states that the scenario qualifies the no-go on purpose, and silences it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cptest.engines.sglang.cells import evidence_archives
from cptest.errors import ScenarioError
from cptest.lang import parse_file, parse_text
from cptest.plan.lint import Finding, lint
from cptest.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.cps"))

TEMPLATE = """cptest 1
scenario t {{
  engine sglang "{release}"
  model synthetic {arch} {{ layers 2 hidden 64 heads 4 kv_heads {kv} head_dim 16 vocab 128 intermediate 128 }}
  topology {{ {topology} }}
  serve {{ attention_backend triton }}
  baseline {{ tp 1 }}
  workload {{ requests 4 concurrency 2 prompt_tokens {prompt} output_tokens 4 }}
  expect {{
    {expect}
  }}
}}
"""
GEN = "generation tokens_agree >= 0.9 vs baseline"
DCP2 = "gpus 2 tp 2 dcp 2"
TP4_DCP3 = "gpus 4 tp 4 dcp 3"
EXPECT_LINE = 10
"""The line of `{expect}` in TEMPLATE: every finding below must point there."""


def scenario(expect: str, *, topology: str = "gpus 2 tp 2", arch: str = "llama", kv: int = 1,
             prompt: str = "16", release: str = "0.5.17") -> Scenario:  # fmt: skip
    text = TEMPLATE.format(arch=arch, kv=kv, topology=topology, prompt=prompt, expect=expect, release=release)
    return parse_text(text, "t.cps")


def codes_and_lines(findings: list[Finding]) -> list[tuple[str, int | None]]:
    return [(f.code, f.span.line if f.span else None) for f in findings]


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_scenario_in_the_suite_lints_clean(path: Path):
    assert [f.render() for f in lint(parse_file(path))] == []


def test_a_consistent_scenario_has_no_finding():
    assert lint(scenario("launch accepted rows kv_owner position % 2", topology=DCP2)) == []


# ------------------------------------------------------------------------------ launch
def test_expected_acceptance_of_a_launch_the_release_rejects_is_a_finding():
    # `launch accepted` with tp 4 dcp 3 is refused by the parser already (next test); a Scenario that
    # reaches lint another way must still be caught, at the launch expectation.
    s = scenario('launch rejected matching "divisible"', topology=TP4_DCP3)
    accepted = s.expect.launch.model_copy(update={"accepted": True, "matching": None})
    findings = lint(s.model_copy(update={"expect": s.expect.model_copy(update={"launch": accepted})}))
    assert codes_and_lines(findings) == [("launch-mismatch", EXPECT_LINE)]
    assert "rejects it at worker_start" in findings[0].message
    assert findings[0].citation.startswith("distributed/parallel_state.py")


def test_launch_accepted_with_tp_4_dcp_3_is_refused_before_lint_with_a_hint():
    with pytest.raises(ScenarioError) as err:
        scenario("launch accepted", topology=TP4_DCP3)
    (problem,) = err.value.problems
    assert (problem.span.line, problem.span.col) == (5, 26)
    assert problem.hint and "launch rejected" in problem.hint


def test_violated_launch_rejected_means_expects_acceptance():
    findings = lint(scenario('violated launch rejected because "x"', topology=TP4_DCP3))
    assert codes_and_lines(findings) == [("launch-mismatch", EXPECT_LINE)]


def test_expected_rejection_of_a_launch_the_release_accepts_is_a_finding():
    # 0.5.17 has no PCP+DCP admission check (0.5.23 added one).
    s = scenario("launch rejected", topology="gpus 2 tp 2 dcp 2 attn_cp 2 cp_strategy zigzag")
    findings = lint(s)
    assert codes_and_lines(findings) == [("launch-mismatch", EXPECT_LINE)]
    assert "has no rule that rejects it" in findings[0].message


def test_violated_launch_rejected_because_silences_the_pcp_dcp_finding():
    s = scenario('violated launch rejected because "0.5.17 has no check"',
                 topology="gpus 2 tp 2 dcp 2 attn_cp 2 cp_strategy zigzag")  # fmt: skip
    assert lint(s) == []


PCP_DCP = "gpus 2 tp 2 dcp 2 attn_cp 2 cp_strategy zigzag"


def test_pcp_with_dcp_is_not_a_scenario_error_but_release_knowledge():
    # Whether PCP with DCP is refused depends on the release, so the parser accepts it and lint says
    # what the pinned release does: 0.5.23 rejects it at argument parsing ...
    findings = lint(scenario(GEN, topology=PCP_DCP, arch="qwen3", release="0.5.23"))
    assert codes_and_lines(findings) == [("launch-rejected", 5)]
    assert "does not support --enable-prefill-cp" in findings[0].message
    # ... and 0.5.17 accepts it, though nothing says generation holds.
    findings = lint(scenario(GEN, topology=PCP_DCP, arch="qwen3"))
    assert codes_and_lines(findings)[0] == ("pcp_with_dcp", EXPECT_LINE)


def test_rejection_pattern_that_does_not_match_the_release_message_is_a_finding():
    s = scenario('launch rejected matching "no such words"', topology=TP4_DCP3)
    assert codes_and_lines(lint(s)) == [("launch-message", EXPECT_LINE)]


def test_rejection_pattern_that_matches_the_release_message_is_clean():
    assert lint(scenario('launch rejected matching "must be divisible by"', topology=TP4_DCP3)) == []


# ------------------------------------------------------------------------------ silent wrongness
ZIGZAG = "gpus 2 tp 2 attn_cp 2 cp_strategy zigzag"
SHORT = {"arch": "qwen3", "kv": 2, "prompt": "uniform(3, 16)"}
"""Qwen3 (attention over attention-TP, so no llama_pcp finding) with prompts as short as 3 < 2*cp."""
LONG_ENOUGH = dict(SHORT, prompt="uniform(4, 16)")


def test_zigzag_with_prompts_shorter_than_twice_cp_contradicts_rows_split():
    findings = lint(scenario("rows split zigzag", topology=ZIGZAG, **SHORT))
    assert codes_and_lines(findings) == [("zigzag_short_prompt", EXPECT_LINE)]
    assert "violated rows" in findings[0].message  # says how to qualify the no-go on purpose


def test_zigzag_with_prompts_of_exactly_twice_cp_is_clean():
    assert lint(scenario("rows split zigzag", topology=ZIGZAG, **LONG_ENOUGH)) == []


def test_violated_rows_because_silences_the_short_prompt_finding():
    s = scenario('violated rows split zigzag because "short prompts fall back"', topology=ZIGZAG, **SHORT)
    assert lint(s) == []


def test_llama_with_prefill_cp_contradicts_generation_holding_where_the_release_splits_it():
    # kv_heads 1: the pool row (attention-TP shard) and Llama's full-TP K shard agree in size, so
    # SGLang runs, and where it splits Llama's prefill (0.5.23: every architecture) the CP partners
    # hold different query-head shards.
    findings = lint(scenario(GEN, topology=ZIGZAG, kv=1, release="0.5.23"))
    assert codes_and_lines(findings) == [("llama_pcp_silent", EXPECT_LINE)]
    assert findings[0].citation  # the SGLang source line the knowledge rests on
    # 0.5.17 splits prefill only for its CP-v2 classes, not Llama (observed: the output was TP2's)...
    assert lint(scenario(GEN, topology=ZIGZAG, kv=1)) == []
    # ...unless the scenario forces the split.
    forced = scenario(GEN, topology=ZIGZAG, kv=1)
    forced = forced.model_copy(update={"serve": forced.serve.model_copy(update={
        "env": {"SGLANG_ENABLE_CP_V2": "1"}})})  # fmt: skip
    assert [f.code for f in lint(forced)] == ["llama_pcp_silent"]


def test_llama_with_attention_dp_contradicts_generation_holding_and_qwen3_does_not():
    dp = "gpus 2 tp 2 attn_dp 2"
    findings = lint(scenario(GEN, topology=dp))
    assert codes_and_lines(findings) == [("llama_attention_dp", EXPECT_LINE)]
    assert "violated generation" in findings[0].message and not findings[0].blocks  # inferred
    assert lint(scenario(GEN, topology=dp, arch="qwen3")) == []
    assert lint(scenario(f'violated {GEN} because "full-TP attention"', topology=dp)) == []


def test_llama_with_prefill_cp_whose_kv_shard_misfits_the_pool_is_expected_to_crash():
    # kv_heads 2, tp 2, attn_cp 2: the pool row holds 2 heads, Llama's K has 1 (observed on H200).
    findings = lint(scenario("launch accepted", topology=ZIGZAG, kv=2))
    assert codes_and_lines(findings) == [("launch-mismatch", EXPECT_LINE)]
    assert "rejects it at runtime" in findings[0].message


def test_qwen3_with_prefill_cp_may_expect_generation_to_hold():
    assert lint(scenario(GEN, topology=ZIGZAG, arch="qwen3", kv=2)) == []


def test_violated_generation_because_silences_the_llama_pcp_finding():
    s = scenario(f'violated {GEN} because "heads sharded over full TP"', topology=ZIGZAG, kv=1,
                 release="0.5.23")
    assert lint(s) == []


def test_mha_dcp_with_more_kv_heads_than_tp_over_dcp_contradicts_generation_holding():
    # kv_heads 4 > tp/dcp = 1: the DCP group's ranks hold different KV heads.
    findings = lint(scenario(GEN, topology=DCP2, kv=4))
    assert codes_and_lines(findings) == [("mha_dcp_kv_not_replicated", EXPECT_LINE)]


def test_mha_dcp_with_kv_heads_replicated_in_the_dcp_group_is_clean():
    assert lint(scenario(GEN, topology=DCP2, kv=1)) == []


def test_violated_generation_because_silences_the_mha_dcp_finding():
    s = scenario(f'violated {GEN} because "kv heads split"',
                 topology=DCP2, kv=4)  # fmt: skip
    assert lint(s) == []


def test_finding_renders_with_position_code_and_citation():
    (finding,) = lint(scenario(GEN, topology=ZIGZAG, kv=1, release="0.5.23"))
    text = finding.render()
    assert text.startswith(f"t.cps:{EXPECT_LINE}:5: llama_pcp_silent: ")
    assert text.endswith(f"(SGLang {finding.citation}) [inferred: a hypothesis, not blocking]")


def test_a_finding_carries_how_its_rule_is_known_and_only_observed_ones_block():
    (inferred,) = lint(scenario(GEN, topology=ZIGZAG, kv=1, release="0.5.23"))  # read in llama.py, never run
    (observed,) = lint(scenario(GEN, topology=DCP2, kv=4))  # seen on 2 x H200
    assert (inferred.code, inferred.provenance, inferred.blocks) == ("llama_pcp_silent", "inferred", False)
    assert (observed.code, observed.provenance) == ("mha_dcp_kv_not_replicated", "observed")
    assert observed.blocks
    archives = evidence_archives(observed.evidence)  # the eager run, and its graph-decode twin
    assert archives == ("results/dcp2_llama_kv4/20261203T081109Z-733943a0",
                        "results/dcp2_llama_kv4_graph/20261203T111929Z-7984e228")
    assert all((ROOT / a / "verdict.json").is_file() for a in archives)  # the evidence is archives here
    assert observed.render().endswith(f"[observed: {observed.evidence}]")


def test_what_one_release_showed_is_not_evidence_about_the_next():
    (on_0_5_23,) = lint(scenario(GEN, topology=DCP2, kv=4, release="0.5.23"))
    assert on_0_5_23.code == "mha_dcp_kv_not_replicated" and on_0_5_23.provenance == "inferred"


def test_reference_engine_scenarios_are_not_linted_against_sglang():
    s = scenario(GEN, topology=ZIGZAG, kv=1)
    ref = s.model_copy(update={"engine": s.engine.model_copy(update={"kind": "reference"})})
    assert lint(ref) == []
