"""Specification of cptest/contracts/pcp_rows.py: the statement in the language, the checker on
hand-built PCP2 zigzag Step records, and on SGLang's published PCP archives (schema v5: first-layer
rows, no MLP output rows); and of `rows split`'s MLP check under attention DP on the same records."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from cptest.checks import load_archive
from cptest.contracts.pcp_rows import PcpRowsParams, check, padded_len
from cptest.contracts.rows import RowsParams
from cptest.contracts.rows import check as check_rows
from cptest.errors import PlanError
from cptest.evidence import DpBuffer, Step, ranges_from
from cptest.lang import format_text, parse_text
from cptest.plan import plan
from cptest.testing.archives import make_plan, rid, server_plan, write_archive, zigzag_steps

ROOT = Path(__file__).resolve().parents[2]
R, R2 = rid(0), rid(1)
PROMPTS = {R: 8, R2: 12}
PCP = PcpRowsParams(cp=2, strategy="zigzag")
TEXT = """cptest 1
scenario t {
  engine reference
  model synthetic llama { layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 vocab 128 intermediate 128 }
  topology { gpus 2 tp 2 {cp} }
  workload { requests 8 concurrency 2 prompt_tokens 16 output_tokens 4 }
  expect { pcp rows   rows split zigzag }
}
"""


def _rank(world: int, prompts: dict[str, int] = PROMPTS, **update) -> Step:
    """CP rank `world` of 2 handing on right: its zigzag shard to attention, the whole batch gathered
    back to the MLP and out of it, the whole batch to the logits, K/V of every position written."""
    s = zigzag_steps(world, 2, prompts, ffn="gathered")
    batch = {r: [(0, n)] for r, n in prompts.items()}
    return s.model_copy(update={"ffn_out_rows": s.rows_in, "layers": 2, "logits_rows": s.rows_in,
                                "ffn_seq_positions": batch, "ffn_out_seq_positions": batch,
                                "kv_written": batch, **update})


def _check(ranks: dict[int, list[Step]], p: PcpRowsParams = PCP):
    """The verdict on an archive of these ranks' Step records, read back as `cptest check` reads it."""
    with tempfile.TemporaryDirectory() as d:
        write_archive(Path(d), make_plan(server_plan(world=2, attn_cp=2, cp_strategy="zigzag"), [p]),
                      ranks={"main": ranks}, runner={"main": []})
        return check(load_archive(Path(d)).evidence, p)


def _findings(v) -> list[str]:
    return v.figures["first"]


# ------------------------------------------------------------------------------------ language
def test_the_statement_parses_formats_back_after_rows() -> None:
    text = TEXT.replace("{cp}", "attn_cp 2 cp_strategy zigzag")
    out = format_text(text, "t.cps")
    assert "    rows split zigzag\n    pcp rows\n" in out
    assert parse_text(out, "t.cps") == parse_text(text, "t.cps")


def test_declaring_it_without_prefill_cp_is_a_plan_error(tmp_path: Path) -> None:
    scenario = tmp_path / "t.cps"
    scenario.write_text(TEXT.replace("{cp}", "dcp 2").replace("   rows split zigzag", ""))
    with pytest.raises(PlanError, match="pcp rows needs prefill context parallelism"):
        plan(parse_text(scenario.read_text(), str(scenario)))


def test_the_padded_length_is_sglangs_rule() -> None:
    assert padded_len([107, 106], 2, "zigzag") == 108  # aligned to 2 x cp
    assert padded_len([91, 92, 92, 91], 4, "zigzag") == 96
    assert padded_len([5, 4], 2, "interleave") == 6  # aligned to cp


# ------------------------------------------------------------------------------------ checker
def test_shards_in_order_the_mlp_gathered_and_the_logits_whole_pass() -> None:
    v = _check({0: [_rank(0)], 1: [_rank(1)]})
    assert v.status == "pass", v.reason
    assert v.figures["steps"] == 1 and v.figures["request_extends"] == 2
    assert v.figures["ffn_modes"] == {"gathered": 2} and v.figures["not_judged"] == ["padded_count"]


