"""cptest's layout predictions against the functions SGLang 0.5.17 itself lays ranks and rows out with.

- Rank groups: every degree combination up to 8 ranks, against the group lists SGLang's own
  `initialize_model_parallel` builds (the driver records them instead of creating process groups),
  and the ranks SGLang derives from them (a rank's position in its group; `compute_dp_attention_world_info`).
- Prefill CP splits: zigzag and interleave, through the strategies' own `can_apply`, `build_metadata`,
  padding and `shard_hidden_states`, against `cptest.topology` and the reference engine's `pcp_local_rows`;
  and the models' own CP-v1 split (`can_cp_split`, `prepare_context_parallel_metadata`,
  `cp_split_and_rebuild_position`) as the probe reads it, against what `rows split` and `pcp rows` expect.
- DCP ownership: `get_dcp_lens`, `filter_dcp_local_kv_indices` and the paged allocator's
  `alloc_extend_naive` (page `page * dcp`; the plain-torch form of what CUDA runs as a triton kernel),
  against `dcp_owner` and the reference engine's pool rows.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cptest.contracts.rows import expected_split
from cptest.engines.sglang.argv import LAUNCHER, build_argv
from cptest.engines.sglang.releases import RELEASE_0_5_17
from cptest.evidence import ranges_merge
from cptest.probe.records import StrideLayout, ZigzagLayout, split_local, split_zigzag_local
from cptest.reference.layout import pcp_local_rows
from cptest.reference.modeling import pool_rows
from cptest.topology import (
    Degrees,
    dcp_owner,
    divisors,
    geometry,
    interleave_applies,
    zigzag_applies,
    zigzag_rank_token_counts,
)
from tests.engines.sglang.configs import serve_config
from tests.sglang_src.conftest import COMPARED, DIFFERENTIAL, SGLangDriver

COUNT = COMPARED[__name__]
HYPOTHESIS = settings(max_examples=25, **DIFFERENTIAL)


def all_layouts(max_ranks: int = 8) -> list[Degrees]:
    out = []
    for tp, pp in itertools.product(range(1, max_ranks + 1), (1, 2)):
        if tp * pp > max_ranks:
            continue
        for dcp, acp, adp in itertools.product(divisors(tp), divisors(tp), divisors(tp)):
            if tp % (acp * adp) == 0:
                out.append(Degrees(tp=tp, pp=pp, dcp=dcp, attn_cp=acp, attn_dp=adp))
    return out


def _distinct(geo: list[Any], name: str) -> list[list[int]]:
    return sorted({tuple(g.group(name)) for g in geo})  # type: ignore[misc]


def test_rank_groups_match_initialize_model_parallel(sglang: SGLangDriver) -> None:
    layouts = all_layouts()
    answers = sglang.ask([{"op": "groups", "tp": d.tp, "pp": d.pp, "attn_dp": d.attn_dp, "attn_cp": d.attn_cp,
                           "dcp": d.dcp} for d in layouts])
    problems = []
    for d, answer in zip(layouts, answers, strict=True):
        assert answer["ok"], (d, answer)
        built = {name: sorted(tuple(g) for g in groups) for name, groups in answer["groups"].items()}
        geo = geometry(d)
        mine = {"tp": _distinct(geo, "tp"), "attn_cp": _distinct(geo, "attn_cp"),
                "attention_tp": _distinct(geo, "attn_tp"), "pp": _distinct(geo, "pp"),
                # With moe_dp 1 (cptest has no MoE degrees) SGLang's MOE_DP is the ATTN_CP grouping.
                "moe_dp": _distinct(geo, "attn_cp")}
        if d.dcp > 1:  # SGLang builds no DCP group without DCP
            mine["dcp"] = _distinct(geo, "dcp")
        else:
            assert "dcp" not in built, (d, built["dcp"])
        for name, groups in mine.items():
            if built[name] != groups:
                problems.append(f"{d}: {name} SGLang {built[name]} cptest {groups}")
        for g in geo:
            # SGLang's rank in a group is the rank's position in its list (GroupCoordinator.rank_in_group).
            ranks = (("dcp", g.dcp_rank), ("attn_cp", g.attn_cp_rank), ("attention_tp", g.attn_tp_rank))
            for name, rank in ranks:
                if name not in built:
                    continue
                group = next(grp for grp in built[name] if g.world_rank in grp)
                if group.index(g.world_rank) != rank:
                    problems.append(f"{d}: rank {g.world_rank} {name} rank SGLang "
                                    f"{group.index(g.world_rank)} cptest {rank}")
            theirs = tuple(answer["attn_ranks"][g.tp_rank])
            if theirs != (g.attn_tp_rank, g.attn_dp_rank):
                problems.append(f"{d}: tp rank {g.tp_rank} (attn_tp, attn_dp) SGLang {theirs} "
                                f"cptest {(g.attn_tp_rank, g.attn_dp_rank)}")
        COUNT["layouts"] += 1
    assert not problems, "\n".join(problems[:20])


def test_worker_start_refuses_what_cptest_cannot_lay_out(sglang: SGLangDriver) -> None:
    """The layouts cptest refuses for tp % dcp are the ones SGLang's own worker start refuses."""
    cases = [Degrees(tp=tp, dcp=dcp) for tp in range(1, 9) for dcp in range(1, 9)]
    answers = sglang.ask([{"op": "groups", "tp": d.tp, "dcp": d.dcp} for d in cases])
    for d, answer in zip(cases, answers, strict=True):
        assert answer["ok"] == (d.tp % d.dcp == 0), (d, answer)
        COUNT["tp_dcp_pairs"] += 1


