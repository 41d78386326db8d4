"""The attention-DP buffer: cptest's probe reader and `pcp rows`' rule against the buffer SGLang 0.5.17
itself sizes.

The driver runs SGLang's own `ForwardBatch.prepare_mlp_sync_batch` on one DP rank's batch, with the
token counts the DP ranks exchanged, and answers the four fields the probe reads. cptest's reader
(`cptest.probe.records.dp_buffer`) turns them into the `dp_buffer` of a Step whose batch is that DP
rank's, and `pcp rows` must find nothing wrong with it: a buffer SGLang sizes for a right handoff is
never failed. For each model class (Llama, aligned to the zigzag split; Qwen3 and Qwen3-MoE, CP-v2
classes, not) and each of extend and decode (SUM_LEN; SUM_LEN or MAX_LEN), hypothesis draws the
degrees (attention DP 2-4, attention CP 1-4, attention TP 1-2, at most 8 ranks), the DP rank and
every DP rank's tokens (an idle rank included).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cptest.contracts.groups import attention_batch_rows
from cptest.contracts.pcp_rows import PcpRowsParams, _dp_buffer, _Tally
from cptest.evidence import RankId, Step
from cptest.probe.records import StepDraft, _drop_dp_padding, dp_buffer
from tests.sglang_src.conftest import COMPARED, DIFFERENTIAL, SGLangDriver

COUNT = COMPARED[__name__]
HYPOTHESIS = settings(max_examples=15, **DIFFERENTIAL)


@st.composite
def degrees_and_tokens(draw: st.DrawFn) -> dict[str, Any]:
    dp = draw(st.sampled_from((2, 4)))
    cp = draw(st.sampled_from([c for c in (1, 2, 4) if dp * c <= 8]))
    attn_tp = draw(st.sampled_from([t for t in (1, 2) if dp * cp * t <= 8]))
    dp_rank = draw(st.integers(0, dp - 1))
    tokens = draw(st.lists(st.integers(0, 300), min_size=dp, max_size=dp))
    tokens[dp_rank] = max(tokens[dp_rank], 1)
    return {"tp": dp * cp * attn_tp, "dp": dp, "attn_cp": cp, "dp_rank": dp_rank, "tokens": tokens}


def _sized(sglang: SGLangDriver, tiny_models: dict[str, str], case: dict[str, Any]) -> dict[str, Any]:
    (answer,) = sglang.ask([{"op": "dp_buffer", "model_path": tiny_models[case["family"]],
                             "strategy": "zigzag", **{k: v for k, v in case.items() if k != "family"}}])
    assert answer["ok"], answer
    return answer


@pytest.mark.parametrize("extend", [True, False], ids=["extend", "decode"])
@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3-moe"])
@HYPOTHESIS
@given(drawn=degrees_and_tokens())
def test_every_buffer_sglang_sizes_reads_back_and_passes_pcp_rows(
        sglang: SGLangDriver, tiny_models: dict[str, str], family: str, extend: bool,
        drawn: dict[str, Any]) -> None:
    case = {"family": family, "extend": extend, **drawn}
    answer = _sized(sglang, tiny_models, case)
    fb = SimpleNamespace(**{k: answer[k] for k in ("original_global_num_tokens_cpu", "global_num_tokens_cpu",
                                                    "global_dp_buffer_len")},
                         dp_padding_mode=SimpleNamespace(name=answer["dp_padding_mode"]))
    buffer = dp_buffer(fb)
    assert buffer is not None and buffer.tokens == case["tokens"]
    assert buffer.mode == answer["dp_padding_mode"].lower()
    rank = RankId(world=0, attn_dp=case["dp_rank"])
    step = Step(rank=rank, step=1, mode="extend", batch_size=1, rows_in=case["tokens"][case["dp_rank"]],
                dp_buffer=buffer)
    t = _Tally()
    t.seen["dp_buffer"] = 0
    own = _dp_buffer(step, "step 1", PcpRowsParams(cp=max(case["attn_cp"], 2), strategy="zigzag",
                                                   attn_dp=case["dp"]), t)
    assert t.findings == [], (case, answer)
    # the batch as this rank's forward ran it: SGLang pads the rank's inputs to its slice
    assert own == answer["rows"]
    # attention over that padded slice is the whole batch (dcp handoff, rows kv_owner) ...
    n = case["tokens"][case["dp_rank"]]
    assert attention_batch_rows(step, answer["rows"])[0] == n
    assert attention_batch_rows(step, answer["rows"] + 1)[0] != n
    # ... its dummy rows come after the real ones, and the positions the probe reads at the
    # forward's end are cut back to the real ones: what `_drop_dp_padding` cuts the KV write to
    assert answer["padded_positions"][:n] == list(range(n)) == answer["positions_after"]
    assert answer["padded_out_cache_loc"][:n] == list(range(n))
    draft = StepDraft(step=1, mode="extend", rids=["r"], batch_size=1, rows_in=n, kv_rows=answer["rows"],
                      kv_mask=[True] * answer["rows"], kv_slots=answer["padded_out_cache_loc"],
                      dp_buffer=buffer)
    _drop_dp_padding(draft, n, case["dp_rank"])
    assert (draft.kv_rows, len(draft.kv_mask or ()), draft.kv_slots) == (n, n, list(range(n)))
    COUNT[f"{case['family']} {'extend' if case['extend'] else 'decode'} {buffer.mode}"] += 1


def test_a_slice_cut_below_its_batch_is_failed_where_sglang_sized_it_whole(
        sglang: SGLangDriver, tiny_models: dict[str, str]) -> None:
    case = {"family": "llama", "tp": 4, "dp": 2, "attn_cp": 2, "dp_rank": 1, "tokens": [7, 3], "extend": True}
    answer = _sized(sglang, tiny_models, case)
    assert (answer["global_num_tokens_cpu"], answer["global_dp_buffer_len"]) == ([8, 4], 12)  # zigzag-aligned
    cut = SimpleNamespace(original_global_num_tokens_cpu=[7, 3], global_num_tokens_cpu=[8, 2],
                          global_dp_buffer_len=10, dp_padding_mode=SimpleNamespace(name="SUM_LEN"))
    step = Step(rank=RankId(world=2, attn_dp=1), step=1, mode="extend", batch_size=1, rows_in=3,
                dp_buffer=dp_buffer(cut))
    t = _Tally()
    t.seen["dp_buffer"] = 0
    _dp_buffer(step, "step 1", PcpRowsParams(cp=2, strategy="zigzag", attn_dp=2), t)
    assert t.findings == ["step 1: DP rank 1's slice of the attention-DP buffer holds 2 rows for its 3: rows "
                          "of its batch left out of the MLP"]
