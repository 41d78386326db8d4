"""cptest's admission verdicts for SGLang 0.5.17, checked against SGLang's own code on the CPU.

For every generated launch, cptest predicts (`admission.predict`) and SGLang decides: its parser and
`ServerArgs` on the argv cptest would launch with (`build_argv`), then, where it accepts, its real
`initialize_model_parallel` with the sizes its bootstrap passes. A parse-stage rule must be SGLang's
first refusal, with SGLang's exception type and message; a worker-start rule must pass `ServerArgs`
and be `initialize_model_parallel`'s refusal; anything else must pass both. What the CPU cannot
exercise (`device="cpu"` takes CPU branches; runtime and silent rules need a forward) is listed in
`CPU_BLIND` and in each rule's provenance, not compared here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cptest.engines.sglang.admission import Admission, LaunchConfig, pcp_splits, predict
from cptest.engines.sglang.argv import LAUNCHER, build_argv
from cptest.engines.sglang.releases import RELEASE_0_5_17
from cptest.lang.model_block import facts_from_config
from cptest.topology import Degrees, divisors
from tests.engines.sglang.configs import serve_config
from tests.sglang_src.conftest import _COMMON, TINY_CONFIGS, SGLangDriver

ARCHITECTURE = {name: cfg["architectures"][0] for name, cfg in TINY_CONFIGS.items()}
BACKENDS = (None, "triton", "fa3", "flashinfer")

COMPARED = frozenset({
    # parse and worker start, generated and at their edges
    "dcp_at_least_1", "cp_strategy_required", "tp_divisible_by_attn_dp", "tp_divisible_by_attn_cp",
    "tp_divisible_by_dp_attn_cp", "pcp_with_dcp", "tp_divisible_by_dcp",
    # worker-start messages, word for word
    "dcp_at_least_1_worker", "dcp_platform",
    # silent: no strategy bound here; no split (`can_apply`) in test_topology_differential
    "prefill_cp_needs_attn_cp", "attn_cp_without_prefill_cp", "zigzag_short_prompt", "interleave_short_batch",
    # a parse-time warning: the resolved prefill graph backend
    "dcp_disables_prefill_graph",
})
CPU_BLIND = {
    "interleave_no_attention": "fails at the first CP extend: needs a forward",
    "pcp_cp_v1_unobserved": "the model's own split runs in its forward; the switch it hangs on "
                            "(CP v2 off) is compared by test_which_launches_take_the_generic_pcp_path_…",
    "pcp_cp_v1_interleave_zigzag": "the model's own split runs in its forward; its metadata is "
                                   "compared by test_topology_differential's "
                                   "test_cp_v1_splits_read_by_the_probe_…, the switch (CP v2 off) by "
                                   "test_which_launches_take_the_generic_pcp_path_…",
    "llama_pcp": "the KV-pool write of the first prefill: needs a forward",
    "llama_pcp_silent": "wrong output: needs a forward",
    "llama_attention_dp": "the all-reduce of different batches: needs a forward",
    "pcp_attention_dp_gather": "the MLP's gather at the first padded decode: needs the collective, "
                               "which test_dp_gather_differential runs over gloo with SGLang's sizing",
    "pcp_attention_dp_gather_wide": "a later decode's gather, or the all-reduce's sum: needs the "
                                    "collective (test_dp_gather_differential, over gloo)",
    "mha_dcp_kv_not_replicated": "wrong output: needs a forward",
    "mla_dcp_triton_decode": "the first decode: needs a forward",
    "mla_dcp_flashmla_lse_unpacked": "the first decode: needs a forward (and FlashMLA)",
    "mla_dcp_fa3_no_lse": "the first decode: needs a forward (and fa3)",
    "dcp_fused_rope_kv_write": "the fused RoPE store: needs a forward",
    "dcp_backend_without_dcp_path": "wrong output: needs a forward",
}
"""Every 0.5.17 rule is compared here or says why the CPU cannot show it (its provenance stays
what a GPU run showed, or inferred)."""


def test_every_rule_is_compared_or_says_why_not() -> None:
    assert set(RELEASE_0_5_17.rules) == COMPARED | set(CPU_BLIND)
    assert not COMPARED & set(CPU_BLIND)


@dataclass
class Tally:
    compared: int = 0
    refused: int = 0
    by_rule: dict[str, int] | None = None
    cp_v2_switch: int = 0
    """Launches whose CP-v2 switch was compared with `pcp_splits`."""


TALLY = Tally(by_rule={})


@st.composite
def launches(draw: Any) -> tuple[str, LaunchConfig]:
    family = draw(st.sampled_from(sorted(TINY_CONFIGS)))
    tp = draw(st.integers(1, 8))

    def degree(top: int) -> int:
        # Mostly a divisor of tp (what launches), sometimes anything (what a rule refuses).
        return draw(st.one_of(st.sampled_from(divisors(tp)), st.sampled_from(divisors(tp)),
                              st.integers(0, top)))

    d = Degrees(
        tp=tp, dcp=degree(8), attn_cp=max(degree(8), 1), attn_dp=max(degree(4), 1),
        prefill_cp=draw(st.booleans()), cp_strategy=draw(st.sampled_from((None, "zigzag", "interleave"))),
    )
    cfg = TINY_CONFIGS[family]
    return family, LaunchConfig(
        degrees=d, architecture=ARCHITECTURE[family], heads=cfg["num_attention_heads"],
        kv_heads=cfg["num_key_value_heads"], attention_backend=draw(st.sampled_from(BACKENDS)),
    )  # fmt: skip


def expected(adm: Admission) -> tuple[str, str | None, str | None]:
    """(stage SGLang must refuse at, or "accepted"; exception type; message) from cptest's verdict."""
    if adm.accepted or adm.stage not in ("parse", "worker_start"):
        return "accepted", None, None
    return adm.stage, adm.exception, adm.message