def test_sglangs_moe_gather_of_every_padded_shard_passes() -> None:
    # 213 tokens: shards of 107 and 106 rows, padded to 108 each; the MoE runs over 2 x 108 rows
    prompts = {R: 213}
    ranks = {w: [_rank(w, prompts, ffn_rows=216, ffn_out_rows=216, ffn_seq_positions=None,
                       ffn_out_seq_positions=None)] for w in (0, 1)}
    v = _check(ranks)
    assert v.status == "pass", v.reason
    assert v.figures["ffn_modes"] == {"gathered (padded)": 2} and v.figures["padding_rows"] == 1 + 2


def test_a_shard_out_of_the_strategys_order_fails() -> None:
    r0 = _rank(0)
    v = _check({0: [r0.model_copy(update={"seq_positions": {**r0.seq_positions, R: [(0, 4)]}})],
                1: [_rank(1)]})
    assert v.status == "fail"
    assert f"request {R}: rank 0 (CP rank 0) holds [0,4), zigzag over [0, 8) gives [0,2) [6,8)" in v.reason


def test_the_padded_count_the_probe_kept_is_judged_against_sglangs_rule() -> None:
    # 213 tokens: logical shards of 107 and 106, SGLang pads each to 108
    prompts = {R: 213}
    good = {w: [_rank(w, prompts, attn_rows_padded=108)] for w in (0, 1)}
    v = _check(good)
    assert v.status == "pass", v.reason
    bad = {0: [_rank(0, prompts, attn_rows_padded=110)], 1: [_rank(1, prompts, attn_rows_padded=108)]}
    v = _check(bad)
    assert v.status == "fail"
    assert "took 110 rows, neither its logical shard nor the padded length 108" in v.reason


def test_a_layer_attending_over_other_rows_fails() -> None:
    r1 = _rank(1)
    v = _check({0: [_rank(0)], 1: [r1.model_copy(update={"layer_rows": {"attn": [10, 9]}})]})
    assert v.status == "fail" and "layer 1's attention took 9 rows, layer 0's 10" in v.reason


def test_a_padding_row_reported_in_the_shard_fails() -> None:
    r0 = _rank(0)  # logical shard of 10 rows; a padding row shows up as position 20 of request 2
    padded = {**r0.seq_positions, R2: [(0, 3), (9, 12), (20, 21)]}
    v = _check({0: [r0.model_copy(update={"seq_positions": padded})], 1: [_rank(1)]})
    assert v.status == "fail"
    assert any("names 11 rows in its attention shard, its logical shard is 10" in f for f in _findings(v))


def test_kv_written_for_a_position_outside_the_batch_fails() -> None:
    v = _check({0: [_rank(0, kv_written={R: [(0, 9)], R2: [(0, 12)]})], 1: [_rank(1)]})
    assert v.status == "fail" and f"wrote K/V of request {R} outside its extend [0, 8)" in v.reason


def test_logits_of_the_shard_alone_fail() -> None:
    v = _check({0: [_rank(0)], 1: [_rank(1, logits_rows=10)]})
    assert v.status == "fail"
    assert "handed 10 rows to the logits processor, the batch has 20: the shards were not" in v.reason


def test_an_mlp_fed_neither_the_shard_nor_the_batch_fails() -> None:
    v = _check({0: [_rank(0, ffn_rows=19, ffn_out_rows=19)], 1: [_rank(1)]})
    assert v.status == "fail" and "fed 19 rows to the MLP: neither its shard (10/12)" in v.reason


def test_mlp_rows_named_as_the_shard_when_it_gathered_the_batch_fail() -> None:
    r0 = _rank(0)
    v = _check({0: [r0.model_copy(update={"ffn_seq_positions": r0.seq_positions})], 1: [_rank(1)]})
    assert v.status == "fail" and "the rows entering the MLP are not the batch's positions" in v.reason


