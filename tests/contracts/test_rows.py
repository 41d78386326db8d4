"""Specifications of cptest/contracts/rows.py: hand-written Step evidence in, Verdict out."""

from __future__ import annotations

from pathlib import Path

from cptest.checks import check_loaded, load_archive
from cptest.contracts import Expectation, RowsParams
from cptest.evidence import DpBuffer, Geometry, ProbeNote, RequestResult, Step
from cptest.request_ids import scoring_rid
from cptest.testing.archives import (
    dcp_steps,
    make_plan,
    rank_id,
    rid,
    server_plan,
    write_archive,
    zigzag_steps,
)

DCP = RowsParams(mode="dcp_owner", dcp=2, source="s.cps:9:5")
PROMPTS = {rid(0): 5, rid(1): 8}


def _dcp_archive(tmp_path: Path, rank_records: dict[int, list], expect: Expectation = DCP, runner=None):
    plan = make_plan(server_plan(world=2, dcp=2), [expect], requests=2)
    write_archive(tmp_path, plan, ranks={"main": rank_records}, runner={"main": runner or []})
    return check_loaded(load_archive(tmp_path)).verdicts[0]


def test_dcp_positions_written_once_by_their_owner_pass(tmp_path: Path) -> None:
    v = _dcp_archive(tmp_path, {w: list(dcp_steps(w, 2, PROMPTS, decode_steps=3)) for w in (0, 1)})
    assert v.status == "pass", v.reason
    assert v.figures["positions"] == (5 + 3) + (8 + 3)
    assert v.figures["requests"] == 2
    assert v.source == "s.cps:9:5"


def test_dcp_position_written_by_two_ranks_fails_with_the_position(tmp_path: Path) -> None:
    r0 = list(dcp_steps(0, 2, PROMPTS, decode_steps=0))
    r1 = list(dcp_steps(1, 2, PROMPTS, decode_steps=0))
    # rank 1 also writes position 4 of request 0 (owner is rank 0): a double write and a wrong owner
    r1.append(
        Step(
            rank=rank_id(1, dcp=2),
            step=1,
            mode="decode",
            batch_size=1,
            rows_in=1,
            kv_written={rid(0): [(4, 5)]},
        )
    )
    v = _dcp_archive(tmp_path, {0: r0, 1: r1})
    assert v.status == "fail"
    assert v.figures["first"]["position"] == 4
    assert v.figures["first"]["rid"] == rid(0)
    assert "position 4" in v.reason
    assert v.figures["violations"] == 2


def test_dcp_position_written_by_no_rank_fails_as_a_hole(tmp_path: Path) -> None:
    r0 = list(dcp_steps(0, 2, {rid(0): 8}, decode_steps=0))
    r1 = [
        s.model_copy(update={"kv_written": {rid(0): [(1, 2), (5, 6), (7, 8)]}})
        for s in dcp_steps(1, 2, {rid(0): 8}, decode_steps=0)
    ]  # position 3 missing
    v = _dcp_archive(tmp_path, {0: r0, 1: r1})
    assert (v.status, v.figures["first"]["position"]) == ("fail", 3)
    assert "[3, 4) written by no rank" in v.reason


def test_a_write_the_probe_could_not_map_is_unobserved_only_where_its_note_says_so(tmp_path: Path) -> None:
    r0 = list(dcp_steps(0, 2, {rid(0): 8}, decode_steps=0))
    # rank 1's extend names no write for the request: on SGLang's probe, a write it could not map
    r1 = [s.model_copy(update={"kv_written": {}, "seq_positions": {rid(0): [(0, 8)]}})
          for s in dcp_steps(1, 2, {rid(0): 8}, decode_steps=0)]
    v = _dcp_archive(tmp_path / "a", {0: r0, 1: r1})
    assert v.status == "fail" and "[1, 2) written by no rank" in v.reason  # no note: a hole
    note = ProbeNote(rank=rank_id(1, dcp=2), level="warning",
                     message="step 0: KV write of 9 rows (mask of 9) does not match the batch's 8 rows; "
                     "kv_written left empty")
    v = _dcp_archive(tmp_path / "b", {0: r0, 1: [note, *r1]})
    assert v.status == "unknown", v.reason
    assert "4 more position(s) in 1 rank-step(s) were not seen written" in v.reason
    assert v.figures["positions_write_unmapped"] == 4


