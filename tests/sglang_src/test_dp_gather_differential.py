"""The MLP's attention-DP gather with attention CP: cptest's rules `pcp_attention_dp_gather` (attention DP
2: the launch dies) and `pcp_attention_dp_gather_wide` (3 or more: a later decode dies, or the
all-reduce sums the CP ranks' rows) against SGLang 0.5.17's own sizing and gather, run on a real
gloo world on the CPU.

The driver's `dp_gather` forks one process per rank. Each builds SGLang's groups, sizes its DP rank's
batch through `ForwardBatch.prepare_mlp_sync_batch` and runs the gather `prepare_mlp` starts with
(`CommunicateWithAllReduceAndLayerNormFn._gather_hidden_states_and_residual`): the MAX_LEN mode
all-gathers over the TP group (`layers/dp_attention.py:490-523`), SUM_LEN all-reduces. Every layout of
attention DP 2-4, attention CP 1-4 and attention TP 1-2 on at most 8 ranks runs (prefill CP on and off
where attention CP > 1; dense Qwen3 or Qwen3-MoE), each with the launch's warm-up decode (one request
on DP rank 0), a decode with even loads (the sizes a CUDA-graph decode captures with) and extends and
decodes whose DP ranks' token counts hypothesis draws. Checked:
- SGLang refuses the gather exactly where torch's size rule for `all_gather_into_tensor` fails on the
  sizes SGLang passes (output rows == TP group size * input rows), on every rank alike;
- the rules flag exactly the degrees where some decode is refused: every MAX_LEN decode with
  attention CP > 1, the even-load one always; the launch's rule exactly where the warm-up is
  refused too (attention DP 2); with attention CP 1 nothing is refused;
- a gather that passes puts each DP rank's rows in its slice, times attention CP: every CP rank of a
  DP rank adds its copy in the all-reduce.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cptest.engines.sglang.admission import LaunchConfig, predict
from cptest.engines.sglang.releases import RELEASE_0_5_17
from cptest.topology import Degrees
from tests.sglang_src.conftest import COMPARED, DIFFERENTIAL, TINY_CONFIGS, SGLangDriver

COUNT = COMPARED[__name__]
HYPOTHESIS = settings(max_examples=2, **DIFFERENTIAL)
RULE = "pcp_attention_dp_gather"
WIDE = "pcp_attention_dp_gather_wide"
FAMILIES = ("qwen3", "qwen3-moe")
"""Models whose layers gather the attention-DP buffer (Llama's do not: `llama_attention_dp`)."""
REFUSED_AT = "distributed/parallel_state.py:1187"
"""`GroupCoordinator._all_gather_into_tensor`'s call of torch's collective: where the archive's traceback
(NCCL's `ValueError`) and gloo's refusal both come from."""


def warmup(dp: int) -> dict[str, Any]:
    """The launch's warm-up request: one decode token on DP rank 0, the others idle."""
    return {"tokens": [1] + [0] * (dp - 1), "extend": False}


def even(dp: int) -> dict[str, Any]:
    """Every DP rank decoding as many tokens: MAX_LEN, with the sizes a CUDA-graph capture has."""
    return {"tokens": [2] * dp, "extend": False}


DEGREES = [(dp, cp, attn_tp, prefill_cp) for dp in (2, 3, 4) for cp in (1, 2, 3, 4) for attn_tp in (1, 2)
           for prefill_cp in ((False, True) if cp > 1 else (False,)) if dp * cp * attn_tp <= 8]
"""Every layout of attention DP 2-4, attention CP 1-4 and attention TP 1-2 on at most 8 ranks, prefill
CP on and off where attention CP > 1 (without it attention CP still builds its groups)."""


def make_world(dp: int, cp: int, attn_tp: int, prefill_cp: bool,
               cases: list[dict[str, Any]]) -> dict[str, Any]:
    """The driver's request for one layout (the model alternates between the two families)."""
    return {"tp": dp * cp * attn_tp, "dp": dp, "attn_cp": cp, "prefill_cp": prefill_cp,
            "family": FAMILIES[(dp + cp + attn_tp + prefill_cp) % 2], "cases": [warmup(dp), even(dp), *cases]}


def batches(dp: int) -> st.SearchStrategy[list[dict[str, Any]]]:
    """Extends and decodes, each with every DP rank's token count (some of them idle)."""
    tokens = st.lists(st.integers(0, 24), min_size=dp, max_size=dp).filter(any)
    batch = st.fixed_dictionaries({"tokens": tokens, "extend": st.booleans()})
    return st.lists(batch, min_size=4, max_size=8)


def predicted(world: dict[str, Any]) -> tuple[str | None, bool]:
    """The rule that rejects this launch in cptest's table (None: accepted), and whether the table
    warns that a later decode dies or the output is wrong (WIDE)."""
    degrees = Degrees(tp=world["tp"], attn_dp=world["dp"], attn_cp=world["attn_cp"],
                      prefill_cp=world["prefill_cp"], cp_strategy="zigzag" if world["prefill_cp"] else None)
    launch = LaunchConfig(degrees=degrees, architecture=TINY_CONFIGS[world["family"]]["architectures"][0])
    adm = predict(RELEASE_0_5_17, launch)
    return adm.rule, any(w.code == WIDE for w in adm.warnings)


def expected_buffer(tokens: list[int], slices: list[int]) -> list[float]:
    """Each DP rank's rows (the driver's `1000 * (dp_rank + 1) + row`) at the start of its slice, then 0."""
    out: list[float] = []
    for d, (n, width) in enumerate(zip(tokens, slices, strict=True)):
        out += [1000.0 * (d + 1) + i for i in range(n)] + [0.0] * (width - n)
    return out


def run_world(sglang: SGLangDriver, tiny_models: dict[str, str], world: dict[str, Any]) -> list[bool]:
    """Run `world`'s cases on SGLang's gather and compare each with torch's size rule and the rule.
    Returns, per case, whether SGLang refused it."""
    (answer,) = sglang.ask([{"op": "dp_gather", "model_path": tiny_models[world["family"]],
                             **{k: v for k, v in world.items() if k != "family"}}])
    assert answer["ok"], answer
    ranks = answer["ranks"]
    assert len(ranks) == world["tp"]
    cp, (rule, wide) = world["attn_cp"], predicted(world)
    assert rule in (None, RULE), (world, rule)  # the degrees themselves are valid
    flagged = rule == RULE or wide
    refusals = []
    for i, case in enumerate(world["cases"]):
        seen = [r["cases"][i] for r in ranks]
        first = seen[0]
        assert first["tp_group"] == world["tp"]  # attn_dp * attn_cp * attn_tp ranks
        # Every rank sizes the same buffer, picks the same mode and fares the same.
        assert {(s["mode"], s["buffer"], tuple(s["slices"]), s["ok"]) for s in seen} == {
            (first["mode"], first["buffer"], tuple(first["slices"]), first["ok"])}, (world, case)
        refused = not first["ok"]
        # torch's rule for all_gather_into_tensor on the sizes SGLang passes: the TP group's ranks each
        # bring their slice (1/attn_tp of the rank's rows, after the attention-TP reduce-scatter).
        too_small = first["mode"] == "MAX_LEN" and first["buffer"] != first["tp_group"] * (
            first["rows"] // first["attn_tp"])
        assert refused == too_small, (world, case, first)
        if refused:
            assert first["where"] == REFUSED_AT, first
            assert flagged, (world, case, first)
        else:
            expected = [cp * x for x in expected_buffer(case["tokens"], first["slices"])]
            assert all(s["gathered"] == expected for s in seen), (world, case, first["gathered"], expected)
        if flagged and first["mode"] == "MAX_LEN":
            assert refused, (world, case, first)
        # Extends take SUM_LEN under attention DP > 1 (no prefill graph is captured here): never refused.
        assert not (refused and case["extend"]), (world, case)
        refusals.append(refused)
        outcome = "refused" if refused else "gathered"
        COUNT[f"attn_cp {'1' if cp == 1 else '>1'}, {first['mode']}: {outcome}"] += 1
    warm, balanced = refusals[0], refusals[1]
    # The rules fire exactly where a decode is refused: the even one always. The launch's rule exactly
    # where the warm-up is refused too: at attention DP 2 every decode is MAX_LEN (2 * sum >= 2 * max);
    # at 3 or more the warm-up all-reduces, so the table only warns (WIDE).
    assert flagged == balanced == any(refusals), (world, refusals)
    assert warm == (rule == RULE), (world, refusals)
    assert not (rule == RULE and wide), world
    COUNT["worlds"] += 1
    COUNT[f"worlds with attn_tp {world['tp'] // (world['dp'] * cp)}"] += 1
    return refusals


@pytest.mark.parametrize("dp, cp, attn_tp, prefill_cp", DEGREES,
                         ids=[f"dp{d}-cp{c}-attn_tp{t}{'-pcp' if p else ''}" for d, c, t, p in DEGREES])
@HYPOTHESIS
@given(data=st.data())
def test_sglang_refuses_the_gather_exactly_where_the_rule_says(
        sglang: SGLangDriver, tiny_models: dict[str, str], dp: int, cp: int, attn_tp: int, prefill_cp: bool,
        data: st.DataObject) -> None:
    run_world(sglang, tiny_models, make_world(dp, cp, attn_tp, prefill_cp, data.draw(batches(dp))))
