"""Specifications of cptest.engines.sglang.releases: the per-release knowledge tables."""

from __future__ import annotations

import re

import pytest

from cptest.engines.sglang.releases import KNOWN_RELEASES, get_release, support_of
from cptest.errors import PlanError

RELEASES = list(KNOWN_RELEASES.values())
CITATION = re.compile(
    r"^(absent in [\d.]+: .*|[\w/.]+\.py(:\d+(-\d+)?(, \d+(-\d+)?)*)?(; [\w/.]+\.py(:\d+(-\d+)?)?)*)"
)


def test_unknown_release_names_the_known_ones_and_the_closest():
    with pytest.raises(PlanError) as err:
        get_release("0.5.71")
    assert str(err.value) == 'unknown SGLang release "0.5.71" (known: 0.5.17, 0.5.23; did you mean 0.5.17?)'


def test_unknown_release_far_from_all_gives_no_guess():
    with pytest.raises(PlanError, match=r"\(known: 0\.5\.17, 0\.5\.23\)$"):
        get_release("nightly")


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.name)
def test_flag_table_is_the_named_wheel_extracted_by_argparse(release):
    from cptest.engines.sglang.releases import _load_flags

    raw = _load_flags(release.flags_file)
    assert raw["release"] == release.name
    assert raw["wheel_sha256"] == release.wheel_sha256
    assert raw["method"] == "argparse"
    for name, entry in raw["flags"].items():
        assert name.startswith("--")
        assert entry["arity"] in ("flag", "value", "optional", "list"), name
        assert entry["source"], f"{name} has no source citation"


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.name)
def test_cp_flags_exist_with_the_right_arity(release):
    f = release.flags
    assert f["--dcp-size"]["arity"] == "value"
    assert f["--attn-cp-size"]["arity"] == "value"
    assert f["--enable-prefill-cp"]["arity"] == "flag"
    assert f["--cp-strategy"]["choices"] == ["zigzag", "interleave"]
    assert f["--decode-context-parallel-size"] is f["--dcp-size"], "aliases resolve to the same entry"


def test_attention_dp_spelling_differs_between_releases():
    assert "--attn-dp-size" not in get_release("0.5.17").flags
    assert get_release("0.5.17").spellings["attn_dp"] == ("--dp-size", "{n}", "--enable-dp-attention")
    assert get_release("0.5.23").spellings["attn_dp"] == ("--attn-dp-size", "{n}")


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.name)
def test_every_spelled_flag_exists_in_its_release(release):
    for parts in release.spellings.values():
        for p in parts:
            if p.startswith("--"):
                assert p in release.flags, p
    for flag in release.graph_phases.values():
        assert "disabled" in release.flags[flag]["choices"]


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.name)
def test_rules_are_well_formed(release):
    for code, rule in release.rules.items():
        assert rule.code == code
        assert CITATION.match(rule.citation), rule.citation
        if rule.stage == "silent":
            assert rule.exception is None and rule.message is None and rule.note
        if rule.exception is not None:
            # A bare `assert` raises with an empty message: then the note must say so.
            assert rule.message or (rule.exception == "AssertionError" and "bare assert" in rule.note), code


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.name)
def test_log_patterns_compile_and_cite(release):
    for name, pat in release.log_patterns.items():
        assert pat.compiled.groups >= 0, name
        assert pat.citation, name


SAMPLE_LINES = {
    "kv_cache_allocated": (
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 412345, K size: 12.34 GB, V size: 12.34 GB",
        {"tokens": "412345", "dtype": "torch.bfloat16"},
    ),
    "max_total_num_tokens": (
        "max_total_num_tokens=824690, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=4096, context_len=131072, available_gpu_mem=12.50 GB",
        {"tokens": "824690", "context_len": "131072"},
    ),
    "dcp_enabled": ("DCP enabled, dcp_size=2, tp_size=4", {"dcp": "2", "tp": "4"}),
    "subprocess_crashed": (
        "Subprocess scheduler_2 (pid=1234) crashed with exit code -9. Triggering SIGQUIT for cleanup...",
        {"name": "scheduler_2", "pid": "1234", "code": "-9"},
    ),
    "forward_hook_registered": (
        "Registered forward hook 'cptest_rows' on model.layers.0.mlp",
        {"name": "cptest_rows", "module": "model.layers.0.mlp"},
    ),
    "log_prefix": (
        "[2026-01-01 10:00:00 ATTN_CP1 TP3] Load weight end.",
        {"attn_cp": "1", "tp": "3"},
    ),
}


@pytest.mark.parametrize("name", sorted(SAMPLE_LINES))
def test_log_patterns_extract_figures_from_real_line_shapes(name):
    line, figures = SAMPLE_LINES[name]
    m = get_release("0.5.17").log_pattern(name).compiled.search(line)
    assert m is not None
    for k, v in figures.items():
        assert m.group(k) == v


def test_schedulers_still_alive_line_is_absent_in_0_5_17_only():
    assert not get_release("0.5.17").log_pattern("schedulers_still_alive").present
    assert get_release("0.5.23").log_pattern("schedulers_still_alive").present


def test_pcp_with_dcp_is_silent_in_0_5_17_and_rejected_in_0_5_23():
    assert get_release("0.5.17").rules["pcp_with_dcp"].stage == "silent"
    r23 = get_release("0.5.23").rules["pcp_with_dcp"]
    assert (r23.stage, r23.message) == ("parse", "--dcp-size > 1 does not support --enable-prefill-cp.")


def test_kv_heads_rule_changes_in_0_5_23():
    assert get_release("0.5.17").kv_heads_rule == "attn_tp"
    assert get_release("0.5.23").kv_heads_rule == "attn_tp_over_dcp"


def test_sigterm_accepts_sigkill_statuses_by_design():
    for r in RELEASES:
        assert {-9, 137} <= r.sigterm_exit_statuses
        assert 0 not in r.rank_kill_exit_statuses


def test_support_lookup_falls_back_from_backend_to_family_default():
    r = get_release("0.5.17")
    assert support_of(r, "mha", "dcp", "triton").status == "untested"
    assert support_of(r, "mha", "dcp", "fa3").status == "silently-wrong"
    assert support_of(r, "qwen", "pcp+dcp", "fa3").status == "untested"
    assert support_of(get_release("0.5.23"), "mha", "pcp+dcp", "fa3").status == "rejected"
    assert support_of(r, "mamba", "dcp", "x") is None