def test_dcp_hole_with_truncated_rank_evidence_is_unknown(tmp_path: Path) -> None:
    r0 = list(dcp_steps(0, 2, {rid(0): 8}, decode_steps=0))
    r1 = [
        s.model_copy(update={"kv_written": {rid(0): [(1, 2), (5, 6), (7, 8)]}})
        for s in dcp_steps(1, 2, {rid(0): 8}, decode_steps=0)
    ]
    v = _dcp_archive(tmp_path, {0: r0, 1: [*r1, '{"v": 1, "kind": "st']})
    assert v.status == "unknown"
    assert v.figures["truncated_ranks"] == [1]


def test_dcp_request_shorter_than_its_output_fails(tmp_path: Path) -> None:
    ranks = {w: list(dcp_steps(w, 2, {rid(0): 5}, decode_steps=2)) for w in (0, 1)}  # positions 0..6
    done = RequestResult(
        index=0, prompt_len=5, max_new_tokens=8, prompt_sha256="x", status="ok", output_ids=[1, 2, 3, 4, 5]
    )  # needs positions 0..8 written
    v = _dcp_archive(tmp_path, ranks, runner=[done])
    assert v.status == "fail"
    assert "written up to position 7" in v.reason


def test_dcp_queries_split_over_ranks_fails(tmp_path: Path) -> None:
    r0 = [s.model_copy(update={"attn_rows": 6}) for s in dcp_steps(0, 2, PROMPTS, decode_steps=0)]
    r1 = list(dcp_steps(1, 2, PROMPTS, decode_steps=0))
    v = _dcp_archive(tmp_path, {0: r0, 1: r1})
    assert v.status == "fail" and "must not split queries" in v.reason


def _dp_padded(steps, tokens_other: int = 3) -> list[Step]:
    """DP rank 0's steps under attention DP 2 with attention TP 2: attention took the batch padded
    to an even count (SGLang's alignment to the attention TP size before the forward)."""
    out = []
    for s in steps:
        tokens = [s.rows_in, tokens_other]
        padded = [n + n % 2 for n in tokens]
        out.append(s.model_copy(update={
            "attn_rows": padded[0],
            "dp_buffer": DpBuffer(tokens=tokens, padded=padded, rows=sum(padded), mode="sum_len")}))
    return out


def _dp_archive(tmp_path: Path, rank_records: dict[int, list]):
    geo = Geometry(rank=rank_id(0, dcp=2), sizes={"tp": 4, "dcp": 2, "attn_dp": 2, "attn_tp": 2},
                   groups={"dcp": [0, 1]})
    ranks = {w: [geo.model_copy(update={"rank": rank_id(w, dcp=2)}), *steps]
             for w, steps in rank_records.items()}
    return _dcp_archive(tmp_path, ranks)


def test_dcp_queries_padded_by_attention_dp_are_not_split(tmp_path: Path) -> None:
    prompts = {rid(0): 5, rid(1): 8}  # 13 rows in the extend: 14 with the padding, 2 a decode step
    steps = {w: _dp_padded(dcp_steps(w, 2, prompts, decode_steps=2)) for w in (0, 1)}
    assert {s.attn_rows - s.rows_in for s in steps[0]} == {1, 0}
    v = _dp_archive(tmp_path / "a", steps)
    assert v.status == "pass", v.reason
    # one row beyond the DP rank's padded slice: split queries again
    steps[0][0] = steps[0][0].model_copy(update={"attn_rows": steps[0][0].attn_rows + 2})
    v = _dp_archive(tmp_path / "b", steps)
    assert v.status == "fail" and "must not split queries" in v.reason


def test_dcp_queries_padded_without_a_recorded_buffer_are_not_judged(tmp_path: Path) -> None:
    steps = {w: [s.model_copy(update={"dp_buffer": None})
                 for s in _dp_padded(dcp_steps(w, 2, {rid(0): 5}, decode_steps=2))] for w in (0, 1)}
    v = _dp_archive(tmp_path, steps)
    assert v.status == "pass", v.reason
    assert v.figures["rank_steps_dp_buffer_unrecorded"] == 6  # the extend (5 + 1) and 2 decodes (1 + 1)
    assert "queries not judged in 6 rank-step(s) under attention DP" in v.reason