def test_mlp_output_neither_its_rows_nor_cut_back_fails() -> None:
    v = _check({0: [_rank(0, ffn_out_rows=7)], 1: [_rank(1)]})
    assert v.status == "fail" and "7 rows left the MLP, which took 20" in v.reason


def test_no_split_step_is_unknown_not_pass() -> None:
    ranks = {w: [_rank(w, cp_active=False)] for w in (0, 1)}
    v = _check(ranks)
    assert v.status == "unknown" and "(1 extend step(s) not split): nothing to judge" in v.reason


def test_older_evidence_passes_what_it_records_and_names_the_rest() -> None:
    older = {"ffn_out_rows": None, "layers": None, "ffn_seq_positions": None, "ffn_out_seq_positions": None,
             "logits_rows": None}
    ranks = {w: [_rank(w, **older)] for w in (0, 1)}
    v = _check(ranks)
    assert v.status == "pass", v.reason
    assert v.figures["not_judged"] == ["layers", "padded_count", "ffn_identity", "ffn_out_rows",
                                       "logits_rows"]


def test_the_attention_dp_buffer_is_named_unjudged_when_attention_dp_is_declared() -> None:
    v = _check({0: [_rank(0)], 1: [_rank(1)]}, PcpRowsParams(cp=2, strategy="zigzag", attn_dp=2))
    assert v.status == "unknown"
    assert ("the attention-DP buffer is recorded in 0 of 2 rank-step(s), so attention DP 2 is not judged"
            in v.reason)
    assert v.figures["not_judged"] == ["padded_count", "dp_buffer"]


# ------------------------------------------------------------------- attention DP 2 x CP 2 on TP 4
DP_PROMPTS = ({R: 8, R2: 12}, {rid(2): 7})
"""The batch of each DP rank: DP rank 0 holds world ranks 0-1, DP rank 1 world ranks 2-3."""
DP = PcpRowsParams(cp=2, strategy="zigzag", attn_dp=2)


