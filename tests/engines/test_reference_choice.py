"""cptest/engines/reference.py: engine choice and the labelled CPU profile."""

from __future__ import annotations

from pathlib import Path

from cptest.engines.reference import CPU_PROFILE, choose
from cptest.lang import parse_file

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def test_sglang_scenario_without_gpu_runs_on_the_reference_with_one_note() -> None:
    c = choose(parse_file(SCENARIOS / "dcp2_llama_kv1.cps"), None, gpu_present=False)
    assert c.engine == "reference" and c.scenario.engine.kind == "reference"
    assert c.scenario.engine.release == "builtin"
    assert len([n for n in c.notes if "no GPU here" in n]) == 1
    assert c.profile is None  # a tiny model is served as declared


def test_sglang_scenario_with_gpu_is_left_alone() -> None:
    s = parse_file(SCENARIOS / "dcp2_llama_kv1.cps")
    c = choose(s, None, gpu_present=True)
    assert c.engine == "sglang" and c.scenario is s and not c.notes


def test_explicit_reference_engine_needs_no_gpu_note() -> None:
    c = choose(parse_file(SCENARIOS / "dcp2_llama_kv1.cps"), "reference", gpu_present=True)
    assert c.engine == "reference" and not c.notes


def test_cpu_profile_shrinks_widths_keeps_attention_geometry_and_says_so() -> None:
    s = parse_file(SCENARIOS / "dcp4_llama.cps")
    c = choose(s, "reference", gpu_present=False)
    m = c.scenario.model
    assert (m.hidden, m.intermediate) == (CPU_PROFILE["hidden"], CPU_PROFILE["intermediate"])
    assert (m.heads, m.kv_heads, m.head_dim, m.layers, m.vocab) == (
        s.model.heads, s.model.kv_heads, s.model.head_dim, s.model.layers, s.model.vocab)
    assert c.scenario.topology == s.topology
    assert c.scenario.workload.prompt_tokens.bounds()[1] <= CPU_PROFILE["prompt_max"]
    assert c.profile is not None and c.profile["hidden"] == [4096, 512]
    assert c.scenario.description is not None and c.scenario.description.startswith("[reference CPU profile:")
    assert any("CPU profile" in n for n in c.notes)