def test_missing_rank_evidence_is_unknown(tmp_path: Path) -> None:
    v = _dcp_archive(tmp_path, {0: list(dcp_steps(0, 2, PROMPTS, decode_steps=1))})
    assert v.status == "unknown"
    assert v.reason.startswith("no evidence from rank 1")
    assert v.figures == {"missing_ranks": [1]}


def test_no_step_records_is_unknown_not_pass(tmp_path: Path) -> None:
    geo = {
        w: [Geometry(rank=rank_id(w, dcp=2), sizes={"tp": 2, "dcp": 2}, groups={"dcp": [0, 1]})]
        for w in (0, 1)
    }
    v = _dcp_archive(tmp_path, geo)
    assert v.status == "unknown" and "no Step records" in v.reason


def test_dcp_groups_come_from_probe_geometry_when_present(tmp_path: Path) -> None:
    geo = [
        Geometry(rank=rank_id(w, dcp=2), sizes={"tp": 2, "dcp": 2}, groups={"dcp": [0, 1]}) for w in (0, 1)
    ]
    v = _dcp_archive(tmp_path, {w: [geo[w], *dcp_steps(w, 2, PROMPTS, decode_steps=1)] for w in (0, 1)})
    assert (v.status, v.figures["groups_from"]) == ("pass", "probe")


PCP = RowsParams(mode="pcp_split", cp=2, strategy="zigzag", ffn="local")


def _pcp(tmp_path: Path, steps: dict[int, list[Step]], expect: Expectation = PCP):
    plan = make_plan(server_plan(world=2, attn_cp=2, cp_strategy="zigzag"), [expect])
    write_archive(tmp_path, plan, ranks={"main": steps})
    return check_loaded(load_archive(tmp_path)).verdicts[0]


def test_zigzag_split_rows_pass(tmp_path: Path) -> None:
    prompts = {rid(0): 10, rid(1): 7}
    v = _pcp(tmp_path, {w: [zigzag_steps(w, 2, prompts)] for w in (0, 1)})
    assert v.status == "pass", v.reason
    assert (v.figures["rows"], v.figures["request_extends"], v.figures["ffn_checked"]) == (17, 2, 2)


def test_zigzag_rows_in_the_wrong_blocks_fail_naming_rank_and_request(tmp_path: Path) -> None:
    prompts = {rid(0): 8}
    r0 = zigzag_steps(0, 2, prompts).model_copy(update={"seq_positions": {rid(0): [(0, 4)]}})
    r1 = zigzag_steps(1, 2, prompts).model_copy(update={"seq_positions": {rid(0): [(4, 8)]}})
    v = _pcp(tmp_path, {0: [r0], 1: [r1]})
    assert v.status == "fail"
    assert v.figures["first"]["rank"] == 0
    assert v.figures["first"]["expected"] == "[0,2) [6,8)"


def test_pcp_rows_computed_twice_fail(tmp_path: Path) -> None:
    prompts = {rid(0): 8}
    r1 = zigzag_steps(1, 2, prompts).model_copy(update={"seq_positions": {rid(0): [(0, 6)]}})
    v = _pcp(tmp_path, {0: [zigzag_steps(0, 2, prompts)], 1: [r1]})
    assert v.status == "fail" and "position 0 computed by more than one CP rank" in v.reason


def test_cp_inactive_on_long_prompts_is_a_silent_fallback_and_fails(tmp_path: Path) -> None:
    prompts = {rid(0): 8}
    steps = {w: [zigzag_steps(w, 2, prompts).model_copy(update={"cp_active": False})] for w in (0, 1)}
    v = _pcp(tmp_path, steps)
    assert v.status == "fail"
    assert v.figures["first"]["shortest_extend"] == 8
    assert "silent fallback" in v.reason


def test_fallback_on_a_short_extend_follows_sglangs_rule_and_is_not_a_violation(tmp_path: Path) -> None:
    # SGLang's health check sends a 3-token request: zigzag with cp 2 may not split that step.
    short = {w: zigzag_steps(w, 2, {"HEALTH_CHECK_1": 3}).model_copy(update={"cp_active": False, "step": 1})
             for w in (0, 1)}  # fmt: skip
    long = {w: zigzag_steps(w, 2, {rid(0): 8}).model_copy(update={"step": 2}) for w in (0, 1)}
    v = _pcp(tmp_path, {w: [short[w], long[w]] for w in (0, 1)})
    assert v.status == "pass", v.reason
    assert v.figures["fallback_by_rule"] == 1