def observed(answer: dict[str, Any]) -> tuple[str, str | None, str | None]:
    if not answer["ok"]:
        return "parse", answer["type"], answer["message"]
    worker = answer["worker_start"]
    if not worker["ok"]:
        return "worker_start", worker["type"], worker["message"]
    return "accepted", None, None


def compare(sglang: SGLangDriver, models: dict[str, str], batch: list[tuple[str, LaunchConfig]]) -> None:
    requests = []
    for family, launch in batch:
        serve = serve_config(models[family], attention_backend=launch.attention_backend,
                             **launch.degrees.model_dump(exclude={"gpus", "nodes", "pp"}))
        argv = build_argv(RELEASE_0_5_17, serve)[len(LAUNCHER):]
        requests.append({"op": "server_args", "argv": argv, "worker_start": True})
    answers = sglang.ask(requests)
    mismatches = []
    for (family, launch), answer in zip(batch, answers, strict=True):
        adm = predict(RELEASE_0_5_17, launch)
        want, got = expected(adm), observed(answer)
        TALLY.compared += 1
        if got[0] != "accepted":
            TALLY.refused += 1
            assert TALLY.by_rule is not None
            key = adm.rule or f"(none: {answer.get('where') or answer['worker_start'].get('where')})"
            TALLY.by_rule[key] = TALLY.by_rule.get(key, 0) + 1
        if want != got:
            mismatches.append(f"{family} {launch.degrees} backend={launch.attention_backend}: cptest {want} "
                              f"(rule {adm.rule}), SGLang {got} at {answer.get('where', '')}")
    assert not mismatches, "\n".join(mismatches)


@pytest.fixture(scope="module", autouse=True)
def report_tally() -> Any:
    yield
    print(f"\nrules differential: {TALLY.compared} configurations compared, {TALLY.refused} refused by "
          f"SGLang; refusals by cptest rule: {TALLY.by_rule}; CP-v2 switch compared on {TALLY.cp_v2_switch}")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(batch=st.lists(launches(), min_size=12, max_size=12))
def test_parse_and_worker_start_verdicts_match_sglang(sglang: SGLangDriver, tiny_models: dict[str, str],
                                                      batch: list[tuple[str, LaunchConfig]]) -> None:
    compare(sglang, tiny_models, batch)


