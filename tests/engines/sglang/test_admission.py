"""Specifications of cptest.engines.sglang.admission: SGLang's verdict on a launch, per release."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cptest.engines.sglang.admission import LaunchConfig, pcp_splits, predict
from cptest.engines.sglang.releases import get_release
from tests.engines.sglang.configs import launch

R17 = get_release("0.5.17")
R23 = get_release("0.5.23")
QWEN3_MOE = {"architecture": "Qwen3MoeForCausalLM", "heads": 32, "kv_heads": 4}
LLAMA = {"architecture": "LlamaForCausalLM", "heads": 32, "kv_heads": 8}


def codes(adm) -> set[str]:
    return {w.code for w in adm.warnings}


def test_gqa_zigzag_pcp_with_long_prompts_is_accepted_without_warnings():
    cfg = launch(
        tp=4,
        attn_cp=2,
        prefill_cp=True,
        cp_strategy="zigzag",
        attention_backend="fa3",
        min_prompt_len=1024,
        **QWEN3_MOE,
    )
    adm = predict(R17, cfg)
    assert (adm.accepted, adm.stage, adm.warnings) == (True, "accepted", ())


def test_pcp_without_strategy_is_rejected_at_parse_with_sglangs_message():
    adm = predict(R17, launch(tp=2, attn_cp=2, prefill_cp=True))
    assert (adm.accepted, adm.stage, adm.exception) == (False, "parse", "ValueError")
    assert adm.message == "--cp-strategy must be set when --enable-prefill-cp is enabled."
    assert adm.citation == "server_args.py:6319-6322"


def test_tp_not_divisible_by_attn_cp_is_an_assertion_at_parse():
    adm = predict(R17, launch(tp=3, attn_cp=2, prefill_cp=True, cp_strategy="zigzag"))
    assert (adm.stage, adm.exception, adm.message) == (
        "parse",
        "AssertionError",
        "tp_size must be divisible by attn_cp_size",
    )


def test_dcp_zero_is_rejected_at_parse_with_the_value_in_the_message():
    adm = predict(R17, launch(tp=2, dcp=0))
    assert adm.message == (
        "Decode context parallel size (--dcp-size / --decode-context-parallel-size) must be >= 1, "
        "but got dcp_size=0."
    )


def test_tp_not_divisible_by_dcp_passes_parse_and_fails_at_worker_start():
    adm = predict(R17, launch(tp=4, dcp=3))
    assert (adm.accepted, adm.stage) == (False, "worker_start")
    assert (
        adm.message == "tensor_model_parallel_size (4) must be divisible by decode_context_parallel_size (3)"
    )


def test_pcp_plus_dcp_is_accepted_with_a_warning_by_0_5_17_and_rejected_by_0_5_23():
    cfg = launch(tp=4, dcp=2, attn_cp=2, prefill_cp=True, cp_strategy="zigzag", **QWEN3_MOE)
    a17 = predict(R17, cfg)
    assert a17.accepted and "pcp_with_dcp" in codes(a17)
    a23 = predict(R23, cfg)
    assert (a23.accepted, a23.stage, a23.message) == (
        False,
        "parse",
        "--dcp-size > 1 does not support --enable-prefill-cp.",
    )


def test_llama_pcp_with_kv_heads_split_over_tp_crashes_at_the_first_prefill():
    # Seen on 2 x H200 (results/pcp2_zigzag_llama_kv2): tp 2, attn_cp 2, 2 KV heads.
    adm = predict(
        R17,
        launch(tp=2, attn_cp=2, prefill_cp=True, cp_strategy="zigzag", attention_backend="triton",
                     **{**LLAMA, "kv_heads": 2}),
    )  # fmt: skip
    assert (adm.accepted, adm.stage, adm.exception) == (False, "runtime", "RuntimeError")
    assert "is invalid for input of size" in (adm.message or "")


def test_llama_pcp_with_one_replicated_kv_head_is_flagged_silently_wrong_only_where_it_splits():
    config = launch(tp=4, attn_cp=2, prefill_cp=True, cp_strategy="zigzag", attention_backend="fa3",
                    **{**LLAMA, "kv_heads": 1})
    # 0.5.17 splits prefill only for its CP-v2 classes (observed: Llama's output was TP2's), unless
    # SGLANG_ENABLE_CP_V2=1 forces the split; then the head shards of CP partners differ.
    assert predict(R17, config).accepted and codes(predict(R17, config)) == set()
    forced = predict(R17, replace(config, env=(("SGLANG_ENABLE_CP_V2", "1"),)))
    assert forced.accepted and codes(forced) == {"llama_pcp_silent"}
    assert forced.warnings[0].message.startswith("prefill CP on LlamaForCausalLM with 1 KV head(s): ")


def test_llama_pcp_with_dcp_never_splits_so_does_not_crash():
    # Seen on 2 x H200 (results/pcp_dcp_rejected): PCP + DCP came up and served, cp never active.
    adm = predict(R17, launch(tp=2, dcp=2, attn_cp=2, prefill_cp=True, cp_strategy="zigzag",
                                    attention_backend="triton", **{**LLAMA, "kv_heads": 2}))  # fmt: skip
    assert adm.accepted and "llama_pcp" not in codes(adm)


def test_attention_dp_on_llama_is_flagged_and_on_qwen3_is_not():
    llama = predict(R17, launch(tp=4, attn_dp=2, architecture="LlamaForCausalLM", heads=8, kv_heads=1))
    assert llama.accepted and "llama_attention_dp" in codes(llama)
    assert "attention DP 2 on LlamaForCausalLM" in next(w.message for w in llama.warnings
                                                         if w.code == "llama_attention_dp")
    qwen3 = predict(R17, launch(tp=4, attn_dp=2, architecture="Qwen3ForCausalLM", heads=8, kv_heads=1))
    assert "llama_attention_dp" not in codes(qwen3)
    tp_only = predict(R17, launch(tp=4, architecture="LlamaForCausalLM", heads=8, kv_heads=1))
    assert "llama_attention_dp" not in codes(tp_only)
    # Nobody has read 0.5.23's Llama for it: the rule does not come over.
    later = predict(R23, launch(tp=4, attn_dp=2, architecture="LlamaForCausalLM"))
    assert "llama_attention_dp" not in codes(later)



def test_attention_cp_inside_attention_dp_dies_at_the_first_padded_decode():
    # Seen co-located (results/pcp2_zigzag_qwen3_moe_kv1_fa3_dp2): the warm-up decode's gather.
    adm = predict(R17, launch(tp=4, attn_dp=2, attn_cp=2, prefill_cp=True, cp_strategy="zigzag",
                              attention_backend="fa3", min_prompt_len=64, **QWEN3_MOE))
    assert (adm.accepted, adm.stage, adm.exception, adm.rule) == (False, "runtime", "ValueError",
                                                                  "pcp_attention_dp_gather")
    assert adm.message is not None and adm.message.startswith(
        "output tensor size must be equal to world_size times input tensor size")
    # Attention CP builds its groups without prefill CP too; attention TP 2 reduce-scatters first.
    for degrees in (dict(tp=4, attn_dp=2, attn_cp=2), dict(tp=8, attn_dp=2, attn_cp=2, prefill_cp=True,
                                                          cp_strategy="zigzag")):
        assert predict(R17, launch(**degrees, **QWEN3_MOE)).rule == "pcp_attention_dp_gather"
    # Attention CP 1, attention DP 1, or Llama (which gathers no attention-DP buffer): not this rule.
    for degrees, model in ((dict(tp=4, attn_dp=4), QWEN3_MOE), (dict(tp=4, attn_cp=2), QWEN3_MOE),
                           (dict(tp=4, attn_dp=2, attn_cp=2), LLAMA)):
        assert predict(R17, launch(**degrees, **model)).rule != "pcp_attention_dp_gather"
    # Nobody has read 0.5.23 for it: the rule does not come over.
    assert "pcp_attention_dp_gather" not in R23.rules


def test_attention_cp_inside_wider_attention_dp_is_flagged_not_rejected():
    """At attention DP 3 or more the warm-up decode all-reduces: the launch may come up, so the table
    warns (judged by serving and generation) instead of predicting a failed launch."""
    adm = predict(R17, launch(tp=6, attn_dp=3, attn_cp=2, prefill_cp=True, cp_strategy="zigzag", **QWEN3_MOE))
    assert adm.accepted and adm.rule is None
    assert "pcp_attention_dp_gather_wide" in codes(adm)
    assert "pcp_attention_dp_gather_wide" not in codes(predict(R17, launch(tp=8, attn_dp=4, attn_cp=2,
                                                                          **LLAMA)))
    assert "pcp_attention_dp_gather_wide" not in codes(predict(R17, launch(tp=4, attn_dp=2, attn_cp=2,
                                                                          **QWEN3_MOE)))
    assert "pcp_attention_dp_gather_wide" not in R23.rules

def test_mha_dcp_warns_when_kv_heads_exceed_tp_over_dcp():
    llama = predict(R17, launch(tp=8, dcp=2, attention_backend="triton", **LLAMA))
    assert "mha_dcp_kv_not_replicated" in codes(llama)
    qwen = predict(R17, launch(tp=8, dcp=2, attention_backend="triton", **QWEN3_MOE))
    assert "mha_dcp_kv_not_replicated" not in codes(qwen)
    assert codes(qwen) == {"dcp_disables_prefill_graph"}


def test_mha_dcp_on_a_backend_without_dcp_code_is_flagged():
    adm = predict(R17, launch(tp=8, dcp=2, attention_backend="fa3", **QWEN3_MOE))
    assert "dcp_backend_without_dcp_path" in codes(adm)
    mla = predict(R17, launch(tp=8, dcp=8, is_mla=True, attention_backend="flashinfer"))
    assert "dcp_backend_without_dcp_path" not in codes(mla)


@pytest.mark.parametrize(("min_len", "warned"), [(3, True), (4, False), (None, False)])
def test_zigzag_warns_when_a_prompt_is_shorter_than_twice_cp(min_len, warned):
    adm = predict(
        R17,
        launch(
            tp=2,
            attn_cp=2,
            prefill_cp=True,
            cp_strategy="zigzag",
            attention_backend="fa3",
            min_prompt_len=min_len,
            **QWEN3_MOE,
        ),
    )
    assert ("zigzag_short_prompt" in codes(adm)) is warned


def test_attn_cp_without_prefill_cp_warns_that_nothing_is_split():
    adm = predict(R17, launch(tp=2, attn_cp=2, **QWEN3_MOE))
    assert adm.accepted and codes(adm) == {"attn_cp_without_prefill_cp"}


def test_prefill_cp_with_attn_cp_1_warns_that_the_strategy_stays_unset():
    adm = predict(R17, launch(tp=2, prefill_cp=True, cp_strategy="zigzag", **QWEN3_MOE))
    assert codes(adm) == {"prefill_cp_needs_attn_cp"}


def test_interleave_on_gqa_is_flagged_and_on_dsa_is_not():
    gqa = predict(R17, launch(tp=2, attn_cp=2, prefill_cp=True, cp_strategy="interleave", **QWEN3_MOE))
    assert "interleave_no_attention" in codes(gqa)
    dsa = predict(
        R17,
        launch(
            tp=8,
            attn_cp=8,
            prefill_cp=True,
            cp_strategy="interleave",
            architecture="DeepseekV32ForCausalLM",
            is_mla=True,
        ),
    )
    assert "interleave_no_attention" not in codes(dsa)
    # DSA is the checkpoint's indexer, not the class: a V3.2 class without one has no DSA attention.
    no_indexer = predict(R17, launch(tp=8, attn_cp=8, prefill_cp=True, cp_strategy="interleave",
                                     architecture="DeepseekV32ForCausalLM", is_mla=True, dsa_indexer=False))
    assert "interleave_no_attention" in codes(no_indexer)
    v3_indexer = predict(R17, launch(tp=8, attn_cp=8, prefill_cp=True, cp_strategy="interleave",
                                     architecture="DeepseekV3ForCausalLM", is_mla=True, dsa_indexer=True))
    assert "interleave_no_attention" not in codes(v3_indexer)


@pytest.mark.parametrize("arch, strategy, env, splits", [
    ("Qwen3MoeForCausalLM", "zigzag", None, True),  # a CP-v2 class, the variable unset
    ("Qwen3MoeForCausalLM", "zigzag", "0", False),  # switched off: the model's own CP-v1 path, unhooked
    ("Qwen3MoeForCausalLM", "zigzag", "No", False),  # any of the release's boolean spellings, any case
    ("LlamaForCausalLM", "zigzag", "true", True),
    ("Qwen3MoeForCausalLM", "zigzag", "2", False),  # no boolean: read as the default, off
    ("DeepseekV32ForCausalLM", "zigzag", None, False),  # DSA takes CP v2 by default for interleave only
    ("DeepseekV32ForCausalLM", "interleave", None, True),
    ("DeepseekV32ForCausalLM", "zigzag", "1", True),
])
def test_the_generic_pcp_path_follows_the_variable_then_the_class(arch, strategy, env, splits):
    config = launch(tp=2, attn_cp=2, prefill_cp=True, cp_strategy=strategy, architecture=arch,
                    env=() if env is None else (("SGLANG_ENABLE_CP_V2", env),))
    assert pcp_splits(R17, config) is splits
    assert pcp_splits(R23, config) is True  # 0.5.23 names no classes: every architecture splits


@pytest.mark.parametrize("arch, indexer, zigzag_splits", [
    ("DeepseekV3ForCausalLM", None, True),  # config not read: V3's published checkpoints have no indexer
    ("DeepseekV3ForCausalLM", True, False),  # an indexer makes V3 a DSA model: CP v2 for interleave only
    ("DeepseekV32ForCausalLM", None, False),  # config not read: V3.2's checkpoints have one
    ("DeepseekV32ForCausalLM", False, True),  # a V3.2 class without an indexer is no DSA model
    ("Qwen3MoeForCausalLM", True, True),  # not an architecture SGLang's DSA test names
])
def test_dsa_is_an_architecture_with_an_indexer(arch, indexer, zigzag_splits):
    def config(strategy: str) -> LaunchConfig:
        return launch(tp=2, attn_cp=2, prefill_cp=True, cp_strategy=strategy, architecture=arch,
                      dsa_indexer=indexer)

    assert pcp_splits(R17, config("zigzag")) is zigzag_splits
    assert pcp_splits(R17, config("interleave"))  # interleave takes CP v2 on every class, DSA or not


def interleave_degrees(config: LaunchConfig):  # noqa: ANN201 - a Degrees
    return config.degrees.model_copy(update={"cp_strategy": "interleave"})


def test_a_cp_v1_split_is_read_except_dsas_round_robin():
    config = launch(tp=2, attn_cp=2, prefill_cp=True, cp_strategy="zigzag", **QWEN3_MOE)
    on = predict(R17, config)  # CP v2 by the class default: the generic split
    assert not on.cp_v1 and not codes(on) & {"pcp_cp_v1_unobserved", "pcp_cp_v1_interleave_zigzag"}
    off = replace(config, env=(("SGLANG_ENABLE_CP_V2", "0"),))
    zigzag = predict(R17, off)  # the model's own split, read at cp_split_and_rebuild_position
    assert zigzag.cp_v1 and zigzag.split_unobserved is None and not codes(zigzag)
    interleave = predict(R17, replace(off, degrees=interleave_degrees(off)))
    assert interleave.cp_v1 and codes(interleave) == {"pcp_cp_v1_interleave_zigzag"}
    dense = predict(R17, replace(off, architecture="Qwen3ForCausalLM"))  # no CP-v1 path: nothing is split
    assert not dense.cp_v1 and "pcp_cp_v1_unobserved" not in codes(dense)
    r23 = predict(R23, replace(off, degrees=interleave_degrees(off)))
    assert not codes(r23) & {"pcp_cp_v1_unobserved", "pcp_cp_v1_interleave_zigzag"}  # 0.5.17's table only


def test_dsas_round_robin_split_is_named_unobservable():
    dsa = launch(tp=2, attn_cp=2, prefill_cp=True, cp_strategy="interleave",
                 architecture="DeepseekV32ForCausalLM", dsa_indexer=True, env=(("SGLANG_ENABLE_CP_V2", "0"),))
    rr = predict(R17, dsa)
    assert "pcp_cp_v1_unobserved" in codes(rr) and rr.split_unobserved and not rr.cp_v1
    assert "pcp_cp_v1_interleave_zigzag" not in codes(rr)  # round robin is interleave's own layout
    # zigzag on a DSA model takes CP v1 by default (the in-seq split): its metadata is zigzag's, read
    zigzag_degrees = dsa.degrees.model_copy(update={"cp_strategy": "zigzag"})
    zigzag = predict(R17, replace(dsa, degrees=zigzag_degrees, env=()))
    assert zigzag.cp_v1 and zigzag.split_unobserved is None


def test_a_scenario_judging_rows_where_cp_v1_ignores_interleave_gets_a_lint_finding():
    from cptest.lang import parse_file
    from cptest.plan.lint import lint

    root = Path(__file__).resolve().parents[3]
    s = parse_file(root / "scenarios" / "qualification" / "pcp2_zigzag_qwen3_moe_kv1.cps")
    off = s.model_copy(update={"serve": s.serve.model_copy(update={"env": {"SGLANG_ENABLE_CP_V2": "0"}})})
    assert not {f.code for f in lint(off)} & {"pcp_cp_v1_unobserved", "pcp_cp_v1_interleave_zigzag"}
    topo = off.topology.model_copy(update={"cp_strategy": "interleave"})
    interleave = off.model_copy(update={"topology": topo})
    (finding,) = [f for f in lint(interleave) if f.code == "pcp_cp_v1_interleave_zigzag"]
    # observed on the H200 (the rule's evidence): a scenario expecting the order to hold is refused
    assert finding.blocks and "expects pcp rows to hold" in finding.message
    assert "`violated pcp rows ... because" in finding.message  # the statement as it is written
