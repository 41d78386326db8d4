"""Specification of cptest/contracts/dcp_handoff.py: the statement in the language, the checker on
hand-built DCP2 Step records (rows handed on, KV rows written then read), and on SGLang's published
DCP2 archive, which records neither every layer nor the rows read."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from cptest.checks import load_archive
from cptest.contracts.dcp_handoff import DcpHandoffParams, check
from cptest.errors import PlanError
from cptest.evidence import DpBuffer, Step, ranges_from, slot_runs_from
from cptest.lang import format_text, parse_text
from cptest.plan import plan
from cptest.testing.archives import make_plan, rank_id, rid, server_plan, write_archive
from cptest.topology import dcp_local_positions

ROOT = Path(__file__).resolve().parents[2]
R, R2 = rid(0), rid(1)
TEXT = """cptest 1
scenario t {
  engine reference
  model synthetic llama { layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 vocab 128 intermediate 128 }
  topology { gpus 2 tp 2 {dcp} }
  workload { requests 8 concurrency 2 prompt_tokens 16 output_tokens 4 }
  expect { dcp handoff   rows kv_owner position % 2 }
}
"""


def _rank(d: int, *, prompt: int = 5, decodes: int = 3, base: int = 10) -> list[Step]:
    """DCP rank `d` of 2 running one request right: an extend of `prompt` tokens, then `decodes`
    decode steps, its own positions in consecutive rows from `base`, each decode reading them all."""
    rank = rank_id(d, dcp=2)
    pairs = [(p, base + i) for i, p in enumerate(range(d, prompt, 2))]
    steps = [Step(rank=rank, step=0, mode="extend", batch_size=1, rows_in=prompt, attn_rows=prompt,
                  ffn_rows=prompt, ffn_out_rows=prompt, layers=2, seq_positions={R: [(0, prompt)]},
                  kv_written={R: ranges_from(p for p, _ in pairs)}, kv_slots={R: slot_runs_from(pairs)},
                  extend_lens=[prompt], prefix_lens=[0])]
    for k in range(decodes):
        p = prompt + k
        mine = p % 2 == d
        if mine:
            pairs.append((p, base + len(pairs)))
        steps.append(Step(rank=rank, step=1 + k, mode="decode", batch_size=1, rows_in=1, attn_rows=1,
                          ffn_rows=1, ffn_out_rows=1, layers=2, seq_positions={R: [(p, p + 1)]},
                          kv_written={R: [(p, p + 1)]} if mine else {},
                          kv_slots={R: slot_runs_from(pairs[-1:])} if mine else {},
                          kv_read={R: ranges_from(row for _, row in pairs)}))
    return steps


def _check(ranks: dict[int, list[Step]]):
    """The verdict on an archive of these ranks' Step records, read back as `cptest check` reads it."""
    with tempfile.TemporaryDirectory() as d:
        write_archive(Path(d), make_plan(server_plan(world=2, dcp=2), [DcpHandoffParams(dcp=2)]),
                      ranks={"main": ranks}, runner={"main": []})
        return check(load_archive(Path(d)).evidence, DcpHandoffParams(dcp=2))


def _edit(step: Step, **update) -> Step:
    return step.model_copy(update=update)


# ------------------------------------------------------------------------------------ language
def test_the_statement_parses_formats_back_after_rows() -> None:
    text = TEXT.replace("{dcp}", "dcp 2")
    out = format_text(text, "t.cps")
    assert "    rows kv_owner position % 2\n    dcp handoff\n" in out
    assert parse_text(out, "t.cps") == parse_text(text, "t.cps")


def test_declaring_it_without_dcp_is_a_plan_error(tmp_path: Path) -> None:
    scenario = tmp_path / "t.cps"
    scenario.write_text(TEXT.replace("{dcp}", "").replace("   rows kv_owner position % 2", ""))
    with pytest.raises(PlanError, match="dcp handoff needs decode context parallelism"):
        plan(parse_text(scenario.read_text(), str(scenario)))


