"""Specifications of cptest/lang/parse.py (and the syntax and semantic passes behind it)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cptest.errors import ScenarioError
from cptest.lang import parse_file, parse_text
from tests.lang.cases import BAD, BASE, with_line

FULL = """cptest 1
# Llama geometry with DCP 4
scenario dcp4_llama {
  description "TP4 + DCP4"
  engine sglang "0.5.17" image "sglang-cptest:0.5.17"
  model synthetic llama { layers 2 hidden 512 heads 32 kv_heads 8 head_dim 128 vocab 4096 intermediate 1024 }
  topology { gpus 4 tp 4 dcp 4 }
  serve { attention_backend triton cuda_graph_decode full mem_fraction 0.3
          flag "--disable-radix-cache" flag "--chunked-prefill-size" "4096" }
  baseline { tp 4 }
  workload { requests 64 concurrency 16 seed 7 prompt_tokens uniform(1024, 8192) output_tokens 128
             sampling greedy timeout 90s }
  fault kill rank 2 after 32 requests
  fault stop rank 1 at 1500ms for 5s
  expect {
    launch accepted
    violated rows kv_owner position % 4 because "kv_heads 8 > tp/dcp = 1"
    capacity logical == 4 * physical within 0.01
    generation tokens_agree >= 0.95 logprob_within 0.05 vs baseline
    graph decode disabled
    serving completed >= 32 of 64
    shutdown within 30s gpu_memory_released no_orphans exit_status in (0, -9, 137)
    log absent "Traceback"
  }
}
"""


def test_full_example_builds_every_field():
    s = parse_text(FULL, "full.cps")
    assert s.name == "dcp4_llama" and s.description == "TP4 + DCP4"
    assert (s.engine.kind, s.engine.release, s.engine.image) == ("sglang", "0.5.17", "sglang-cptest:0.5.17")
    assert s.model.facts.architecture == "LlamaForCausalLM" and s.model.facts.kv_heads == 8
    assert (s.topology.gpus, s.topology.tp, s.topology.dcp, s.topology.prefill_cp) == (4, 4, 4, False)
    assert s.serve.extra_flags == [["--disable-radix-cache"], ["--chunked-prefill-size", "4096"]]
    assert s.serve.mem_fraction == 0.3 and s.serve.cuda_graph_decode == "full"
    assert s.workload.prompt_tokens.kind == "uniform" and s.workload.prompt_tokens.bounds() == (1024, 8192)
    assert s.workload.timeout_s == 90.0 and s.workload.sampling.mode == "greedy"
    assert [(f.action, f.rank, f.after_requests, f.at_s, f.heal_after_s) for f in s.faults] == [
        ("kill", 2, 32, None, None),
        ("stop", 1, None, 1.5, 5.0),
    ]
    e = s.expect
    assert e.launch is not None and e.launch.accepted
    assert e.rows is not None and e.rows.violated and e.rows.modulus == 4
    assert "tp/dcp" in (e.rows.because or "")
    assert e.capacity is not None and (e.capacity.multiplier, e.capacity.tolerance) == (4.0, 0.01)
    assert e.shutdown is not None and e.shutdown.exit_status == [0, -9, 137] and e.shutdown.no_orphans
    assert [n for n, _ in e.entries()] == [
        "launch", "rows", "capacity", "generation", "graph", "serving", "shutdown", "log",
    ]  # fmt: skip


def test_settings_keep_their_positions():
    s = parse_text(FULL, "full.cps")
    span = s.topology.field_spans["dcp"]
    assert (span.file, span.line, span.col) == ("full.cps", 7, 26)
    assert s.faults[1].span is not None and s.faults[1].span.line == 14
    assert s.expect.capacity is not None and s.expect.capacity.span.line == 18  # type: ignore[union-attr]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_a_scenario_error_at_the_right_place(case):
    _id, line, text, where, phrase = case
    with pytest.raises(ScenarioError) as info:
        parse_text(with_line(line, text), "t.cps", base_dir="/nonexistent")
    first = info.value.problems[0]
    assert first.span is not None
    assert f"{first.span.line}:{first.span.col}" == where
    assert phrase in str(info.value)
    assert str(info.value).startswith(f"t.cps:{where}: ")


def test_bad_input_table_has_at_least_forty_distinct_cases():
    assert len({c[0] for c in BAD}) == len(BAD) >= 40


def test_all_semantic_problems_are_reported_together_sorted():
    text = with_line(5, "  topology { gpus 3 tp 0 }").replace("concurrency 2", "concurrency 0")
    with pytest.raises(ScenarioError) as info:
        parse_text(text, "t.cps")
    lines = [(p.span.line, p.span.col) for p in info.value.problems if p.span]
    assert lines == sorted(lines) and len(lines) == 2
    assert "tp is out of range" in str(info.value) and "concurrency is out of range" in str(info.value)


def test_error_renders_source_line_and_caret():
    with pytest.raises(ScenarioError) as info:
        parse_text(with_line(5, "  topology { gpus 2 tpp 2 }"), "t.cps")
    rendered = str(info.value).splitlines()
    assert rendered[1] == "    topology { gpus 2 tpp 2 }"
    assert rendered[2] == "  " + " " * 20 + "^^^"


def test_admission_rules_are_relaxed_when_the_launch_is_expected_rejected():
    text = with_line(5, "  topology { gpus 2 tp 2 dcp 2 attn_cp 2 cp_strategy zigzag }")
    text = text.replace("launch accepted", 'launch rejected matching "prefill"')
    s = parse_text(text)
    assert s.topology.dcp == 2 and s.topology.prefill_cp and s.expect.launch.accepted is False  # type: ignore


def test_non_admission_rules_hold_even_when_rejection_is_expected():
    text = with_line(5, "  topology { gpus 4 tp 2 }").replace("launch accepted", "launch rejected")
    with pytest.raises(ScenarioError, match="gpus 4 != tp 2"):
        parse_text(text)


def test_cp_strategy_turns_prefill_cp_on_by_default():
    s = parse_text(with_line(5, "  topology { gpus 2 tp 2 attn_cp 2 cp_strategy zigzag }"))
    assert s.topology.prefill_cp is True and s.topology.cp_strategy == "zigzag"


def test_baseline_is_tp_only_unless_overridden():
    s = parse_text(BASE.replace("  expect", "  baseline { tp 1 }\n  expect"))
    b = s.baseline_topology()
    assert b is not None and (b.gpus, b.tp, b.dcp, b.prefill_cp) == (1, 1, 1, False)
    assert parse_text(BASE.replace("  expect", "  baseline none\n  expect")).baseline is None


def test_a_defaults_file_is_not_a_scenario():
    with pytest.raises(ScenarioError, match="defaults file, not a scenario"):
        parse_text('cptest 1\ndefaults { engine sglang "0.5.17" }\n')


def test_only_scenario_error_escapes_for_unreadable_file(tmp_path: Path):
    with pytest.raises(ScenarioError, match="cannot read scenario file"):
        parse_file(tmp_path / "missing.cps")


# ---------------------------------------------------------------------------------------- extends

DEFAULTS = """cptest 1
defaults {
  engine sglang "0.5.17"
  serve { attention_backend triton sampling_backend pytorch mem_fraction 0.3 flag "--a" }
  workload { requests 8 concurrency 2 prompt_tokens 64 output_tokens 8 seed 3 }
  expect { launch accepted serving all_complete log absent "Traceback" }
  fault kill rank 0 after 2 requests
}
"""

CHILD = """cptest 1
scenario child {
  extends "defaults/tiny.cps"
  model synthetic llama { layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 vocab 128 intermediate 128 }
  topology { gpus 2 tp 2 dcp 2 }
  serve { mem_fraction 0.5 }
  workload { requests 16 }
  expect { log contains "DCP enabled" }
}
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_extends_merges_field_by_field_and_the_extending_file_wins(tmp_path: Path):
    _write(tmp_path, {"defaults/tiny.cps": DEFAULTS, "child.cps": CHILD})
    s = parse_file(tmp_path / "child.cps")
    assert s.serve.mem_fraction == 0.5 and s.serve.attention_backend == "triton"
    assert s.serve.extra_flags == [["--a"]]
    assert (s.workload.requests, s.workload.concurrency, s.workload.seed) == (16, 2, 3)
    assert s.expect.launch is not None and s.expect.serving is not None
    assert [x.pattern for x in s.expect.log] == ["DCP enabled"]  # lists replace as a whole
    assert len(s.faults) == 1 and s.faults[0].action == "kill"
    assert s.includes == [str(tmp_path / "defaults" / "tiny.cps")]