def test_every_step_falling_back_on_short_extends_is_unknown_not_a_failure(tmp_path: Path) -> None:
    # Only short extends seen (a server that died after its warm-up, or a workload of short prompts):
    # SGLang followed its rule each time, and a long extend's split was never observed.
    prompts = {rid(0): 3}
    steps = {w: [zigzag_steps(w, 2, prompts).model_copy(update={"cp_active": False})] for w in (0, 1)}
    v = _pcp(tmp_path, steps)
    assert v.status == "unknown", v.reason
    assert "each of 1 held an extend shorter than 4 tokens" in v.reason
    assert v.figures["fallback_by_rule"] == 1


def test_a_short_extend_split_anyway_is_still_judged(tmp_path: Path) -> None:
    # The fallback rule only excuses a step that was not split; one that was split is checked.
    prompts = {rid(0): 3}
    r1 = zigzag_steps(1, 2, prompts).model_copy(update={"seq_positions": {rid(0): [(0, 3)]}})
    v = _pcp(tmp_path, {0: [zigzag_steps(0, 2, prompts)], 1: [r1]})
    assert v.status == "fail", v.reason


def test_a_split_without_the_ranks_rows_recorded_is_not_judged(tmp_path: Path) -> None:
    # The split ran (cp_active, each rank's logical count) but its sharded positions were not read
    # (CPTEST_PROBE_POSITIONS=0, or a split whose positions the probe does not hook): no identity.
    prompts = {rid(0): 8}
    blind = {w: [zigzag_steps(w, 2, prompts).model_copy(update={"seq_positions": {}})] for w in (0, 1)}
    v = _pcp(tmp_path, blind)
    assert v.status == "unknown" and "no rank's record says which rows it held" in v.reason, v.reason
    # one rank's positions missing: that step is not judged, the other step is
    half = zigzag_steps(1, 2, prompts).model_copy(update={"seq_positions": {}})
    good = {w: zigzag_steps(w, 2, {rid(1): 8}).model_copy(update={"step": 2}) for w in (0, 1)}
    v = _pcp(tmp_path, {0: [zigzag_steps(0, 2, prompts), good[0]], 1: [half, good[1]]})
    assert v.status == "pass" and v.figures["steps_identity_unrecorded"] == 1, v.reason
    assert v.figures["request_extends"] == 1
    assert "1 split step(s) without the ranks' rows recorded" in v.reason


def test_a_rank_with_an_empty_shard_is_still_judged(tmp_path: Path) -> None:
    # A logical count of 0 is a shard with no rows, not an unread one: its request's rows then lack a rank.
    prompts = {rid(0): 8}
    empty = zigzag_steps(1, 2, prompts).model_copy(update={"seq_positions": {}, "attn_rows": 0})
    v = _pcp(tmp_path, {0: [zigzag_steps(0, 2, prompts)], 1: [empty]})
    assert v.status == "fail", v.reason


def test_gathered_ffn_declared_but_local_observed_fails(tmp_path: Path) -> None:
    expect = PCP.model_copy(update={"ffn": "gathered"})
    v = _pcp(tmp_path, {w: [zigzag_steps(w, 2, {rid(0): 8})] for w in (0, 1)}, expect)
    assert v.status == "fail" and "MLP" in v.reason


def test_interleave_split_rows_pass(tmp_path: Path) -> None:
    expect = RowsParams(mode="pcp_split", cp=2, strategy="interleave")
    # packed batch: request 0 (3 tokens) at packed 0..2, request 1 (4 tokens) at 3..6; token i -> rank i % 2
    r0 = Step(
        rank=rank_id(0, cp=2),
        step=0,
        mode="extend",
        batch_size=2,
        rows_in=7,
        cp_active=True,
        seq_positions={rid(0): [(0, 1), (2, 3)], rid(1): [(1, 2), (3, 4)]},
    )
    r1 = Step(
        rank=rank_id(1, cp=2),
        step=0,
        mode="extend",
        batch_size=2,
        rows_in=7,
        cp_active=True,
        seq_positions={rid(0): [(1, 2)], rid(1): [(0, 1), (2, 3)]},
    )
    assert _pcp(tmp_path, {0: [r0], 1: [r1]}, expect).status == "pass"