def test_a_ranks_share_of_a_request_is_sglangs_get_dcp_lens() -> None:
    # the contract reads a rank's owned positions from topology.dcp_local_positions
    assert [len(dcp_local_positions(7, d, 2)) for d in (0, 1)] == [4, 3]
    assert [len(dcp_local_positions(8, d, 4)) for d in range(4)] == [2, 2, 2, 2]


# ------------------------------------------------------------------------------------ checker
def test_whole_rows_on_every_rank_and_reads_of_exactly_the_owned_rows_pass() -> None:
    v = _check({0: _rank(0), 1: _rank(1)})
    assert v.status == "pass", v.reason
    assert v.figures["steps_compared"] == 4 and v.figures["layers_compared"] == 8
    assert v.figures["reads_judged"] == 6 and v.figures["rows_read"] == (3 + 4 + 4) + (3 + 3 + 4)


def test_a_read_row_holding_another_ranks_position_fails() -> None:
    r0 = _rank(0)
    # rank 0 wrote position 1 (DCP rank 1's) into row 99 and its next decode reads that row too
    r0[0] = _edit(r0[0], kv_written={R: [(0, 3), (4, 5)]}, kv_slots={R: [(0, 1, 10), (1, 2, 99), (2, 5, 11)]})
    r0[1] = _edit(r0[1], kv_read={R: [(10, 13), (99, 100)]})
    v = _check({0: r0, 1: _rank(1)})
    assert v.status == "fail"
    assert "row 99 holds position 1, of DCP rank 1's share" in v.reason


def test_a_row_overwritten_with_another_position_fails_as_an_owned_position_not_read() -> None:
    r0 = _rank(0)
    # the decode of position 6 overwrites row 10 (position 0's): position 0 is no longer held
    r0[2] = _edit(r0[2], kv_slots={R: [(6, 7, 10)]}, kv_read={R: [(10, 13)]})
    v = _check({0: r0, 1: _rank(1)})
    assert v.status == "fail"
    assert "position 0 was not read" in v.reason and "the rank owns 4 positions of 7" in v.reason


def test_an_owned_row_missing_from_the_read_fails() -> None:
    r1 = _rank(1)
    r1[-1] = _edit(r1[-1], kv_read={R: [(10, 12)]})  # position 5's row left out
    v = _check({0: _rank(0), 1: r1})
    assert v.status == "fail" and "position 5 was not read" in v.reason


def test_a_layer_with_other_rows_fails() -> None:
    r0 = _rank(0)
    r0[1] = _edit(r0[1], layer_rows={"ffn": [1, 0]})
    v = _check({0: r0, 1: _rank(1)})
    assert v.status == "fail" and "layer 1 ran 0 ffn rows of the batch's 1" in v.reason


def test_ranks_handing_on_other_positions_fail() -> None:
    r1 = _rank(1)
    r1[0] = _edit(r1[0], seq_positions={R: [(0, 4)]})
    v = _check({0: _rank(0), 1: r1})
    assert v.status == "fail" and "rank 1 computed attention for other requests or positions" in v.reason


def test_an_mlp_fed_a_split_of_the_rows_fails() -> None:
    r0 = _rank(0)
    r0[0] = _edit(r0[0], ffn_rows=3)
    v = _check({0: r0, 1: _rank(1)})
    assert v.status == "fail" and "rank 0 handed 3 rows of its batch's 5 to the MLP" in v.reason


def _in_dp_buffer(steps: list[Step], other: int) -> list[Step]:
    """These steps of DP rank 0 under attention DP 2, another DP rank bringing `other` rows a step:
    the MLP runs over the buffer of both DP ranks' rows, in every layer."""
    out = []
    for s in steps:
        rows = s.rows_in + other
        out.append(_edit(s, ffn_rows=rows, ffn_out_rows=rows, layer_rows={"attn": [s.rows_in] * 2,
                                                                          "ffn": [rows] * 2},
                         dp_buffer=DpBuffer(tokens=[s.rows_in, other], padded=[s.rows_in, other], rows=rows,
                                            mode="sum_len")))
    return out