def test_extends_missing_file_is_an_error_at_the_extends_statement(tmp_path: Path):
    _write(tmp_path, {"child.cps": CHILD})
    with pytest.raises(ScenarioError) as info:
        parse_file(tmp_path / "child.cps")
    p = info.value.problems[0]
    assert (p.span.line, p.span.col) == (3, 3) and "no such file" in p.message  # type: ignore[union-attr]


def test_extends_cycle_is_an_error(tmp_path: Path):
    a = 'cptest 1\ndefaults {\n  extends "b.cps"\n}\n'
    b = 'cptest 1\ndefaults {\n  extends "a.cps"\n}\n'
    _write(tmp_path, {"a.cps": a, "b.cps": b, "s.cps": CHILD.replace("defaults/tiny.cps", "a.cps")})
    with pytest.raises(ScenarioError, match="extends cycle: a.cps -> b.cps -> a.cps"):
        parse_file(tmp_path / "s.cps")


def test_syntax_error_in_extended_file_points_into_that_file(tmp_path: Path):
    _write(tmp_path, {"defaults/tiny.cps": "cptest 1\ndefaults { topology { tpp 1 } }\n", "child.cps": CHILD})
    with pytest.raises(ScenarioError) as info:
        parse_file(tmp_path / "child.cps")
    assert str(info.value).startswith(f"{tmp_path / 'defaults' / 'tiny.cps'}:2:23: unknown key 'tpp'")