EDGES = [
    dict(tp=2, attn_cp=2, prefill_cp=True),
    dict(tp=3, attn_cp=2, prefill_cp=True, cp_strategy="zigzag"),
    dict(tp=2, dcp=0),
    dict(tp=4, dcp=2, attn_cp=2, prefill_cp=True, cp_strategy="zigzag"),
    dict(tp=4, dcp=3),
    dict(tp=4, attn_dp=3),
    dict(tp=6, attn_dp=2, attn_cp=2, prefill_cp=True, cp_strategy="zigzag"),
    dict(tp=4, attn_dp=2, attn_cp=4, prefill_cp=True, cp_strategy="zigzag"),
    dict(tp=4, attn_dp=2, dcp=2),
    dict(tp=8, attn_dp=2, dcp=4),
    dict(tp=2, attn_cp=2, prefill_cp=True, cp_strategy="interleave"),
    dict(tp=2, prefill_cp=True, cp_strategy="zigzag"),
]
"""The rules one by one, each at least once whatever hypothesis draws."""


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_each_rule_at_its_edge_matches_sglang(sglang: SGLangDriver, tiny_models: dict[str, str],
                                              family: str) -> None:
    cfg = TINY_CONFIGS[family]
    batch = [(family, LaunchConfig(degrees=Degrees(**edge), architecture=ARCHITECTURE[family],
                                   heads=cfg["num_attention_heads"], kv_heads=cfg["num_key_value_heads"]))
             for edge in EDGES]
    compare(sglang, tiny_models, batch)


@pytest.mark.parametrize("code, request_", [
    ("tp_divisible_by_dcp", {"tp": 4, "dcp": 3}),
    ("tp_divisible_by_dcp", {"tp": 6, "dcp": 4}),
    ("dcp_at_least_1_worker", {"tp": 2, "dcp": 0}),
    ("dcp_platform", {"tp": 2, "dcp": 2, "cuda": False}),
])
def test_worker_start_messages_are_sglangs(sglang: SGLangDriver, code: str, request_: dict[str, Any]) -> None:
    """The worker-start rules' messages, word for word, from SGLang's `initialize_model_parallel`
    (dcp_at_least_1_worker is unreachable through ServerArgs, which refuses dcp < 1 first)."""
    rule = RELEASE_0_5_17.rules[code]
    answer = sglang.ask([{"op": "groups", **request_}])[0]
    assert (answer["ok"], answer["type"]) == (False, rule.exception)
    assert answer["message"] == rule.message.format(**request_)  # type: ignore[union-attr]


@pytest.mark.parametrize("code, degrees", [
    ("prefill_cp_needs_attn_cp", dict(tp=2, prefill_cp=True, cp_strategy="zigzag")),
    ("attn_cp_without_prefill_cp", dict(tp=4, attn_cp=2)),
    ("attn_cp_without_prefill_cp", dict(tp=4, attn_cp=2, cp_strategy="zigzag")),
])
def test_silent_pcp_rules_bind_no_strategy(sglang: SGLangDriver, tiny_models: dict[str, str], code: str,
                                           degrees: dict[str, Any]) -> None:
    """cptest's silent PCP rules: SGLang accepts the launch and binds no split strategy."""
    launch = LaunchConfig(degrees=Degrees(**degrees), architecture=ARCHITECTURE["qwen3-moe"])
    assert code in {w.code for w in predict(RELEASE_0_5_17, launch).warnings}
    serve = serve_config(tiny_models["qwen3-moe"], **degrees)
    answer = sglang.ask([{"op": "server_args", "argv": build_argv(RELEASE_0_5_17, serve)[len(LAUNCHER):]}])[0]
    assert answer["ok"] and answer["cp_strategy_bound"] is None, answer


def test_prefill_cp_binds_the_named_strategy(sglang: SGLangDriver, tiny_models: dict[str, str]) -> None:
    """The other side of the silent rules: with attn_cp > 1, the split the scenario names is bound."""
    for strategy in ("zigzag", "interleave"):
        serve = serve_config(tiny_models["qwen3-moe"], tp=2, attn_cp=2, prefill_cp=True, cp_strategy=strategy)
        argv = build_argv(RELEASE_0_5_17, serve)[len(LAUNCHER):]
        answer = sglang.ask([{"op": "server_args", "argv": argv}])[0]
        assert answer["cp_strategy_bound"] == strategy, answer