def test_an_mlp_over_the_attention_dp_buffer_is_judged_by_its_dp_ranks_slice() -> None:
    v = _check({0: _in_dp_buffer(_rank(0), 7), 1: _in_dp_buffer(_rank(1), 7)})
    assert v.status == "pass", v.reason
    r0 = _in_dp_buffer(_rank(0), 7)
    # The buffer says this DP rank brought 4 rows of its batch of 5: a row split off before the MLP.
    r0[0] = _edit(r0[0], dp_buffer=DpBuffer(tokens=[4, 8], padded=[4, 8], rows=12, mode="sum_len"))
    v = _check({0: r0, 1: _in_dp_buffer(_rank(1), 7)})
    assert v.status == "fail" and "its DP rank's slice 4 rows of its batch's 5 to the MLP" in v.reason
    r0 = _in_dp_buffer(_rank(0), 7)
    r0[0] = _edit(r0[0], ffn_rows=9)  # neither the batch nor the buffer
    v = _check({0: r0, 1: _in_dp_buffer(_rank(1), 7)})
    assert v.status == "fail" and "rank 0 handed 9 rows of its batch's 5 to the MLP" in v.reason


def _dp_padded(steps: list[Step], dp_rank: int, other: int) -> list[Step]:
    """These steps on DP rank `dp_rank` of attention DP 2 with attention TP 2 (the other DP rank
    bringing `other` rows a step): SGLang pads each DP rank's batch to a multiple of 2 before the
    forward, so attention takes the padded slice and the MLP the buffer of both slices."""
    out = []
    for s in steps:
        tokens = [s.rows_in, other] if dp_rank == 0 else [other, s.rows_in]
        padded = [n + n % 2 for n in tokens]
        buffer = DpBuffer(tokens=tokens, padded=padded, rows=sum(padded), mode="sum_len")
        mine = padded[dp_rank]
        out.append(_edit(s, rank=s.rank.model_copy(update={"attn_dp": dp_rank}), attn_rows=mine,
                         ffn_rows=buffer.rows, ffn_out_rows=buffer.rows, dp_buffer=buffer,
                         layer_rows={"attn": [mine] * 2, "ffn": [buffer.rows] * 2}))
    return out


def _check_dp(ranks: dict[int, list[Step]]):
    """The verdict on an archive of TP 4 with attention DP 2 and DCP 2 (DCP groups [0, 1], [2, 3])."""
    with tempfile.TemporaryDirectory() as d:
        main = server_plan(world=4, tp=4, dcp=2, attn_dp=2)
        write_archive(Path(d), make_plan(main, [DcpHandoffParams(dcp=2)]), ranks={"main": ranks},
                      runner={"main": []})
        return check(load_archive(Path(d)).evidence, DcpHandoffParams(dcp=2))


def _dp_ranks(**edits) -> dict[int, list[Step]]:
    ranks = {}
    for world in range(4):
        d, dp = world % 2, world // 2
        steps = [_edit(s, rank=s.rank.model_copy(update={"world": world, "tp": world}))
                 for s in _rank(d, prompt=5, decodes=3)]
        ranks[world] = _dp_padded(steps, dp, other=3)
    for world, (i, update) in edits.items():
        ranks[int(world[1:])][i] = _edit(ranks[int(world[1:])][i], **update)
    return ranks


def test_attention_over_the_dp_padded_slice_is_the_whole_batch() -> None:
    v = _check_dp(_dp_ranks())
    assert v.status == "pass", v.reason
    assert v.figures["steps_compared"] == 8 and "rank_steps_dp_buffer_unrecorded" not in v.figures
    # a decode step's attention took 4 rows: not its DP rank's slice of 2 (1 row and 1 padding)
    v = _check_dp(_dp_ranks(r0=(1, {"attn_rows": 4})))
    assert v.status == "fail" and "rank 0 handed 4 rows of its batch's 1 to attention" in v.reason
    # a slice of the right size whose real rows are not the batch's: split queries, not padding
    bad = DpBuffer(tokens=[0, 3], padded=[2, 4], rows=6, mode="sum_len")
    v = _check_dp(_dp_ranks(r0=(1, {"dp_buffer": bad, "ffn_rows": 6, "ffn_out_rows": 6,
                                    "layer_rows": {"attn": [2, 2], "ffn": [6, 6]}})))
    assert v.status == "fail" and "rank 0 handed 2 rows of its batch's 1 to attention" in v.reason