def test_replicated_rows_seen_differently_by_one_tp_rank_fail(tmp_path: Path) -> None:
    expect = RowsParams(mode="replicated")
    plan = make_plan(server_plan(world=2), [expect])
    s0 = Step(
        rank=rank_id(0),
        step=0,
        mode="extend",
        batch_size=1,
        rows_in=8,
        attn_rows=8,
        seq_positions={rid(0): [(0, 8)]},
    )
    s1 = s0.model_copy(update={"rank": rank_id(1), "seq_positions": {rid(0): [(0, 4)]}})
    write_archive(tmp_path, plan, ranks={"main": {0: [s0], 1: [s1]}})
    v = check_loaded(load_archive(tmp_path)).verdicts[0]
    assert v.status == "fail" and "rank 1 saw other rows than rank 0" in v.reason


def test_interleave_fallback_on_a_one_token_batch_follows_sglangs_rule(tmp_path: Path) -> None:
    # interleave.py:64-69: fewer than cp extend tokens in the batch -> no split. Every CP rank
    # reports the same batch; the rule is about the batch, not the sum over ranks.
    expect = RowsParams(mode="pcp_split", cp=2, strategy="interleave")
    health = {
        w: Step(rank=rank_id(w, cp=2), step=0, mode="extend", batch_size=1, rows_in=1, cp_active=False,
                extend_lens=[1], seq_positions={"HEALTH_CHECK_1": [(0, 1)]})
        for w in (0, 1)
    }  # fmt: skip
    split = {
        0: Step(rank=rank_id(0, cp=2), step=1, mode="extend", batch_size=1, rows_in=4, cp_active=True,
                extend_lens=[4], seq_positions={rid(0): [(0, 1), (2, 3)]}),
        1: Step(rank=rank_id(1, cp=2), step=1, mode="extend", batch_size=1, rows_in=4, cp_active=True,
                extend_lens=[4], seq_positions={rid(0): [(1, 2), (3, 4)]}),
    }  # fmt: skip
    v = _pcp(tmp_path, {w: [health[w], split[w]] for w in (0, 1)}, expect)
    assert v.status == "pass", v.reason
    assert v.figures["fallback_by_rule"] == 1


# ---------------------------------------------------------------- CUDA-graph replays (D58)
def _replayed(steps: list[Step], prompts: dict[str, int], graph_rows: int = 4) -> list[Step]:
    """`steps` with every decode step turned into what the probe records for a graph replay: the
    rows and positions seen as the replay starts, nothing of the inside (no KV write, no hooks)."""
    out = []
    for s in steps:
        if s.mode != "decode":
            out.append(s)
            continue
        k = s.step - 1
        out.append(s.model_copy(update={
            "graph_rows": graph_rows, "kv_written": {}, "attn_rows": None,
            "seq_positions": {r: [(p + k, p + k + 1)] for r, p in prompts.items()}}))
    return out


def test_dcp_positions_written_in_graph_replays_are_unknown_not_passed(tmp_path: Path) -> None:
    ranks = {w: _replayed(list(dcp_steps(w, 2, PROMPTS, decode_steps=3)), PROMPTS) for w in (0, 1)}
    v = _dcp_archive(tmp_path, ranks)
    assert v.status == "unknown", v.reason
    assert (v.figures["positions"], v.figures["unobserved_positions"]) == (5 + 8, 2 * 3)
    assert v.figures["replayed_steps"] == 3 and v.figures["padding_rows"] == 3 * (4 - 2)
    assert "written inside 3 CUDA-graph replay step(s)" in v.reason and v.figures["holes"] == 0


def test_a_position_neither_written_nor_replayed_is_still_a_hole(tmp_path: Path) -> None:
    ranks = {w: _replayed(list(dcp_steps(w, 2, PROMPTS, decode_steps=3)), PROMPTS) for w in (0, 1)}
    # both ranks' replay of step 2 lost request 1's row: position 9 was computed by nobody
    for w in (0, 1):
        ranks[w][2] = ranks[w][2].model_copy(update={"seq_positions": {rid(0): [(6, 7)]}})
    done = RequestResult(index=1, prompt_len=8, max_new_tokens=4, prompt_sha256="x", status="ok",
                         output_ids=[1, 2, 3, 4])  # positions 0..10 must exist
    v = _dcp_archive(tmp_path, ranks, runner=[done])
    assert v.status == "fail"
    assert "written up to position 9" in v.reason