# ---------------------------------------------------------------------------------------- local models

LOCAL = with_line(
    4,
    '  model local "m"\n  facts { architecture "LlamaForCausalLM" layers 4 hidden 256 heads 8 kv_heads 1 '
    "head_dim 64 vocab 4096 }",
)
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "vocab_size": 4096,
}


def test_local_model_without_directory_uses_declared_facts(tmp_path: Path):
    s = parse_text(LOCAL, "s.cps", base_dir=str(tmp_path))
    assert s.model.path == str(tmp_path / "m") and s.model.facts.kv_heads == 1


def test_local_model_reads_config_json_when_present(tmp_path: Path):
    _write(tmp_path, {"m/config.json": json.dumps(CONFIG)})
    s = parse_text(LOCAL, "s.cps", base_dir=str(tmp_path))
    assert s.model.facts.architecture == "LlamaForCausalLM" and s.model.facts.head_dim == 64


def test_declared_facts_must_agree_with_config_json(tmp_path: Path):
    _write(tmp_path, {"m/config.json": json.dumps({**CONFIG, "num_key_value_heads": 2})})
    with pytest.raises(ScenarioError, match="facts say kv_heads 1 but config.json says 2"):
        parse_text(LOCAL, "s.cps", base_dir=str(tmp_path))


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"architectures": []}', "\udcff"])
def test_malformed_config_json_is_an_error_at_the_model_statement(tmp_path: Path, content: str):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(ScenarioError) as info:
        parse_text(LOCAL, "s.cps", base_dir=str(tmp_path))
    p = info.value.problems[0]
    assert (p.span.line, p.span.col) == (4, 3) and "config.json" in p.message  # type: ignore[union-attr]


def test_missing_config_json_in_existing_directory_is_an_error(tmp_path: Path):
    (tmp_path / "m").mkdir()
    with pytest.raises(ScenarioError, match="cannot read .*config.json: no such file"):
        parse_text(LOCAL, "s.cps", base_dir=str(tmp_path))


