"""Bad inputs as data: each replaces one line of BASE and names where the error is and what it says.

A case is (id, line to replace, new text, "line:col", phrase the message must contain).  Line 0
means: replace the whole text.  Shared by tests/lang/test_parse.py and the fuzz tests (as seeds).
"""

BASE_LINES = [
    "cptest 1",
    "scenario t {",
    '  engine sglang "0.5.17"',
    "  model synthetic llama { layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 vocab 128 intermediate 128 }",  # noqa: E501
    "  topology { gpus 2 tp 2 dcp 2 }",
    "  workload { requests 4 concurrency 2 prompt_tokens 16 output_tokens 4 }",
    "  expect { launch accepted }",
    "}",
]
BASE = "\n".join(BASE_LINES) + "\n"


def with_line(line: int, text: str) -> str:
    if line == 0:
        return text
    lines = list(BASE_LINES)
    lines[line - 1] = text
    return "\n".join(lines) + "\n"


BAD: list[tuple[str, int, str, str, str]] = [
    # --- syntax
    ("empty_file", 0, "", "1:1", "unexpected end of file"),
    ("missing_header", 0, "scenario t { }", "1:1", "expected: 'cptest'"),
    ("header_without_version", 0, "cptest scenario t { }", "1:8", "expected: an integer"),
    ("unknown_topology_key", 5, "  topology { gpus 2 tpp 2 }", "5:21", "unknown key 'tpp' in topology"),
    (
        "key_of_another_block",
        5,
        "  topology { gpus 2 mem_fraction 2 }",
        "5:21",
        "unknown key 'mem_fraction' in topology",
    ),
    ("unknown_statement", 5, "  topolgy { gpus 2 tp 2 }", "5:3", "did you mean 'topology'"),
    (
        "unknown_expectation",
        7,
        "  expect { lunch accepted }",
        "7:12",
        "unknown expectation 'lunch' in expect",
    ),
    (
        "unknown_workload_key",
        6,
        "  workload { requests 4 concurency 2 }",
        "6:25",
        "did you mean 'concurrency'",
    ),
    ("unclosed_block", 8, "", "8:1", "unexpected end of file"),
    ("single_quotes", 3, "  engine sglang '0.5.17'", "3:17", "strings need double quotes"),
    ("stray_character", 5, "  topology { gpus 2 tp 2 dcp $ }", "5:30", "unexpected character '$'"),
    ("launch_without_verdict", 7, "  expect { launch }", "7:19", "expected: 'accepted' or 'rejected'"),
    ("reserved_word_as_name", 2, "scenario tp {", "2:10", "reserved word"),
    ("missing_value", 5, "  topology { gpus tp 2 }", "5:19", "unexpected 'tp'"),
    ("fault_without_trigger", 8, "  fault kill rank 1\n}", "9:1", "expected: 'after' or 'at'"),
    (
        "fault_at_negative_steps_word",
        8,
        "  fault kill rank 1 after 3 minutes\n}",
        "8:29",
        "unexpected 'minutes'",
    ),
    ("violated_without_reason", 7, "  expect { violated launch accepted }", "7:37", "expected: 'because'"),
    ("huge_float", 5, "  topology { gpus 2 tp 2 dcp 1e999 }", "5:30", "too large"),
    ("duplicate_shutdown_part", 7, "  expect { shutdown no_orphans no_orphans }", "7:12", "given twice"),
    # --- versions, duplicates
    ("unsupported_version", 1, "cptest 2", "1:8", "unsupported language version 2"),
    ("duplicate_block", 7, "  topology { gpus 2 tp 2 }", "7:3", "duplicate topology block (first at line 5)"),
    ("duplicate_key", 5, "  topology { gpus 2 tp 2 tp 2 }", "5:26", "duplicate 'tp' in topology"),
    (
        "duplicate_expectation",
        7,
        "  expect { launch accepted launch rejected }",
        "7:28",
        "duplicate 'launch' in expect",
    ),
    # --- types and ranges
    ("tp_zero", 5, "  topology { gpus 2 tp 0 }", "5:21", "tp is out of range"),
    ("tp_float", 5, "  topology { gpus 2 tp 2.5 }", "5:21", "wrong type for tp"),
    ("tp_string", 5, '  topology { gpus 2 tp "2" }', "5:21", "wrong type for tp"),
    ("mem_fraction_above_one", 8, "  serve { mem_fraction 1.5 }\n}", "8:11", "mem_fraction is out of range"),
    ("mem_fraction_zero", 8, "  serve { mem_fraction 0 }\n}", "8:11", "> 0"),
    ("bad_graph_mode", 8, "  serve { cuda_graph_decode ful }\n}", "8:11", "did you mean 'full'"),
    (
        "uniform_reversed",
        6,
        "  workload { requests 4 concurrency 2 prompt_tokens uniform(10, 5) output_tokens 4 }",
        "6:39",
        "uniform(10, 5) has lo > hi",
    ),
    (
        "unknown_distribution",
        6,
        "  workload { requests 4 concurrency 2 prompt_tokens normal(1, 2) output_tokens 4 }",
        "6:39",
        "unknown distribution 'normal'",
    ),
    (
        "timeout_without_unit",
        6,
        "  workload { requests 4 concurrency 2 prompt_tokens 16 output_tokens 4 timeout 30 }",
        "6:72",
        "timeout needs a unit",
    ),
    (
        "bad_cp_strategy",
        5,
        "  topology { gpus 2 tp 2 attn_cp 2 cp_strategy zigzg }",
        "5:36",
        "did you mean 'zigzag'",
    ),
    ("bool_as_int", 8, "  serve { skip_tokenizer_init 1 }\n}", "8:11", "expected: true or false"),
    # --- impossible topologies
    ("gpus_not_tp_times_pp", 5, "  topology { gpus 4 tp 2 }", "5:14", "gpus 4 != tp 2 x pp 1"),
    ("nodes_not_dividing", 5, "  topology { gpus 2 tp 2 nodes 3 }", "5:26", "nodes 3 does not divide gpus 2"),
    ("dcp_not_dividing_tp", 5, "  topology { gpus 4 tp 4 dcp 3 }", "5:26", "dcp 3 does not divide tp 4"),
    (
        "attn_cp_not_dividing",
        5,
        "  topology { gpus 4 tp 4 attn_cp 3 cp_strategy zigzag }",
        "5:26",
        "attn_cp 3 does not divide tp 4",
    ),
    (
        "attn_dp_times_cp",
        5,
        "  topology { gpus 4 tp 4 attn_cp 2 attn_dp 4 cp_strategy zigzag }",
        "5:36",
        "attn_dp x attn_cp (8) does not divide tp 4",
    ),
    (
        "prefill_cp_without_strategy",
        5,
        "  topology { gpus 2 tp 2 attn_cp 2 prefill_cp true }",
        "5:36",
        "prefill_cp needs a cp_strategy",
    ),
    (
        "prefill_cp_without_attn_cp",
        5,
        "  topology { gpus 2 tp 2 cp_strategy zigzag }",
        "5:3",
        "prefill CP needs attn_cp > 1",
    ),
    ("baseline_impossible", 8, "  baseline { tp 2 gpus 4 }\n}", "8:19", "baseline: gpus 4 != tp 2"),
    ("missing_tp", 5, "  topology { gpus 2 }", "5:3", "topology needs tp"),
    ("missing_topology", 5, "", "2:10", "the scenario has no topology"),
    # --- faults
    (
        "fault_rank_outside_world",
        8,
        "  fault kill rank 2 after 3 requests\n}",
        "8:19",
        "fault rank 2 is outside the world",
    ),
    (
        "sigterm_to_rank",
        8,
        "  fault sigterm rank 0 after 3 requests\n}",
        "8:22",
        "sigterm is sent to the server",
    ),
    ("fault_time_without_unit", 8, "  fault kill rank 1 at 10\n}", "8:21", "fault time needs a unit"),
    ("for_on_kill", 8, "  fault kill rank 1 at 10s for 5s\n}", "8:28", "'for' applies to stop faults only"),
    ("unknown_fault_action", 8, "  fault kil rank 1 at 10s\n}", "8:9", "did you mean 'kill'"),
    (
        "conflicting_faults",
        8,
        "  fault kill rank 1 at 10s\n  fault stop rank 1 at 10s\n}",
        "9:3",
        "conflicts with the fault at line 8",
    ),
    # --- workload
    (
        "concurrency_and_rate",
        6,
        "  workload { requests 4 concurrency 2 rate 3 prompt_tokens 16 output_tokens 4 }",
        "6:39",
        "both concurrency and rate",
    ),
    (
        "neither_concurrency_nor_rate",
        6,
        "  workload { requests 4 prompt_tokens 16 output_tokens 4 }",
        "6:3",
        "needs concurrency (closed loop) or rate",
    ),
    (
        "greedy_with_settings",
        6,
        "  workload { requests 4 concurrency 2 prompt_tokens 16 output_tokens 4 sampling greedy { seed 1 } }",
        "6:72",
        "greedy sampling takes no settings",
    ),
    # --- model
    ("unknown_model_kind", 4, '  model locl "x"', "4:9", "did you mean 'local'"),
    ("synthetic_missing_geometry", 4, "  model synthetic llama { layers 2 }", "4:3", "misses hidden"),
    ("synthetic_unknown_arch", 4, "  model synthetic lama { layers 2 }", "4:3", "did you mean 'llama'"),
    (
        "heads_not_multiple_of_kv",
        4,
        "  model synthetic llama { layers 2 hidden 64 heads 4 kv_heads 3 head_dim 16 vocab 128 intermediate 128 }",  # noqa: E501
        "4:54",
        "heads (4) must be a multiple of kv_heads (3)",
    ),
    (
        "moe_key_on_a_dense_model",
        4,
        "  model synthetic llama { layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 vocab 128 intermediate 128 experts 4 }",  # noqa: E501
        "4:104",
        "experts applies to qwen3_moe only",
    ),
    (
        "moe_without_its_experts",
        4,
        "  model synthetic qwen3_moe { layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 vocab 128 intermediate 128 }",  # noqa: E501
        "4:3",
        "misses experts, experts_per_tok, moe_intermediate",
    ),
    (
        "more_experts_per_token_than_experts",
        4,
        "  model synthetic qwen3_moe { layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 vocab 128 intermediate 128 experts 4 experts_per_tok 8 moe_intermediate 32 }",  # noqa: E501
        "4:118",
        "experts_per_tok (8) must be at most experts (4)",
    ),
    ("hub_without_facts", 4, '  model hub "org/m" revision "abc"', "4:3", "needs a facts block"),
    # --- models by identity and extends inside the scenario tree (issue 32): never a path of the machine
    ("hub_id_absolute_path", 4, '  model hub "/root/.ssh" revision "abc"', "4:3", "is not a hub id"),
    ("hub_id_parent", 4, '  model hub "../../x" revision "abc"', "4:3", "is not a hub id"),
    ("hub_id_dotdot_inside", 4, '  model hub "org/../x" revision "abc"', "4:3", "is not a hub id"),
    ("hub_id_home", 4, '  model hub "~/.ssh" revision "abc"', "4:3", "is not a hub id"),
    ("hub_id_three_parts", 4, '  model hub "org/name/extra" revision "abc"', "4:3", "is not a hub id"),
    ("hub_id_one_part", 4, '  model hub "name" revision "abc"', "4:3", "is not a hub id"),
    ("hub_id_dot_name", 4, '  model hub "org/.." revision "abc"', "4:3", "is not a hub id"),
    ("hub_id_empty", 4, '  model hub "" revision "abc"', "4:3", "is not a hub id"),
    ("hub_revision_path", 4, '  model hub "org/m" revision "../../etc" facts { architecture "X" layers 1 hidden 8 heads 1 kv_heads 1 head_dim 8 vocab 8 }', "4:21", "is not a revision"),  # noqa: E501
    ("hub_revision_slash", 4, '  model hub "org/m" revision "a/b" facts { architecture "X" layers 1 hidden 8 heads 1 kv_heads 1 head_dim 8 vocab 8 }', "4:21", "is not a revision"),  # noqa: E501
    ("hub_sha256_not_hex", 4, '  model hub "org/m" revision "abc" sha256 "xyz" facts { architecture "X" layers 1 hidden 8 heads 1 kv_heads 1 head_dim 8 vocab 8 }', "4:36", "is not a sha256"),  # noqa: E501
    ("extends_proc_environ", 7, '  extends "/proc/self/environ"', "7:3", "not a scenario file"),
    ("extends_etc_passwd", 7, '  extends "/etc/passwd"', "7:3", "not a scenario file"),
    ("extends_parent_dirs", 7, '  extends "../../x"', "7:3", "not a scenario file"),
    ("extends_home", 7, '  extends "~/.ssh"', "7:3", "'~' is not expanded"),
    ("extends_outside_tree", 7, '  extends "../../elsewhere/d.cps"', "7:3", "outside the scenario tree"),
    ("extends_absolute_cps_outside", 7, '  extends "/etc/d.cps"', "7:3", "outside the scenario tree"),
    (
        "hub_without_revision",
        4,
        '  model hub "org/m" facts { architecture "X" layers 1 hidden 8 heads 1 kv_heads 1 head_dim 8 vocab 8 }',  # noqa: E501
        "4:3",
        "needs a pinned revision",
    ),
    (
        "local_missing_without_facts",
        4,
        '  model local "does/not/exist"',
        "4:3",
        "does not exist and no facts block",
    ),
    # --- expectations
    (
        "serving_of_mismatch",
        7,
        "  expect { serving completed >= 2 of 8 }",
        "7:12",
        "the workload sends 4 requests",
    ),
    (
        "tokens_agree_above_one",
        7,
        "  expect { generation tokens_agree >= 1.5 vs baseline }",
        "7:12",
        "tokens_agree is out of range",
    ),
    ("bad_log_regex", 7, '  expect { log contains "(" }', "7:12", "invalid regular expression"),
    ("bad_graph_phase", 7, "  expect { graph decod captured }", "7:18", "did you mean 'decode'"),
    (
        "bad_prefill_graph_mode",
        7,
        "  expect { graph prefill disabled }",
        "7:26",
        "unknown prefill graph mode",
    ),
    ("shutdown_within_without_unit", 7, "  expect { shutdown within 30 }", "7:12", "needs a duration"),
    (
        "kv_owner_zero",
        7,
        "  expect { rows kv_owner position % 0 }",
        "7:12",
        "kv_owner modulus must be an integer >= 1",
    ),
    ("bad_ffn_mode", 7, "  expect { rows split zigzag ffn gatherd }", "7:34", "did you mean 'gathered'"),
    ("flag_without_dashes", 8, '  serve { flag "disable-radix-cache" }\n}', "8:11", "must start with --"),
]