def _dp_rank(world: int, **update) -> Step:
    """World rank `world` of TP 4 = attention DP 2 x CP 2 handing on right: its zigzag shard to
    attention, the MLP fed the whole DP buffer (each DP rank's batch, padded by SGLang's sum_len
    rule to a multiple of 2 x cp), the logits its own batch."""
    dp = world // 2
    prompts = DP_PROMPTS[dp]
    tokens = [sum(p.values()) for p in DP_PROMPTS]
    padded = [-(-n // 4) * 4 for n in tokens]
    buffer = DpBuffer(tokens=tokens, padded=padded, rows=sum(padded), mode="sum_len")
    s = _rank(world % 2, prompts)
    rank = s.rank.model_copy(update={"world": world, "tp": world, "attn_dp": dp})
    return s.model_copy(update={"rank": rank,
                                "dp_buffer": buffer, "ffn_rows": buffer.rows, "ffn_out_rows": buffer.rows,
                                "ffn_seq_positions": None, "ffn_out_seq_positions": None, **update})


def _check_dp(ranks: dict[int, list[Step]]):
    with tempfile.TemporaryDirectory() as d:
        server = server_plan(world=4, attn_cp=2, attn_dp=2, cp_strategy="zigzag")
        write_archive(Path(d), make_plan(server, [DP]), ranks={"main": ranks}, runner={"main": []})
        return check(load_archive(Path(d)).evidence, DP)


def _buffer(world: int, **update) -> DpBuffer:
    return _dp_rank(world).dp_buffer.model_copy(update=update)


def test_each_dp_ranks_slice_in_a_buffer_fed_whole_to_the_mlp_passes() -> None:
    v = _check_dp({w: [_dp_rank(w)] for w in range(4)})
    assert v.status == "pass", v.reason
    assert v.figures["groups"] == 2 and v.figures["steps"] == 2
    assert v.figures["ffn_modes"] == {"the attention-DP buffer": 4}
    assert v.figures["dp_padding_rows"] == 4 * (20 - 20 + 8 - 7)  # each rank's buffer: 20 + 8 rows for 20 + 7
    assert "each DP rank's slice of the attention-DP buffer held its batch" in v.reason


def test_logits_of_the_batch_with_its_dp_padding_pass() -> None:
    v = _check_dp({w: [_dp_rank(w, logits_rows=8 if w >= 2 else 20)] for w in range(4)})
    assert v.status == "pass", v.reason


def test_a_dp_rank_telling_the_others_a_batch_it_does_not_run_fails() -> None:
    ranks = {w: [_dp_rank(w)] for w in range(4)}
    ranks[2] = [_dp_rank(2, dp_buffer=_buffer(2, tokens=[20, 9], padded=[20, 12], rows=32))]
    ranks[3] = [_dp_rank(3, dp_buffer=_buffer(3, tokens=[20, 9], padded=[20, 12], rows=32), ffn_rows=32,
                         ffn_out_rows=32)]
    v = _check_dp(ranks)
    assert v.status == "fail"
    assert "(DP rank 1) gave the other DP ranks 9 rows as its batch, its batch has 7" in v.reason


def test_a_slice_shorter_than_its_dp_ranks_batch_fails() -> None:
    short = _buffer(0, padded=[16, 8], rows=24)
    ranks = {w: [_dp_rank(w)] for w in range(4)}
    ranks.update({w: [_dp_rank(w, dp_buffer=short, ffn_rows=24, ffn_out_rows=24)] for w in (0, 1)})
    v = _check_dp(ranks)
    assert v.status == "fail"
    assert "DP rank 0's slice of the attention-DP buffer holds 16 rows for its 20" in v.reason


def test_a_buffer_that_is_not_its_slices_fails() -> None:
    ranks = {w: [_dp_rank(w)] for w in range(4)}
    ranks[1] = [_dp_rank(1, dp_buffer=_buffer(1, rows=40), ffn_rows=40, ffn_out_rows=40)]
    v = _check_dp(ranks)
    assert v.status == "fail"
    assert any("the attention-DP buffer has 40 rows, its slices [20, 8] add up to 28" in f
               for f in _findings(v))


def test_max_len_slices_of_different_lengths_fail() -> None:
    ranks = {w: [_dp_rank(w, dp_buffer=_buffer(w, mode="max_len"))] for w in range(4)}
    v = _check_dp(ranks)
    assert v.status == "fail" and "under max_len every DP slice is the longest" in v.reason
    even = _buffer(0, padded=[20, 20], rows=40, mode="max_len")
    v = _check_dp({w: [_dp_rank(w, dp_buffer=even, ffn_rows=40, ffn_out_rows=40)] for w in range(4)})
    assert v.status == "pass", v.reason


def test_cp_ranks_of_one_dp_rank_sizing_different_buffers_fail() -> None:
    ranks = {w: [_dp_rank(w)] for w in range(4)}
    ranks[1] = [_dp_rank(1, dp_buffer=_buffer(1, padded=[24, 8], rows=32), ffn_rows=32, ffn_out_rows=32)]
    v = _check_dp(ranks)
    assert v.status == "fail" and "sized different attention-DP buffers" in v.reason


def test_an_mlp_fed_neither_its_dp_ranks_rows_nor_the_buffer_fails() -> None:
    ranks = {w: [_dp_rank(w)] for w in range(4)}
    ranks[0] = [_dp_rank(0, ffn_rows=21, ffn_out_rows=21)]
    v = _check_dp(ranks)
    assert v.status == "fail" and "nor the attention-DP buffer (28)" in v.reason


def test_an_mlp_kept_within_its_dp_rank_passes_and_is_named() -> None:
    # a dense MLP run fully DP (SGLang's SCATTERED mode) takes its own DP rank's rows, not the buffer
    v = _check_dp({w: [_dp_rank(w, ffn_rows=20 if w < 2 else 7, ffn_out_rows=20 if w < 2 else 7)]
                   for w in range(4)})
    assert v.status == "pass", v.reason
    assert v.figures["ffn_modes"] == {"gathered": 4}


def test_a_dp_buffer_missing_on_one_rank_leaves_attention_dp_unknown() -> None:
    ranks = {w: [_dp_rank(w)] for w in range(4)}
    ranks[3] = [_dp_rank(3, dp_buffer=None, ffn_rows=None, ffn_out_rows=None)]
    v = _check_dp(ranks)
    assert v.status == "unknown"
    assert "the attention-DP buffer is recorded in 3 of 4 rank-step(s)" in v.reason


def test_the_reference_interleave_split_reads_its_first_rank_from_the_shards() -> None:
    # interleave over a batch of 3 + 4 tokens: packed i -> CP rank i % 2
    prompts = {R: 3, R2: 4}
    shards = [{R: ranges_from([0, 2]), R2: ranges_from([1, 3])},
              {R: ranges_from([1]), R2: ranges_from([0, 2])}]
    ranks = {w: [_rank(w, prompts, seq_positions=shards[w], attn_rows=4 - w)] for w in (0, 1)}
    v = _check(ranks, PcpRowsParams(cp=2, strategy="interleave"))
    assert v.status == "pass", v.reason


# ------------------------------------------------------------------------------------ archives
@pytest.mark.parametrize(("archive", "mode"), [
    ("results/pcp2_zigzag_qwen3_moe_kv1_fa3/20261203T175823Z-38c8d199", "gathered (padded)"),
    ("results/pcp2_zigzag_mla_fa3/20261203T180717Z-6e432fbe", "local"),
])
def test_sglangs_split_archives_pass_on_what_they_record(archive: str, mode: str) -> None:
    loaded = load_archive(ROOT / archive)
    v = check(loaded.evidence, PCP)
    assert v.status == "pass", v.reason
    assert set(v.figures["ffn_modes"]) == {mode} and v.figures["steps"] > 0
    assert "ffn_out_rows" in v.figures["not_judged"]  # schema v5 has no MLP output rows


def test_an_archive_where_sglang_never_split_is_unknown() -> None:
    loaded = load_archive(ROOT / "results/pcp2_zigzag_qwen3_moe_kv1/20261203T144442Z-e3303c21")
    v = check(loaded.evidence, PCP)
    assert v.status == "unknown" and "nothing to judge" in v.reason


def _check_rows_dp(ranks: dict[int, list[Step]]):
    """`rows split zigzag ffn gathered` on the attention-DP ranks' records."""
    p = RowsParams(mode="pcp_split", cp=2, strategy="zigzag", ffn="gathered")
    with tempfile.TemporaryDirectory() as d:
        server = server_plan(world=4, attn_cp=2, attn_dp=2, cp_strategy="zigzag")
        write_archive(Path(d), make_plan(server, [p]), ranks={"main": ranks}, runner={"main": []})
        return check_rows(load_archive(Path(d)).evidence, p)


def test_rows_judges_a_gathered_mlp_under_attention_dp_by_its_slice_of_the_buffer() -> None:
    v = _check_rows_dp({w: [_dp_rank(w)] for w in range(4)})
    assert v.status == "pass", v.reason
    ranks = {w: [_dp_rank(w)] for w in range(4)}
    # DP rank 1's slice holds only its CP shard: the batch was not gathered back before the MLP
    ranks[3] = [_dp_rank(3, dp_buffer=_buffer(3, tokens=[20, 3], padded=[20, 4], rows=24), ffn_rows=24)]
    v = _check_rows_dp(ranks)
    assert v.status == "fail"
    assert "rank 3 fed the attention-DP buffer (24 rows), its DP rank's slice 3 rows to the MLP" in v.reason
    assert "gathered FFN means 7" in v.reason


def test_shards_whose_rows_were_not_read_leave_the_order_unjudged_not_failed() -> None:
    blind = {w: [_rank(w).model_copy(update={"seq_positions": {}})] for w in (0, 1)}
    v = _check(blind)
    assert v.status == "unknown" and "the shards' order is not judged" in v.reason, v.reason
    # a second step with its rows read is judged, and the first is listed as not judged
    read = {w: _rank(w).model_copy(update={"step": 2}) for w in (0, 1)}
    v = _check({w: [blind[w][0], read[w]] for w in (0, 1)})
    assert v.status == "pass" and "identity" in v.figures["not_judged"], v.reason
    # a wrong order in the read step still fails
    swapped = {w: read[1 - w].model_copy(update={"rank": read[w].rank}) for w in (0, 1)}
    v = _check({w: [blind[w][0], swapped[w]] for w in (0, 1)})
    assert v.status == "fail", v.reason


# --------------------------------------------------------------- a split the probe does not see
def test_a_split_the_probe_cannot_see_leaves_both_row_contracts_unknown() -> None:
    # DSA's round robin on its CP-v1 path leaves the CP metadata empty (admission's
    # pcp_cp_v1_unobserved): the probe's records read "not split", which must not pass for a
    # fallback the engine did not take.
    why = "the split runs where the probe does not look: DSA's round robin"
    rows_p = RowsParams(mode="pcp_split", cp=2, strategy="interleave", split_unobserved=why)
    pcp_p = PcpRowsParams(cp=2, strategy="interleave", split_unobserved=why)
    unsplit = {w: [_rank(w).model_copy(update={"cp_active": False})] for w in (0, 1)}
    assert check_rows(_evidence(unsplit, rows_p), rows_p.model_copy(update={"split_unobserved": None})
                      ).status == "fail"  # what the evidence alone says: a fallback
    for p, judge in ((rows_p, check_rows), (pcp_p, check)):
        v = judge(_evidence(unsplit, p), p)
        assert v.status == "unknown" and "runs where the probe does not look" in v.reason, v.reason


# ------------------------------------------------------------------------- a model's CP-v1 split
V1_PROMPTS = {R: 9, R2: 12}
"""Zigzag shards of 11 and 10 rows: CP v1's MoE gather pads to 11 (22 rows), CP v2's alignment to 12."""


def _v1_rank(world: int, **update) -> Step:
    s = _rank(world, V1_PROMPTS)
    return s.model_copy(update={"attn_rows_padded": s.attn_rows, "ffn_rows": 22, "ffn_out_rows": s.attn_rows,
                                "ffn_out_seq_positions": s.seq_positions, **update})


def test_a_cp_v1_launch_is_planned_and_judged_with_its_own_padding() -> None:
    path = ROOT / "scenarios" / "qualification" / "pcp2_zigzag_qwen3_moe_kv1.cps"
    s = parse_text(path.read_text(), str(path))
    assert not any(getattr(e, "cp_v1", False) for e in plan(s).expectations)  # CP v2 by the class default
    off = s.model_copy(update={"serve": s.serve.model_copy(update={"env": {"SGLANG_ENABLE_CP_V2": "0"}})})
    params = {e.kind: e for e in plan(off).expectations}
    pcp_p = params["pcp_rows"]
    assert isinstance(pcp_p, PcpRowsParams) and pcp_p.cp_v1 and pcp_p.split_unobserved is None
    assert params["rows"].split_unobserved is None  # type: ignore[union-attr]
    assert padded_len([11, 10], 2, "zigzag", cp_v1=True) == 11 and padded_len([11, 10], 2, "zigzag") == 12

    v1 = {w: [_v1_rank(w)] for w in (0, 1)}
    v = _check(v1, pcp_p)
    assert v.status == "pass", v.reason
    assert v.figures["ffn_modes"] == {"gathered (padded)": 2}
    assert _check(v1).status == "fail"  # the same rows judged by CP v2's alignment: 22 is no 2 x 12
    v2_padded = {w: [_v1_rank(w, attn_rows_padded=12)] for w in (0, 1)}  # attention ran padded rows
    v = _check(v2_padded, pcp_p)
    assert v.status == "fail" and "its attention took 12 rows" in v.reason, v.reason


def _evidence(ranks: dict[int, list[Step]], p):
    with tempfile.TemporaryDirectory() as d:
        write_archive(Path(d), make_plan(server_plan(world=2, attn_cp=2, cp_strategy="zigzag"), [p]),
                      ranks={"main": ranks}, runner={"main": []})
        return load_archive(Path(d)).evidence