def test_a_dcp_group_can_span_attention_dp_ranks_and_sglang_launches_it(
        sglang: SGLangDriver, tiny_models: dict[str, str]) -> None:
    """docs/sglang.md §2.4: no `attn_tp % dcp` check, so with attention TP 1 a DCP group mixes DP ranks.

    SGLang's own ServerArgs and worker start take TP 4, attention DP 4, DCP 2, and build DCP groups of
    two ranks that belong to two attention-DP ranks; cptest's layout says the same."""
    d = Degrees(tp=4, attn_dp=4, dcp=2)
    serve = serve_config(tiny_models["qwen3"], tp=d.tp, attn_dp=d.attn_dp, dcp=d.dcp)
    answer = sglang.ask([{"op": "server_args", "argv": build_argv(RELEASE_0_5_17, serve)[len(LAUNCHER):],
                          "worker_start": True}])[0]
    assert answer["ok"] and answer["worker_start"]["ok"], answer
    dp_rank = {tp_rank: ranks[1] for tp_rank, ranks in enumerate(answer["worker_start"]["attn_ranks"])}
    dcp_groups = answer["worker_start"]["groups"]["dcp"]
    assert dcp_groups == [[0, 1], [2, 3]]
    assert all(len({dp_rank[r] for r in group}) == 2 for group in dcp_groups)
    assert sorted({tuple(g.group("dcp")) for g in geometry(d)}) == [(0, 1), (2, 3)]


splits = st.tuples(
    st.sampled_from(("zigzag", "interleave")),
    st.integers(2, 8),
    st.lists(st.integers(1, 70), min_size=1, max_size=4),
)