def test_a_wrong_owner_in_an_eager_step_fails_even_with_replays(tmp_path: Path) -> None:
    ranks = {w: _replayed(list(dcp_steps(w, 2, PROMPTS, decode_steps=2)), PROMPTS) for w in (0, 1)}
    ranks[1][0] = ranks[1][0].model_copy(update={"kv_written": {rid(0): [(0, 1), (1, 2), (3, 4)]}})
    v = _dcp_archive(tmp_path, ranks)
    assert v.status == "fail" and "position 0 written by rank 1" in v.reason


def test_only_replays_leave_dcp_ownership_unknown_with_the_reason(tmp_path: Path) -> None:
    ranks = {w: [s for s in _replayed(list(dcp_steps(w, 2, PROMPTS, decode_steps=2)), PROMPTS)
                 if s.mode == "decode"] for w in (0, 1)}
    v = _dcp_archive(tmp_path, ranks)
    assert v.status == "unknown" and "every step of main was a CUDA-graph replay" in v.reason


def _tp_steps(graph_rows: tuple[int | None, int | None]) -> dict[int, list[Step]]:
    out = {}
    for w in (0, 1):
        s = Step(rank=rank_id(w), step=3, mode="decode", batch_size=3, rows_in=3,
                 seq_positions={rid(i): [(10 + i, 11 + i)] for i in range(3)}, graph_rows=graph_rows[w])
        out[w] = [s]
    return out


def test_replicated_rows_under_replay_pass_with_their_padding_apart(tmp_path: Path) -> None:
    plan = make_plan(server_plan(world=2), [RowsParams(mode="replicated")])
    write_archive(tmp_path, plan, ranks={"main": _tp_steps((8, 8))})
    v = check_loaded(load_archive(tmp_path)).verdicts[0]
    assert v.status == "pass", v.reason
    assert (v.figures["replayed_steps"], v.figures["padding_rows"], v.figures["rows"]) == (1, 5, 3)


def test_tp_ranks_running_one_step_differently_fail(tmp_path: Path) -> None:
    plan = make_plan(server_plan(world=2), [RowsParams(mode="replicated")])
    write_archive(tmp_path, plan, ranks={"main": _tp_steps((8, None))})
    v = check_loaded(load_archive(tmp_path)).verdicts[0]
    assert v.status == "fail" and "rank 1 ran it eagerly, rank 0 as a CUDA-graph replay of 8 rows" in v.reason


def test_dcp_counts_requests_by_who_sent_them(tmp_path: Path) -> None:
    # The workload's two requests, one scoring request and one of the engine's own (a health check)
    prompts = {rid(0): 5, rid(1): 8, scoring_rid(0): 9, "5f0c2e9a": 3}
    v = _dcp_archive(tmp_path, {w: list(dcp_steps(w, 2, prompts, decode_steps=1)) for w in (0, 1)})
    assert v.status == "pass", v.reason
    assert v.figures["requests_by_origin"] == {"workload": 2, "scoring": 1, "engine": 1}
    assert "4 request(s) (2 workload, 1 scoring, 1 the engine's own)" in v.reason


def test_dcp_request_counts_without_cptest_rids_say_what_they_hold(tmp_path: Path) -> None:
    prompts = {"9b1f": 5, "c07e": 8}
    v = _dcp_archive(tmp_path, {w: list(dcp_steps(w, 2, prompts, decode_steps=1)) for w in (0, 1)})
    assert v.figures["requests_by_origin"] == {"workload": 0, "scoring": 0, "engine": 2}
    assert "no rid is cptest's" in v.reason


def test_zigzag_extends_are_counted_by_who_sent_them(tmp_path: Path) -> None:
    v = _pcp(tmp_path, {w: [zigzag_steps(w, 2, {rid(0): 16, scoring_rid(0): 20})] for w in (0, 1)})
    assert v.status == "pass", v.reason
    assert v.figures["request_extends_by_origin"] == {"workload": 1, "scoring": 1, "engine": 0}
