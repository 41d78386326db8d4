"""The reference engine's rank-local evidence carries schema v6's and v7's fields: every step's layers,
the MLP's rows and their identity under PCP, the pool rows each K/V went to and those each step read,
and under attention DP the buffer every DP rank's rows meet in.

Each layout runs a real server (one process per rank, gloo) with the probe directory set, gets two
prompts at once and a few decode steps, and its rank files are read back with cptest's reader.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from cptest.evidence import Step, ranges_iter, read_records, slot_pairs
from tests.reference.conftest import reference_server

pytest.importorskip("torch")

PROMPTS = [[(i * 37 + 11) % 4096 for i in range(9)], [(i * 101 + 3) % 4096 for i in range(14)]]
NEW = 4


def _run(tiny_models: Path, tmp_path: Path, model: str, args: list[str]) -> dict[int, list[Step]]:
    """Each world rank's Step records of one short run."""
    def generate(url: str, prompt: list[int]) -> None:
        httpx.post(url + "/generate", timeout=60, json={
            "input_ids": prompt, "sampling_params": {"max_new_tokens": NEW, "temperature": 0.0,
                                                     "ignore_eos": True}}).raise_for_status()

    env = {"CPTEST_PROBE_DIR": str(tmp_path)}
    with reference_server(["--model-path", str(tiny_models / model), *args], env=env) as (url, _), \
            ThreadPoolExecutor(len(PROMPTS)) as pool:
        list(pool.map(lambda p: generate(url, p), PROMPTS))
    out = {}
    for f in sorted(tmp_path.glob("rank*.jsonl")):
        out[int(f.stem.removeprefix("rank"))] = [r for r in read_records(f)[0] if isinstance(r, Step)]
    return out


def _slot_pairs(step: Step, rid: str) -> list[tuple[int, int]]:
    return slot_pairs(step.kv_slots.get(rid, []), step.kv_written.get(rid, []))


def test_a_dcp2_rank_says_which_of_its_rows_each_kv_went_to_and_reads_exactly_those(
        tiny_models: Path, tmp_path: Path) -> None:
    ranks = _run(tiny_models, tmp_path, "llama-kv1", ["--tp-size", "2", "--dcp-size", "2"])
    assert sorted(ranks) == [0, 1]
    for world, steps in ranks.items():
        assert steps and {s.layers for s in steps} == {4}  # the tiny checkpoints' layers
        assert all(s.ffn_rows == s.ffn_out_rows == s.rows_in and s.layer_rows is None for s in steps)
        written: dict[str, dict[int, int]] = {}
        for s in steps:
            for rid, rs in s.kv_written.items():
                pairs = _slot_pairs(s, rid)
                assert [p for p, _ in pairs] == list(ranges_iter(rs)), (world, s.step, rid)
                assert all(p % 2 == s.rank.dcp for p, _ in pairs)  # this rank's share
                written.setdefault(rid, {}).update(pairs)
            if s.mode == "decode":  # a decode reads every row its request wrote here, nothing else
                for rid in s.seq_positions:
                    assert set(ranges_iter(s.kv_read[rid])) == set(written[rid].values()), (world, s.step)
        mine = {rid: w for rid, w in written.items() if not rid.startswith("HEALTH_CHECK")}
        assert all(len(set(w.values())) == len(w) for w in mine.values())  # a row per token
        # every token but the last generated one is written, each on the rank owning its position
        want = sorted(len(range(world % 2, len(p) + NEW - 1, 2)) for p in PROMPTS)
        assert sorted(len(w) for w in mine.values()) == want


def test_a_pcp2_zigzag_rank_names_its_attention_shard_and_the_mlps_whole_batch(
        tiny_models: Path, tmp_path: Path) -> None:
    ranks = _run(tiny_models, tmp_path, "llama-kv2",
                 ["--tp-size", "2", "--attn-cp-size", "2", "--enable-prefill-cp"])
    split = [s for steps in ranks.values() for s in steps if s.cp_active]
    assert {s.rank.attn_cp for s in split} == {0, 1}
    for s in split:
        assert s.ffn_rows == s.rows_in and s.ffn_seq_positions is not None
        assert sorted(b for ((_, b),) in s.ffn_seq_positions.values()) == sorted(s.extend_lens)
        for rid, rs in s.ffn_seq_positions.items():
            assert rs[0][0] == 0  # the request's whole extend (no prefix here)
            assert set(ranges_iter(s.seq_positions.get(rid, []))) < set(ranges_iter(rs))  # a shard of it
        assert s.kv_slots and all(_slot_pairs(s, rid) for rid in s.kv_written)
    decodes = [s for steps in ranks.values() for s in steps if s.mode == "decode"]
    assert decodes and all(s.ffn_seq_positions is None and s.kv_read for s in decodes)


def test_attention_dp_ranks_run_their_own_batches_and_record_the_buffer_they_meet_in(
        tiny_models: Path, tmp_path: Path) -> None:
    ranks = _run(tiny_models, tmp_path, "qwen3-kv2",
                 ["--tp-size", "4", "--dp-size", "2", "--enable-dp-attention", "--attn-cp-size", "2",
                  "--enable-prefill-cp"])
    assert sorted(ranks) == [0, 1, 2, 3]
    by_step: dict[int, dict[int, Step]] = {}
    for world, steps in ranks.items():
        assert {s.rank.attn_dp for s in steps} == {world // 2}  # DP blocks of attn_cp x attn_tp = 2 ranks
        for s in steps:
            by_step.setdefault(s.step, {})[world] = s
    served: dict[int, set[str]] = {0: set(), 1: set()}
    for step, recs in by_step.items():
        assert sorted(recs) == [0, 1, 2, 3], step  # every rank joins every step, idle or not
        b = recs[0].dp_buffer
        assert b is not None and all(s.dp_buffer == b for s in recs.values()), step  # one buffer everywhere
        for world, s in recs.items():
            dp = world // 2
            assert b.tokens[dp] == s.rows_in and s.ffn_rows == b.rows == sum(b.padded)
            assert (s.mode == "idle") == (s.rows_in == 0)
            served[dp] |= set(s.seq_positions)
        extends = any(s.mode == "extend" for s in recs.values())
        want = "sum_len" if extends or 2 * sum(b.tokens) < max(b.tokens) * 2 else "max_len"
        assert b.mode == want and b.padded == (list(b.tokens) if want == "sum_len" else [max(b.tokens)] * 2)
    # round robin: the health check's request went to DP rank 0, the two prompts to DP ranks 1 and 0
    workload = {dp: {r for r in rids if not r.startswith("HEALTH_CHECK")} for dp, rids in served.items()}
    assert all(len(rids) == 1 for rids in workload.values()), served
    assert not served[0] & served[1]  # a request lives on one DP rank only