@HYPOTHESIS
@given(batch=st.lists(splits, min_size=10, max_size=10))
def test_prefill_cp_splits_match_sglangs_strategies(sglang: SGLangDriver, tiny_models: dict[str, str],
                                                   batch: list[tuple[str, int, list[int]]]) -> None:
    answers = sglang.ask([{"op": "split", "strategy": s, "cp": cp, "extend_lens": lens,
                           "model_path": tiny_models["qwen3-moe"]} for s, cp, lens in batch])
    for (strategy, cp, lens), answer in zip(batch, answers, strict=True):
        applies = zigzag_applies(lens, cp) if strategy == "zigzag" else interleave_applies(lens, cp)
        assert answer["applies"] == applies, (strategy, cp, lens)
        COUNT[f"{strategy}_batches"] += 1
        if not applies:
            continue
        predicted_split, rows = pcp_local_rows(lens, cp, strategy)
        assert predicted_split
        counts = zigzag_rank_token_counts(lens, cp) if strategy == "zigzag" else [len(r) for r in rows]
        assert answer["logical"] == counts, (strategy, cp, lens)
        align = 2 * cp if strategy == "zigzag" else cp
        assert answer["physical"] == [-(-max(counts) // align) * align] * cp, (strategy, cp, lens)
        for r in range(cp):
            local = answer["rows"][r]
            # The rank's logical rows are cptest's (as a set: SGLang puts every request's early block
            # first, then the late blocks; the reference engine goes request by request), then padding.
            assert sorted(local[: counts[r]]) == sorted(rows[r]), (strategy, cp, lens, r)
            assert local[counts[r]:] == [-1] * (answer["physical"][r] - counts[r]), (strategy, cp, lens, r)
            if local[: counts[r]] != rows[r]:
                COUNT[f"{strategy}_rank_row_order_differs"] += 1


prefixed_splits = st.tuples(
    st.sampled_from(("zigzag", "interleave")),
    st.integers(2, 8),
    st.lists(st.tuples(st.integers(0, 30), st.integers(1, 70)), min_size=1, max_size=4),
)


@HYPOTHESIS
@given(batch=st.lists(prefixed_splits, min_size=10, max_size=10))
def test_cp_v2_positions_read_by_the_probe_are_what_the_row_contracts_expect(
        sglang: SGLangDriver, tiny_models: dict[str, str], batch: list[tuple[str, int, list[tuple[int, int]]]]
) -> None:
    """The probe's CP-v2 position hooks (`hooks.after_zigzag_shard_positions`,
    `after_interleave_shard_positions`) keep a rank's logical rows of the strategy's own
    `shard_position_ids` and read them by the split's layout (`records.split_local`): on SGLang's
    split that gives every request the shard `rows split` and `pcp rows` expect."""
    answers = sglang.ask([{"op": "split", "strategy": s, "cp": cp, "extend_lens": [n for _, n in seqs],
                           "prefix_lens": [p for p, _ in seqs], "model_path": tiny_models["qwen3-moe"]}
                          for s, cp, seqs in batch])
    for (strategy, cp, seqs), answer in zip(batch, answers, strict=True):
        assert answer["ok"], answer
        if not answer["applies"]:
            continue
        lens, rids = [n for _, n in seqs], [f"r{i}" for i in range(len(seqs))]
        for r in range(cp):
            keep = answer["logical"][r]
            layout = (ZigzagLayout(**answer["layout"][r]) if strategy == "zigzag" else StrideLayout(r, cp))
            read = split_local(answer["positions"][r][:keep], layout, rids, lens)
            assert read is not None, (strategy, cp, seqs, r)
            for k, (rid, (prefix, n)) in enumerate(zip(rids, seqs, strict=True)):
                # interleave's shards start at the rank the request's first packed token went to
                per_rank: list[list[tuple[int, int]]] = [[] for _ in range(cp)]
                per_rank[sum(lens[:k]) % cp] = [(prefix, prefix + 1)]
                want = expected_split(strategy, prefix, prefix + n, cp, per_rank)[r]
                assert ranges_merge((x, x + 1) for x in read[rid]) == want, (strategy, cp, seqs, r, rid)
                COUNT[f"{strategy}_position_shards"] += 1


v1_splits = st.tuples(st.integers(2, 8), st.lists(st.tuples(st.integers(0, 30), st.integers(1, 70)),
                                                  min_size=1, max_size=4))


@HYPOTHESIS
@given(batch=st.lists(v1_splits, min_size=10, max_size=10))
def test_cp_v1_splits_read_by_the_probe_are_what_the_row_contracts_expect(
        sglang: SGLangDriver, tiny_models: dict[str, str],
        batch: list[tuple[int, list[tuple[int, int]]]]) -> None:
    """The probe's CP-v1 hook (`hooks.after_cp_v1_split_positions`) keeps a rank's first
    `per_rank_actual_token[rank]` positions and reads them through the metadata's `split_list` and
    `zigzag_index` (`records.split_zigzag_local`): on SGLang's own split that reading gives every
    request the shard `rows split` and `pcp rows` expect of zigzag, with no padding row, and the MoE
    gather's length (`max_rank_len`) is `pcp rows`' CP-v1 gathered length."""
    answers = sglang.ask([{"op": "split_v1", "cp": cp, "extend_lens": [n for _, n in seqs],
                           "prefix_lens": [p for p, _ in seqs], "model_path": tiny_models["qwen3-moe"]}
                          for cp, seqs in batch])
    for (cp, seqs), answer in zip(batch, answers, strict=True):
        lens = [n for _, n in seqs]
        assert answer["ok"], answer
        assert answer["applies"] == zigzag_applies(lens, cp), (cp, seqs)
        COUNT["cp_v1_batches"] += 1
        if not answer["applies"]:
            continue
        counts = zigzag_rank_token_counts(lens, cp)
        rids = [f"r{i}" for i in range(len(seqs))]
        for r in range(cp):
            meta, local = answer["metadata"][r], answer["positions"][r]
            assert meta["per_rank_actual_token"] == counts and len(local) == counts[r], (cp, seqs, r)
            assert meta["max_rank_len"] == [max(counts)] * cp, (cp, seqs, r)
            read = split_zigzag_local(local[: counts[r]], meta["split_list"], meta["zigzag_index"], rids)
            assert read is not None, (cp, seqs, r)
            for rid, (prefix, n) in zip(rids, seqs, strict=True):
                want = expected_split("zigzag", prefix, prefix + n, cp, [])[r]
                assert ranges_merge((x, x + 1) for x in read[rid]) == want, (cp, seqs, r, rid)
                COUNT["cp_v1_rank_shards"] += 1


@HYPOTHESIS
@given(dcp=st.integers(1, 8), seqs=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 90)), min_size=1,
                                             max_size=6))