def test_padding_without_a_recorded_dp_buffer_is_not_judged_not_failed() -> None:
    # an archive from before decode steps carried the buffer: their extra rows cannot be told apart
    ranks = _dp_ranks()
    for steps in ranks.values():
        steps[1:] = [_edit(s, dp_buffer=None) for s in steps[1:]]
    v = _check_dp(ranks)
    assert v.status == "pass", v.reason
    assert v.figures["steps_compared"] == 2 and v.figures["rank_steps_dp_buffer_unrecorded"] == 12
    assert "12 rank-step(s) under attention DP not judged" in v.reason
    # without attention DP the same extra rows are split queries
    r0 = _rank(0)
    r0[1] = _edit(r0[1], attn_rows=2)
    v = _check({0: r0, 1: _rank(1)})
    assert v.status == "fail" and "rank 0 handed 2 rows of its batch's 1 to attention" in v.reason


def test_a_prefix_written_by_an_earlier_request_counts_by_position() -> None:
    r0 = _rank(0, decodes=1)
    # a second request shares the first's 5-token prefix: its decode at position 5 reads rows 10-12
    r0.append(Step(rank=rank_id(0, dcp=2), step=2, mode="decode", batch_size=1, rows_in=1, attn_rows=1,
                   ffn_rows=1, ffn_out_rows=1, layers=2, seq_positions={R2: [(5, 6)]},
                   kv_read={R2: [(10, 13)]}))
    r1 = _rank(1, decodes=1)
    r1.append(Step(rank=rank_id(1, dcp=2), step=2, mode="decode", batch_size=1, rows_in=1, attn_rows=1,
                   ffn_rows=1, ffn_out_rows=1, layers=2, seq_positions={R2: [(5, 6)]},
                   kv_written={R2: [(5, 6)]}, kv_slots={R2: [(5, 6, 20)]},
                   kv_read={R2: [(10, 12), (20, 21)]}))
    v = _check({0: r0, 1: r1})
    assert v.status == "pass", v.reason
    assert v.figures["rows_from_another_request"] == 3 + 2


def test_a_row_written_in_a_replay_leaves_the_read_unknown_not_failed() -> None:
    r0 = _rank(0)
    # the decode of position 6 ran as a CUDA-graph replay: its write (and row) is unobserved
    r0[2] = _edit(r0[2], graph_rows=8, kv_slots={}, kv_written={}, kv_read={})
    v = _check({0: r0, 1: _rank(1)})
    assert v.status == "pass", v.reason
    assert v.figures["reads_unknown"] == {"read(s) of a row whose last write was not observed": 1}
    assert "not judged: 1 read(s) of a row whose last write was not observed" in v.reason


def test_evidence_without_reads_or_every_layer_is_unknown_with_what_was_judged() -> None:
    def older(steps: list[Step]) -> list[Step]:
        return [_edit(s, kv_slots={}, kv_read={}, layers=None, ffn_out_rows=None) for s in steps]
    v = _check({0: older(_rank(0)), 1: older(_rank(1))})
    assert v.status == "unknown"
    assert v.reason.startswith("4 step(s) (first layer only): every DCP rank handed the whole batch")
    assert "no decode step's KV read could be judged" in v.reason


# ------------------------------------------------------------------------------------ archives
def test_sglangs_eager_dcp2_archive_passes_its_rows_and_leaves_the_reads_unknown() -> None:
    # Schema v5: first-layer rows and identity only; no MLP output rows, no KV slots, no reads.
    loaded = load_archive(ROOT / "results/dcp2_llama_kv1_eager/20261203T081109Z-3938cb53")
    v = check(loaded.evidence, DcpHandoffParams(dcp=2))
    assert v.status == "unknown", v.reason
    assert v.figures["findings"] == 0 and v.figures["steps_compared"] == 156
    assert v.figures["reads_judged"] == 0