@pytest.mark.parametrize("tp, dcp", [(4, 1), (4, 2), (4, 4), (2, 2)])
def test_dcp_disables_the_prefill_graph_as_predicted(sglang: SGLangDriver, tiny_models: dict[str, str],
                                                     tp: int, dcp: int) -> None:
    """`_handle_cuda_graph_config` runs whatever the device: its resolved prefill backend shows the rule."""
    launch = LaunchConfig(degrees=Degrees(tp=tp, dcp=dcp), architecture=ARCHITECTURE["qwen3"])
    predicted = "dcp_disables_prefill_graph" in {w.code for w in predict(RELEASE_0_5_17, launch).warnings}
    serve = serve_config(tiny_models["qwen3"], tp=tp, dcp=dcp)
    answer = sglang.ask([{"op": "server_args", "argv": build_argv(RELEASE_0_5_17, serve)[len(LAUNCHER):]}])[0]
    assert answer["ok"], answer
    assert (answer["graph_backends"]["prefill"] == "disabled") == predicted, answer["graph_backends"]


DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
               "num_attention_heads": 8, "num_key_value_heads": 8, "kv_lora_rank": 64, "q_lora_rank": None,
               "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 8,
               "num_experts_per_tok": 2, "moe_intermediate_size": 64, "first_k_dense_replace": 1,
               "n_shared_experts": 1, "n_group": 1, "topk_group": 1}
"""cptest's MLA family, an architecture of the CP-v2 classes with no DSA indexer (`index_topk`)."""
INDEXER = {"index_topk": 64, "index_head_dim": 32, "index_n_heads": 4}
DSA_VARIANTS = {
    "mla-indexer": INDEXER,
    "v32": {"architectures": ["DeepseekV32ForCausalLM"], **INDEXER},
    "v32-no-indexer": {"architectures": ["DeepseekV32ForCausalLM"]},
    "glm-dsa": {"architectures": ["GlmMoeDsaForCausalLM"], **INDEXER},
}
"""MLA configs around SGLang's DSA test (`is_deepseek_dsa`: a named architecture *and* an indexer),
each a CP-v2 class: V3 with an indexer, V3.2 and GLM DSA with one, and V3.2 without."""
CP_V2_ENV = (None, "1", "0", "true", "N", "2")
"""The scenario's `SGLANG_ENABLE_CP_V2`: unset (the class decides), booleans both ways, and a value
that is none (read as the variable's default, off, and no class default either)."""


@pytest.fixture(scope="module")
def mla_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """cptest's MLA family and the DSA variants, each a config-only model folder."""
    out = {}
    for name, extra in {"mla": {}, **DSA_VARIANTS}.items():
        d = tmp_path_factory.mktemp(f"tiny-{name}")
        (d / "config.json").write_text(json.dumps({**_COMMON, **DEEPSEEK_V3, **extra}))
        out[name] = str(d)
    return out


def test_which_launches_take_the_generic_pcp_path_is_sglangs(
        sglang: SGLangDriver, tiny_models: dict[str, str], mla_models: dict[str, str]) -> None:
    """`pcp_splits`, which the rules about what a split gets wrong hang on, against the CP-v2 switch
    ServerArgs leaves set for the launch: per family, strategy and the scenario's variable. cptest
    reads each model's facts from its config as a scenario's `model local` does."""
    models = {**tiny_models, **mla_models}
    cases, requests = [], []
    for family in sorted(models):
        facts = facts_from_config(json.loads((Path(models[family]) / "config.json").read_text()))
        for strategy in ("zigzag", "interleave"):
            for value in CP_V2_ENV:
                env = {} if value is None else {RELEASE_0_5_17.pcp_force_env: value}
                degrees = dict(tp=2, attn_cp=2, prefill_cp=True, cp_strategy=strategy)
                launch = LaunchConfig(degrees=Degrees(**degrees), architecture=facts["architecture"],
                                      dsa_indexer=facts.get("dsa_indexer"), env=tuple(env.items()))
                serve = serve_config(models[family], **degrees)
                cases.append((family, strategy, value, pcp_splits(RELEASE_0_5_17, launch)))
                argv = build_argv(RELEASE_0_5_17, serve)[len(LAUNCHER):]
                # A DSA checkpoint's defaults read the compute capability: the GPU machine's H200.
                requests.append({"op": "server_args", "argv": argv, "env": env, "gpu_capability": [9, 0]})
    answers = sglang.ask(requests)
    for (family, strategy, value, predicted), answer in zip(cases, answers, strict=True):
        assert answer["ok"], (family, strategy, value, answer)
        assert answer["cp_v2"] == predicted, (family, strategy, value, answer["cp_v2"])
    TALLY.cp_v2_switch += len(cases)