def test_dcp_local_lengths_match_get_dcp_lens(sglang: SGLangDriver, dcp: int,
                                              seqs: list[tuple[int, int]]) -> None:
    starts, lens = [s for s, _ in seqs], [n for _, n in seqs]
    answer = sglang.ask([{"op": "dcp_lens", "dcp": dcp, "lens": lens, "starts": starts},
                         {"op": "dcp_lens", "dcp": dcp, "lens": lens}])
    for r in range(dcp):
        assert answer[0]["lens"][r] == [sum(dcp_owner(p, dcp) == r for p in range(s, s + n)) for s, n in seqs]
        assert answer[1]["lens"][r] == [sum(dcp_owner(p, dcp) == r for p in range(n)) for n in lens]
    COUNT["dcp_len_cases"] += len(seqs)


@st.composite
def paged_batches(draw: Any) -> dict[str, Any]:
    dcp, page = draw(st.integers(1, 8)), draw(st.sampled_from((1, 2, 4, 16)))
    block = page * dcp
    seqs = draw(st.lists(st.tuples(st.integers(0, 3 * block + 3), st.integers(1, 3 * block + 3)),
                         min_size=1, max_size=4))
    need = sum(-(-(p + n) // block) for p, n in seqs)
    pages = draw(st.permutations(list(range(1, need + 8))))
    return {"dcp": dcp, "page": page, "seqs": seqs, "pages": pages}


@HYPOTHESIS
@given(case=paged_batches())
def test_dcp_slots_match_sglangs_allocator_and_filter(sglang: SGLangDriver, case: dict[str, Any]) -> None:
    """Owner `pos % dcp` and physical row `loc // dcp`: SGLang's paged allocator (pages of `page * dcp`)
    gives each extend position the slot the reference engine's block table predicts, that slot has
    the position's owner (`loc % dcp == pos % dcp`, so the triton write mask by position and the MLA
    mask by slot agree), and `filter_dcp_local_kv_indices` keeps for each rank exactly the rows the
    reference engine reads."""
    dcp, page, seqs, pages = case["dcp"], case["page"], case["seqs"], list(case["pages"])
    block = page * dcp
    tables, prefix_lens, seq_lens, last_loc = [], [], [], []
    for prefix, n in seqs:  # the prefix's blocks were allocated before; the rest come from free pages
        own = -(-prefix // block)
        tables.append(pages[:own])
        pages = pages[own:]
        prefix_lens.append(prefix)
        seq_lens.append(prefix + n)
        last_loc.append(tables[-1][(prefix - 1) // block] * block + (prefix - 1) % block if prefix else -1)
    free = list(pages)
    for table, (prefix, n) in zip(tables, seqs, strict=True):
        new = -(-(prefix + n) // block) - len(table)
        table.extend(pages[:new])
        pages = pages[new:]
    answers = sglang.ask([{"op": "alloc_extend", "page_size": block, "prefix_lens": prefix_lens,
                           "seq_lens": seq_lens, "last_loc": last_loc, "free_pages": free}]
                         + [{"op": "dcp_filter", "dcp": dcp, "locs": _locs(t, range(p + n), block)}
                            for t, (p, n) in zip(tables, seqs, strict=True)])
    expected = [loc for t, (p, n) in zip(tables, seqs, strict=True)
                for loc in _locs(t, range(p, p + n), block)]
    assert answers[0]["locs"] == expected
    positions = [pos for p, n in seqs for pos in range(p, p + n)]
    assert all(loc % dcp == dcp_owner(pos, dcp) for loc, pos in zip(expected, positions, strict=True))
    for table, (p, n), answer in zip(tables, seqs, answers[1:], strict=True):
        for r in range(dcp):
            mine = pool_rows(table, torch.arange(r, p + n, dcp), page, dcp).tolist() if p + n > r else []
            assert answer["local"][r] == mine, (dcp, page, table, r)
    COUNT["dcp_slot_requests"] += len(seqs)


def _locs(table: list[int], positions: range, block: int) -> list[int]:
    return [table[pos // block] * block + pos % block for pos in positions]