def test_mla_facts_from_config_use_nope_plus_rope_head_dim(tmp_path: Path):
    mla = {**CONFIG, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "head_dim": 16}
    _write(tmp_path, {"m/config.json": json.dumps(mla)})
    s = parse_text(LOCAL.replace("  facts", "# facts"), "s.cps", base_dir=str(tmp_path))
    assert s.model.facts.is_mla and s.model.facts.head_dim == 48


@pytest.mark.parametrize("arch, extra, indexer", [
    ("DeepseekV3ForCausalLM", {"index_topk": 64}, True),
    ("DeepseekV3ForCausalLM", {}, False),
    ("DeepseekV32ForCausalLM", {"index_topk": None}, False),  # SGLang asks for a value, not the key
    ("LlamaForCausalLM", {"index_topk": 64}, None),  # not read where SGLang's DSA test cannot apply
])
def test_a_dsa_indexer_is_read_from_the_config_of_the_architectures_it_matters_for(
        tmp_path: Path, arch: str, extra: dict[str, Any], indexer: bool | None):
    _write(tmp_path, {"m/config.json": json.dumps({**CONFIG, "architectures": [arch], **extra})})
    facts = parse_text(LOCAL.replace("  facts", "# facts"), "s.cps", base_dir=str(tmp_path)).model.facts
    assert facts.dsa_indexer is indexer
    # Unread, the fact is absent from the dump: every model without one keeps its plan and hashes.
    assert ("dsa_indexer" in facts.model_dump()) is (indexer is not None)


def test_a_facts_block_declares_a_dsa_indexer_and_a_config_contradicting_it_is_an_error(tmp_path: Path):
    hub = with_line(4, '  model hub "org/m" revision "abc" facts { architecture "DeepseekV32ForCausalLM" '
                       "layers 1 hidden 8 heads 1 kv_heads 1 head_dim 8 vocab 8 mla true dsa_indexer false }")
    assert parse_text(hub).model.facts.dsa_indexer is False
    _write(tmp_path, {"m/config.json": json.dumps({**CONFIG, "architectures": ["DeepseekV3ForCausalLM"],
                                                    "index_topk": 64})})
    declared = (LOCAL.replace('"LlamaForCausalLM"', '"DeepseekV3ForCausalLM"')
                .replace("vocab 4096", "vocab 4096 dsa_indexer false"))
    with pytest.raises(ScenarioError, match="facts say dsa_indexer False but config.json says True"):
        parse_text(declared, "s.cps", base_dir=str(tmp_path))


def test_a_synthetic_qwen3_moe_model_keeps_its_experts_and_only_it_dumps_them():
    moe = parse_text(with_line(4, "  model synthetic qwen3_moe { layers 2 hidden 64 heads 4 kv_heads 1 "
                                  "head_dim 16 vocab 128 intermediate 128 experts 4 experts_per_tok 2 "
                                  "moe_intermediate 32 }"))
    assert moe.model.facts.architecture == "Qwen3MoeForCausalLM" and not moe.model.facts.is_mla
    g = moe.model.synthetic_geometry()
    assert g is not None and (g.experts, g.experts_per_tok, g.moe_intermediate) == (4, 2, 32)
    # A dense model's dump has no MoE keys: the store names and scenario hashes of every model written
    # before them stay what they were (D64).
    dense = parse_text(BASE).model
    assert not {"experts", "experts_per_tok", "moe_intermediate"} & set(dense.model_dump())
    assert {"experts", "experts_per_tok", "moe_intermediate"} <= set(moe.model.model_dump())


def test_parse_file_resolves_paths_against_the_file_directory(tmp_path: Path):
    _write(tmp_path, {"sub/s.cps": LOCAL})
    cwd = os.getcwd()
    try:
        os.chdir("/")
        assert parse_file(tmp_path / "sub" / "s.cps").model.path == str(tmp_path / "sub" / "m")
    finally:
        os.chdir(cwd)
