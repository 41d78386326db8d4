"""Specifications of cptest.engines.sglang.argv: launch argv per release, checked against its flags."""

from __future__ import annotations

import pytest

from cptest.engines.sglang.argv import LAUNCHER, build_argv
from cptest.engines.sglang.releases import KNOWN_RELEASES, get_release
from cptest.errors import PlanError
from tests.engines.sglang.configs import serve_config

R17 = get_release("0.5.17")


DCP2 = serve_config("/models/qwen3", tp=2, dcp=2, attention_backend="triton", cuda_graph={"decode": "full"})
PCP2 = serve_config(
    "/models/qwen3",
    tp=2,
    attn_cp=2,
    prefill_cp=True,
    cp_strategy="zigzag",
    attention_backend="fa3",
    eager=True,
)
EVERYTHING = serve_config(
    "/m",
    host="0.0.0.0",
    port=31000,
    tp=8,
    attn_cp=2,
    attn_dp=2,
    pp=1,
    prefill_cp=True,
    cp_strategy="zigzag",
    nnodes=2,
    node_rank=1,
    dist_init_addr="10.0.0.1:5000",
    attention_backend="fa3",
    cuda_graph={"decode": "full", "prefill": "disabled"},
    page_size=16,
    max_total_tokens=100000,
    mem_fraction_static=0.8,
    context_length=32768,
    sampling_backend="pytorch",
    random_seed=7,
    enable_metrics=True,
    forward_hooks=(
        {
            "name": "rows",
            "target_modules": ["model.layers.*.mlp"],
            "hook_factory": "cptest.probe.hooks:rows",
            "config": {},
        },
    ),
    extra=(("--log-level", "info"), ("--disable-radix-cache", None)),
)


def flags_of(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith("--")]


def test_dcp2_argv_for_0_5_17_is_exact():
    assert build_argv(R17, DCP2) == [
        *LAUNCHER,
        "--model-path",
        "/models/qwen3",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
        "--tp-size",
        "2",
        "--dcp-size",
        "2",
        "--attention-backend",
        "triton",
        "--cuda-graph-backend-decode",
        "full",
        "--skip-tokenizer-init",
    ]


def test_pcp2_eager_disables_graphs_in_both_phases():
    argv = build_argv(R17, PCP2)
    assert argv[argv.index("--attn-cp-size") + 1] == "2"
    assert "--enable-prefill-cp" in argv and argv[argv.index("--cp-strategy") + 1] == "zigzag"
    assert argv[argv.index("--cuda-graph-backend-decode") + 1] == "disabled"
    assert argv[argv.index("--cuda-graph-backend-prefill") + 1] == "disabled"


@pytest.mark.parametrize("release", list(KNOWN_RELEASES.values()), ids=lambda r: r.name)
def test_every_emitted_flag_exists_in_that_releases_table(release):
    for cfg in (DCP2, PCP2, EVERYTHING):
        for flag in flags_of(build_argv(release, cfg)):
            assert flag in release.flags, flag


def test_attention_dp_uses_each_releases_spelling():
    a17 = build_argv(R17, serve_config("/m", tp=4, attn_dp=2))
    assert a17[a17.index("--dp-size") :][:3] == ["--dp-size", "2", "--enable-dp-attention"]
    a23 = build_argv(get_release("0.5.23"), serve_config("/m", tp=4, attn_dp=2))
    assert "--attn-dp-size" in a23 and "--enable-dp-attention" not in a23


def test_forward_hooks_are_one_compact_json_argument():
    argv = build_argv(R17, EVERYTHING)
    assert argv[argv.index("--forward-hooks") + 1].startswith('[{"name":"rows","target_modules":')


def test_unknown_passthrough_flag_is_a_plan_error_with_did_you_mean():
    with pytest.raises(
        PlanError, match=r"--tp-sise: SGLang 0\.5\.17 has no such flag; did you mean --tp-size\?"
    ):
        build_argv(R17, serve_config("/m", extra=(("--tp-sise", "2"),)))


def test_passthrough_arity_is_checked_both_ways():
    with pytest.raises(PlanError, match="--disable-radix-cache: is a switch and takes no value"):
        build_argv(R17, serve_config("/m", extra=(("--disable-radix-cache", "1"),)))
    with pytest.raises(PlanError, match="--log-level: takes a value"):
        build_argv(R17, serve_config("/m", extra=(("--log-level", None),)))


def test_passthrough_cannot_override_the_topology():
    with pytest.raises(PlanError, match="--decode-context-parallel-size: cptest sets it"):
        build_argv(R17, serve_config("/m", extra=(("--decode-context-parallel-size", "2"),)))


def test_choices_are_checked_against_the_release():
    with pytest.raises(PlanError, match=r"--cp-strategy ring: expected zigzag or interleave"):
        build_argv(R17, serve_config("/m", tp=2, attn_cp=2, prefill_cp=True, cp_strategy="ring"))
    # tc_piecewise exists in 0.5.17's graph backends and not in 0.5.23's.
    cfg = serve_config("/m", cuda_graph={"prefill": "tc_piecewise"})
    assert "tc_piecewise" in build_argv(R17, cfg)
    with pytest.raises(PlanError, match="expected full, breakable or disabled"):
        build_argv(get_release("0.5.23"), cfg)


def test_all_problems_are_reported_together():
    with pytest.raises(PlanError) as err:
        build_argv(R17, serve_config("/m", cuda_graph={"verify": "full"}, extra=(("--nope", None),)))
    text = str(err.value)
    assert "unknown CUDA-graph phase 'verify'" in text and "--nope" in text


def test_multinode_needs_a_dist_init_addr():
    with pytest.raises(PlanError, match="nnodes > 1 needs dist_init_addr"):
        build_argv(R17, serve_config("/m", tp=16, nnodes=2))
