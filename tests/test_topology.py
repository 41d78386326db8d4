"""Specifications of cptest.topology: SGLang's rank geometry and the CP layout contracts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cptest.errors import PlanError
from cptest.topology import (
    Degrees,
    capacity_groups,
    dcp_local_positions,
    dcp_owner,
    expected_capacity_multiplier,
    geometry,
    interleave_applies,
    interleave_split,
    kv_heads_per_rank,
    kv_replicated_in_dcp_group,
    layout_problems,
    process_title,
    zigzag_applies,
    zigzag_rank_token_counts,
    zigzag_split,
)


def groups(spec: Degrees, attr: str) -> list[list[int]]:
    seen: dict[tuple[int, ...], None] = {}
    for g in geometry(spec):
        seen.setdefault(getattr(g, attr), None)
    return sorted(list(g) for g in seen)


SINGLE = [[0], [1], [2], [3]]

# docs/sglang.md §6 worked examples, re-derived from 0.5.17 parallel_state.py:2191-2547.
WORKED = [
    (Degrees(tp=2, dcp=2), [[0, 1]], [[0, 1]], [[0], [1]], [[0, 1]]),
    (Degrees(tp=4, dcp=2), [[0, 1, 2, 3]], [[0, 1, 2, 3]], [[0], [1], [2], [3]], [[0, 1], [2, 3]]),
    (Degrees(tp=4, attn_cp=2), [[0, 1, 2, 3]], [[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0], [1], [2], [3]]),
    (Degrees(tp=4, attn_cp=4), [[0, 1, 2, 3]], SINGLE, [[0, 1, 2, 3]], SINGLE),
    (
        Degrees(tp=8, attn_dp=2, attn_cp=2),
        [list(range(8))],
        [[0, 1], [2, 3], [4, 5], [6, 7]],
        [[0, 2], [1, 3], [4, 6], [5, 7]],
        [[r] for r in range(8)],
    ),
]


@pytest.mark.parametrize(("spec", "tp", "attn_tp", "attn_cp", "dcp"), WORKED, ids=lambda x: str(x)[:40])
def test_groups_match_the_reference_worked_examples(spec, tp, attn_tp, attn_cp, dcp):
    assert groups(spec, "tp_group") == tp
    assert groups(spec, "attn_tp_group") == attn_tp
    assert groups(spec, "attn_cp_group") == attn_cp
    assert groups(spec, "dcp_group") == dcp


def test_sglang_docstring_example_attn_cp2_attn_tp4():
    # parallel_state.py:2237-2244: tp 8, attn_cp 2 -> CP groups [g0,g4],[g1,g5],[g2,g6],[g3,g7].
    spec = Degrees(tp=8, attn_cp=2)
    assert groups(spec, "attn_cp_group") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert groups(spec, "attn_tp_group") == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_pipeline_groups_stride_by_tp_and_world_rank_is_tp_major():
    spec = Degrees(tp=2, pp=4)
    assert groups(spec, "pp_group") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert groups(spec, "tp_group") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    g5 = geometry(spec)[5]
    assert (g5.pp_rank, g5.tp_rank) == (2, 1)


def test_tp_rank_formula_holds_for_every_rank():
    spec = Degrees(tp=16, attn_dp=2, attn_cp=4)
    for g in geometry(spec):
        assert g.tp_rank == (g.attn_dp_rank * spec.attn_cp + g.attn_cp_rank) * spec.attn_tp + g.attn_tp_rank


def test_dcp_rank_is_tp_rank_mod_dcp():
    for g in geometry(Degrees(tp=8, dcp=4)):
        assert g.dcp_rank == g.tp_rank % 4
        assert g.dcp_group.index(g.world_rank) == g.dcp_rank


def test_gpus_are_contiguous_per_node():
    spec = Degrees(tp=16, nodes=2)
    geo = geometry(spec)
    assert [g.node for g in geo] == [0] * 8 + [1] * 8
    assert [g.local_gpu for g in geo] == list(range(8)) * 2


def test_pp_across_nodes_puts_one_stage_per_node():
    geo = geometry(Degrees(tp=4, pp=2, nodes=2))
    assert [(g.node, g.local_gpu) for g in geo] == [(n, i) for n in range(2) for i in range(4)]


def test_impossible_layouts_raise_plan_error_naming_the_fix():
    with pytest.raises(PlanError, match=r"dcp 3 does not divide tp 4"):
        geometry(Degrees(tp=4, dcp=3))
    [dcp] = layout_problems(Degrees(tp=4, dcp=3))
    assert (dcp.code, dcp.field, dcp.expected) == ("tp_divisible_by_dcp", "dcp", "dcp among [1, 2, 4]")
    assert str(layout_problems(Degrees(tp=4, gpus=8))[0]) == "gpus 8 != tp 4 x pp 1"
    assert layout_problems(Degrees(tp=0))[0].message.startswith("tp must be an integer >= 1")


@pytest.mark.parametrize(
    ("degrees", "code", "field"),
    [
        (Degrees(tp=4, attn_cp=3), "tp_divisible_by_attn_cp", "attn_cp"),
        (Degrees(tp=4, attn_cp=2, attn_dp=4), "tp_divisible_by_dp_attn_cp", "attn_dp"),
        (Degrees(tp=2, nodes=3), "nodes_divide_world", "nodes"),
        (Degrees(tp=2, attn_cp=2, prefill_cp=True), "cp_strategy_required", "prefill_cp"),
        (Degrees(tp=2, prefill_cp=True, cp_strategy="zigzag"), "prefill_cp_needs_attn_cp", "prefill_cp"),
        (Degrees(tp=2, attn_cp=2, cp_strategy="ring"), "cp_strategy_known", "cp_strategy"),
    ],
)
def test_each_layout_rule_names_its_code_and_the_setting_to_change(degrees, code, field):
    assert [(p.code, p.field) for p in layout_problems(degrees)] == [(code, field)]


def test_the_prefill_split_rules_do_not_stop_the_groups_from_being_built():
    # A scenario about SGLang's missing-strategy rejection still gets its ranks' titles.
    assert len(geometry(Degrees(tp=2, attn_cp=2, prefill_cp=True))) == 2


@pytest.mark.parametrize(
    ("spec", "rank", "title"),
    [
        (Degrees(tp=1), 0, "sglang::scheduler"),
        (Degrees(tp=4, dcp=2), 3, "sglang::scheduler_TP3"),
        (Degrees(tp=4, attn_cp=2, prefill_cp=True), 1, "sglang::scheduler_ATTN_CP0_TP1"),
        (Degrees(tp=4, attn_cp=2, prefill_cp=True), 2, "sglang::scheduler_ATTN_CP1_TP2"),
        (Degrees(tp=8, attn_dp=2, attn_cp=2), 5, "sglang::scheduler_DP1_ATTN_CP0_TP5"),
        (Degrees(tp=2, pp=2), 3, "sglang::scheduler_PP1_TP1"),
    ],
)
def test_process_title_has_a_part_only_for_sizes_above_one(spec, rank, title):
    assert process_title(geometry(spec)[rank], spec) == title


def test_geometry_serialises_groups_as_lists():
    d = geometry(Degrees(tp=2, dcp=2))[1].model_dump(mode="json")
    assert d["dcp_group"] == [0, 1] and d["dcp_rank"] == 1


# ---------------------------------------------------------------- zigzag


def test_zigzag_cp4_ranks_own_blocks_0_7_1_6_2_5_3_4():
    # 16 tokens, cp 4: 8 blocks of 2.
    assert zigzag_split(16, 4) == [
        [(0, 2), (14, 16)],
        [(2, 4), (12, 14)],
        [(4, 6), (10, 12)],
        [(6, 8), (8, 10)],
    ]


def test_zigzag_remainder_goes_to_the_first_blocks():
    # 10 tokens, cp 2: 4 blocks, base 2, rem 2 -> sizes 3,3,2,2 (zigzag.py:150-158).
    assert zigzag_split(10, 2) == [[(0, 3), (8, 10)], [(3, 6), (6, 8)]]
    assert zigzag_rank_token_counts([10], 2) == [5, 5]
    # 7 tokens: sizes 2,2,2,1 -> rank 0 gets 2+1, rank 1 gets 2+2.
    assert zigzag_rank_token_counts([10, 7], 2) == [5 + 3, 5 + 4]


def test_zigzag_one_short_request_disables_the_split_for_the_whole_batch():
    assert zigzag_applies([4096, 4096], 2)
    assert not zigzag_applies([4096, 3], 2)
    assert not zigzag_applies([3], 2)
    assert zigzag_applies([4], 2)
    assert not zigzag_applies([4096], 1)


def test_interleave_applies_on_total_tokens_only():
    assert interleave_applies([1, 1], 2)
    assert not interleave_applies([1], 2)
    assert not interleave_applies([100], 1)


def _owners_partition(parts: list[list[int]], n: int) -> None:
    flat = [i for p in parts for i in p]
    assert sorted(flat) == list(range(n)), "union is the whole sequence, each token once"
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= (2 if len(parts) > 1 else 0)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 5000), cp=st.integers(1, 16))
def test_zigzag_owners_are_disjoint_complete_and_balanced(n, cp):
    split = zigzag_split(n, cp)
    parts = [[i for a, b in ranges for i in range(a, b)] for ranges in split]
    _owners_partition(parts, n)
    # Each rank holds two blocks whose sizes are within one of every other block.
    assert [len(p) for p in parts] == zigzag_rank_token_counts([n], cp)
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1 + (1 if n % (2 * cp) else 0)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 5000), cp=st.integers(1, 16))
def test_interleave_owners_are_disjoint_complete_and_within_one(n, cp):
    parts = [list(r) for r in interleave_split(n, cp)]
    _owners_partition(parts, n)
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1


# ---------------------------------------------------------------- DCP


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 5000), dcp=st.integers(1, 16), interleave=st.sampled_from([1, 1, 2, 16, 64]))
def test_dcp_positions_are_written_exactly_once_over_the_group(n, dcp, interleave):
    parts = [list(dcp_local_positions(n, r, dcp, interleave)) for r in range(dcp)]
    assert sorted(p for part in parts for p in part) == list(range(n))
    for r, part in enumerate(parts):
        assert all(dcp_owner(p, dcp, interleave) == r for p in part)
    if interleave == 1:
        # get_dcp_lens (layers/dcp/layout.py): len // dcp + (rank < len % dcp).
        assert [len(p) for p in parts] == [n // dcp + (r < n % dcp) for r in range(dcp)]


def test_dcp_owner_is_position_mod_dcp():
    assert [dcp_owner(p, 4) for p in range(9)] == [0, 1, 2, 3, 0, 1, 2, 3, 0]


def test_capacity_groups_are_the_dcp_groups():
    assert capacity_groups(Degrees(tp=8, dcp=4)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert capacity_groups(Degrees(tp=2)) == [[0], [1]]


@pytest.mark.parametrize(
    ("tp", "dcp", "kv", "rule", "heads"),
    [
        (8, 2, 8, "attn_tp", 1),  # 0.5.17: DCP does not change pool heads
        (8, 2, 8, "attn_tp_over_dcp", 2),  # 0.5.23: heads shard over tp // dcp
        (4, 4, 8, "attn_tp", 2),
        (4, 4, 8, "attn_tp_over_dcp", 8),
        (8, 2, 2, "attn_tp_over_dcp", 1),
    ],
)
def test_kv_heads_per_rank_follows_the_release_rule(tp, dcp, kv, rule, heads):
    assert kv_heads_per_rank(tp, dcp, kv, rule) == heads


@pytest.mark.parametrize(
    ("tp", "dcp", "kv", "replicated"),
    [
        (8, 2, 4, True),  # Qwen3-30B-A3B on TP8/DCP2: 4 <= 8/2
        (8, 2, 8, False),  # Llama-3.x 8 KV heads on TP8/DCP2
        (4, 4, 8, False),
        (4, 4, 1, True),
        (8, 4, 2, True),
        (8, 4, 4, False),
        (8, 1, 8, True),
    ],
)
def test_kv_is_replicated_in_the_dcp_group_only_when_kv_heads_fit_tp_over_dcp(tp, dcp, kv, replicated):
    assert kv_replicated_in_dcp_group(tp, dcp, kv) is replicated


def test_capacity_multiplier_mla_is_dcp_and_pcp_gains_nothing():
    assert expected_capacity_multiplier(Degrees(tp=8, dcp=8), kv_heads=1, is_mla=True) == 8.0
    # attn_cp 4 on tp 4: attention-TP 1, every rank holds all 8 KV heads instead of 2.
    assert expected_capacity_multiplier(Degrees(tp=4, attn_cp=4, prefill_cp=True), 8, False) == 0.25
    assert expected_capacity_multiplier(Degrees(tp=4, attn_cp=2, prefill_cp=True), 2, False) == 1.0


def test_capacity_multiplier_mha_depends_on_the_release_heads_rule():
    spec = Degrees(tp=8, dcp=2)
    assert expected_capacity_multiplier(spec, 8, False, "attn_tp") == 2.0
    assert expected_capacity_multiplier(spec, 8, False, "attn_tp_over_dcp") == 1.0
    assert expected_capacity_multiplier(spec, 4, False, "attn_tp_over_dcp") == 2.0
