"""cptest/reference/layout.py: groups, head shards and row splits of the reference engine."""

from __future__ import annotations

import pytest

from cptest.reference.layout import Layout, pcp_local_rows
from cptest.topology import Degrees, geometry, zigzag_split

LAYOUTS = [(1, 1, 1), (2, 1, 1), (2, 2, 1), (4, 4, 1), (4, 2, 1), (2, 1, 2), (4, 1, 2), (4, 1, 4)]


@pytest.mark.parametrize(("tp", "dcp", "cp"), LAYOUTS)
def test_groups_and_ranks_follow_the_topology_contract(tp: int, dcp: int, cp: int) -> None:
    spec = Degrees(tp=tp, dcp=dcp, attn_cp=cp, gpus=tp, prefill_cp=cp > 1,
                   cp_strategy="zigzag" if cp > 1 else None)
    for g in geometry(spec):
        lay = Layout(spec, rank=g.world_rank)
        assert not lay.problems()
        d = g.model_dump()
        assert (lay.dcp_rank, lay.attn_cp_rank, lay.attn_tp_rank) == (d["dcp_rank"], d["attn_cp_rank"],
                                                                      d["attn_tp_rank"])
        for name in ("tp", "dcp", "attn_cp", "attn_tp"):
            assert lay.group(name) == list(d[f"{name}_group"]), name


def test_pcp_with_dcp_is_refused() -> None:
    assert any("does not support --enable-prefill-cp" in p
               for p in Layout(Degrees(tp=2, dcp=2, attn_cp=2, prefill_cp=True), rank=0).problems())


def test_dcp_group_stores_the_kv_heads_of_every_query_head_it_gathers() -> None:
    # 8 heads, 4 KV heads, tp 2 dcp 2: both ranks attend for all 8 heads, so both store all 4 KV heads.
    for r in (0, 1):
        lay = Layout(Degrees(tp=2, dcp=2), rank=r)
        assert lay.q_heads(8) == list(range(4 * r, 4 * r + 4))
        assert lay.attn_q_heads(8) == list(range(8))
        assert lay.kv_heads(8, 4) == [0, 1, 2, 3]
    # Without DCP each rank stores only its own shard; with 1 KV head it is replicated.
    assert Layout(Degrees(tp=2), rank=1).kv_heads(8, 4) == [2, 3]
    assert Layout(Degrees(tp=2), rank=1).kv_heads(8, 1) == [0]


def test_zigzag_rows_follow_topology_zigzag_split_per_request() -> None:
    applies, rows = pcp_local_rows([8, 5], 2, "zigzag")
    assert applies
    want0 = [i for a, b in zigzag_split(8, 2)[0] for i in range(a, b)] + \
        [8 + i for a, b in zigzag_split(5, 2)[0] for i in range(a, b)]
    assert rows[0] == want0
    assert sorted(rows[0] + rows[1]) == list(range(13))


def test_zigzag_falls_back_silently_when_one_extend_is_shorter_than_2cp() -> None:
    applies, rows = pcp_local_rows([8, 3], 2, "zigzag")
    assert not applies
    assert rows == [list(range(11))] * 2


def test_interleave_deals_packed_rows_round_robin() -> None:
    applies, rows = pcp_local_rows([3, 4], 2, "interleave")
    assert applies
    assert rows == [[0, 2, 4, 6], [1, 3, 5]]
