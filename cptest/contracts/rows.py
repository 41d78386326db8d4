"""rows: which rank computed which token rows, and who wrote which K/V positions.

    expect { rows replicated }                      TP only: every rank sees the same rows
    expect { rows kv_owner position % 2 }           DCP: the K/V owner rule
    expect { rows split zigzag ffn gathered }       PCP: the row split (and the FFN handoff)

A *row* is one token of one request in one forward step (docs/architecture.md §9). Evidence: the Step
records of every rank of the role; ranks of one group are matched by `Step.step` (they run the
same batches in lockstep).

- dcp_owner: in every DCP group and for every request, each K/V position is written exactly once,
  by DCP rank `(p // interleave) % dcp`; the positions written form `[0, end)`; for a request that
  completed and whose rid names its index (`cptest-<role>-<index>`, `<role>-<index>` or `<index>`),
  `end` is `prompt_len + len(output_ids) - 1` (the last sampled token is never fed back) or one more
  (an overlap-scheduled step). Queries are not split: attn_rows == rows_in on each DCP rank, or
  under attention DP the DP rank's padded slice of its buffer (`groups.attention_batch_rows`).
- pcp_split: in every extend step and every ATTN_CP group, the CP ranks' attention rows of each
  request are disjoint and their union is one contiguous extend `[lo, hi)`; zigzag: rank r holds
  blocks r and 2cp-1-r of it (sizes differ by at most one, larger first; the pinned release's
  zigzag.py:150-160); interleave: packed token i goes to rank i % cp. A CP extend step with
  `cp_active == False` is the silent fallback of docs/sglang.md §5 and fails. ffn local:
  ffn_rows == attn_rows; gathered: ffn_rows == rows_in. Under attention DP an MLP that took the
  attention-DP buffer is judged by its DP rank's slice of it (`Step.dp_buffer`).
- replicated: every rank of a TP group saw the same rows in each step (and attn_rows == rows_in).

Findings: a *hard* violation (a position written twice or by the wrong rank, a wrong split) fails
whatever else is missing; a *hole* fails only when no evidence was truncated (a rank killed
mid-write would also leave holes), else unknown.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from cptest.contracts.base import Contract, Declared, Params, PlanContext, Syntax, Written, choice, invalid
from cptest.contracts.groups import (
    attention_batch_rows,
    attention_dp_size,
    groups,
    mlp_batch_rows,
    shard_identity_recorded,
    split_unseen,
    steps_by_number,
    zigzag_blocks,
)
from cptest.evidence import Evidence, RoleEvidence, ranges_len, ranges_merge, ranges_minus
from cptest.rank_records import KV_WRITE_UNMAPPED
from cptest.request_ids import count_by_origin, origin_note, workload_index
from cptest.topology import CP_STRATEGIES
from cptest.values import Ident, describe
from cptest.verdict import Verdict, failed, passed, unknown

NAME = "rows"
FFN_MODES = ("gathered", "local")
MODES = {"kv_owner": "dcp_owner", "split": "pcp_split", "replicated": "replicated"}
"""Declared mode -> the layout the checker verifies."""


class RowsExpect(Declared):
    mode: Literal["replicated", "kv_owner", "split"]
    modulus: int | None = None
    """kv_owner: KV position p is written only by DCP rank p % modulus (default: the topology's dcp)."""
    strategy: Literal["zigzag", "interleave"] | None = None
    ffn: Literal["gathered", "local"] | None = None

    @field_validator("modulus", mode="before")
    @classmethod
    def _modulus(cls, m: Any) -> Any:
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise invalid("kv_owner modulus must be an integer >= 1", found=describe(m))
        return m

    @field_validator("strategy", mode="before")
    @classmethod
    def _strategy(cls, s: Any) -> Any:
        return None if s is None else choice("split strategy", s, CP_STRATEGIES)

    @field_validator("ffn", mode="before")
    @classmethod
    def _ffn(cls, f: Any) -> Any:
        return None if f is None else choice("ffn row mode", f, FFN_MODES)


class RowsParams(Params):
    kind: Literal["rows"] = "rows"
    mode: Literal["dcp_owner", "pcp_split", "replicated"]
    dcp: int = 1
    cp: int = 1
    strategy: str | None = None
    ffn: Literal["gathered", "local"] | None = None
    interleave: int = 1
    """DCP interleave size (a release's `dcp_interleave_sizes` lists those it has)."""
    split_unobserved: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """pcp_split: why the probe cannot see this launch's split (`PlanContext.split_unobserved`)."""


def resolve(expect: RowsExpect, ctx: PlanContext) -> RowsParams:
    d = ctx.degrees
    mode = MODES[expect.mode]
    return RowsParams(mode=mode, dcp=expect.modulus or d.dcp, cp=d.attn_cp,
                      strategy=expect.strategy or d.cp_strategy, ffn=expect.ffn,
                      split_unobserved=ctx.split_unobserved if mode == "pcp_split" else None)


def check(evidence: Evidence, p: RowsParams) -> Verdict:
    role = p.role
    ev = evidence.role(role)
    if not ev.planned:
        return unknown(NAME, f"the plan has no {role} server")
    absent = [w for w in range(ev.world_size) if w not in ev.ranks]
    if absent:
        return unknown(
            NAME,
            f"no evidence from rank {absent[0]} of {role} (evidence/{role}/rank{absent[0]}.jsonl missing)",
            missing_ranks=absent,
        )
    if not any(r.steps for r in ev.ranks.values()):
        return unknown(NAME, f"no Step records from any rank of {role}: {_why_no_steps(ev)}")
    if p.mode == "dcp_owner":
        return _dcp_owner(ev, p.dcp, p.interleave)
    if p.mode == "pcp_split":
        if p.split_unobserved:
            return split_unseen(NAME, role, p.split_unobserved)
        return _pcp_split(ev, p.cp, p.strategy or "zigzag", p.ffn)
    return _replicated(ev)


REPLAYS_RECORDED_SINCE = 5
"""The evidence schema from which the probe records CUDA-graph replays as steps."""


def _why_no_steps(ev: RoleEvidence) -> str:
    """An older probe wrote no step for a replay; a current one writes every forward it sees."""
    versions = [g.v for r in ev.ranks.values() for g in r.geometry]
    if versions and max(versions) < REPLAYS_RECORDED_SINCE:
        return "per-step hooks do not fire on CUDA-graph replay; plan an eager run for row evidence"
    return "the probe saw no forward step"


def _truncated(ev: RoleEvidence, ranks: list[int]) -> list[int]:
    return [w for w in ranks if ev.ranks[w].dropped]


def _finish(
    violations: list[dict[str, Any]],
    holes: list[dict[str, Any]],
    truncated: list[int],
    figures: dict[str, Any],
    ok: str,
) -> Verdict:
    figures = {**figures, "violations": len(violations), "holes": len(holes)}
    if violations:
        v = violations[0]
        return failed(NAME, v["what"], first=v, **figures)
    if holes:
        h = holes[0]
        if truncated:
            return unknown(
                NAME,
                f"{h['what']}, but evidence of rank {truncated[0]} is truncated (killed mid-write?)",
                first=h,
                truncated_ranks=truncated,
                **figures,
            )
        return failed(NAME, h["what"], first=h, **figures)
    if truncated:
        return unknown(
            NAME,
            f"{ok}, but evidence of rank {truncated[0]} is truncated",
            truncated_ranks=truncated,
            **figures,
        )
    return passed(NAME, ok, **figures)


# ---------------------------------------------------------------- DCP: K/V owner
def _expected_end(ev: RoleEvidence) -> dict[int, tuple[int, int]]:
    """workload index -> (min end, max end) for completed requests."""
    if ev.runner is None:
        return {}
    by_index = {r.index: r for r in ev.runner.requests if r.status == "ok"}
    return {
        i: (r.prompt_len + len(r.output_ids) - 1, r.prompt_len + len(r.output_ids))
        for i, r in by_index.items()
    }


def _dcp_owner(ev: RoleEvidence, dcp: int, inter: int) -> Verdict:
    role = ev.role
    dcp_groups, source = groups(ev, "dcp")
    if not dcp_groups:
        return unknown(NAME, f"no DCP groups known for {role}")
    violations: list[dict[str, Any]] = []
    holes: list[dict[str, Any]] = []
    ends = _expected_end(ev)
    n_requests = n_positions = n_ranges = tail_checked = 0
    seen_rids: list[str] = []
    replayed_steps = padding = buffer_unseen = write_unseen_steps = 0
    unobserved_total = write_unseen_total = 0
    dp = attention_dp_size(ev)
    for group in dcp_groups:
        if len(group) != dcp:
            violations.append(
                {"what": f"DCP group {group} has {len(group)} ranks, expected {dcp}", "group": group}
            )
            continue
        written: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        # Positions computed in CUDA-graph replays: their K/V write and its owner mask ran inside
        # the graph, unobserved. Every rank of the group computes every query row under DCP,
        # so the union over the group is the set of positions no write of which could be seen.
        replayed: dict[str, list[tuple[int, int]]] = defaultdict(list)
        # Positions of an eager step whose write the probe saw but could not map onto its rows (on a
        # rank whose notes say so, the request is absent from `kv_written`): unobserved as well,
        # where no rank of the group was seen writing them. Elsewhere an absent request is a write
        # of nothing (the reference engine leaves empty ones out), and a position nobody wrote a hole.
        unmapped: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for d, world in enumerate(group):
            unmappable = any(n.message.endswith(KV_WRITE_UNMAPPED) for n in ev.ranks[world].notes)
            for step in ev.ranks[world].steps:
                if step.graph_rows is not None:
                    if d == 0:
                        replayed_steps += 1
                        padding += max(step.graph_rows - step.rows_in, 0)
                    for rid, rngs in step.seq_positions.items():
                        replayed[rid].extend(rngs)
                    continue
                mine = None if step.attn_rows is None else attention_batch_rows(step, step.attn_rows)[0]
                if mine is not None and mine != step.rows_in and dp > 1 and step.dp_buffer is None:
                    # Attention DP pads a DP rank's batch before attention; with no buffer recorded
                    # (an older archive's decode step) padding cannot be told from split queries.
                    buffer_unseen += 1
                elif mine is not None and mine != step.rows_in and len(violations) < 100:
                    violations.append(
                        {
                            "what": f"rank {world} computed attention for {step.attn_rows} of "
                            f"{step.rows_in} rows in step {step.step}: DCP must not split queries",
                            "rank": world,
                            "step": step.step,
                        }
                    )
                missed = [r for r in step.seq_positions if r not in step.kv_written] if unmappable else []
                if missed and step.mode in ("extend", "mixed", "decode"):
                    write_unseen_steps += 1
                    for rid in missed:
                        unmapped[rid].extend(step.seq_positions[rid])
                for rid, rngs in step.kv_written.items():
                    bucket = written[rid]
                    for a, b in rngs:
                        bucket.append((a, b, world))
                        # positions [a, b) all owned by DCP rank d <=> one interleave chunk whose owner is d
                        wrong = a // inter != (b - 1) // inter or (a // inter) % dcp != d
                        if wrong and dcp > 1 and len(violations) < 100:
                            pos = a if (a // inter) % dcp != d else (a // inter + 1) * inter
                            owner = (pos // inter) % dcp
                            violations.append(
                                {
                                    "what": f"request {rid}: position {pos} written by rank {world} "
                                    f"(DCP rank {d}), owner is DCP rank {owner} (rank {group[owner]})",
                                    "rid": rid,
                                    "position": pos,
                                    "rank": world,
                                    "owner_rank": group[owner],
                                }
                            )
        in_replays = {rid: ranges_merge(r) for rid, r in replayed.items()}
        unseen = dict(in_replays)
        for rid, rngs in unmapped.items():
            seen_written = ranges_merge((a, b) for a, b, _ in written.get(rid, ()))
            missing = ranges_minus(ranges_merge(rngs), seen_written)
            write_unseen_total += ranges_len(missing)
            unseen[rid] = ranges_merge([*unseen.get(rid, []), *missing])
        for rid in unseen.keys() - written.keys():
            written[rid] = []  # a request decoded only in replays: its prefill was not seen either
        for rid, items in written.items():
            n_requests += 1
            seen_rids.append(rid)
            n_ranges += len(items)
            items.sort()
            end = 0
            prev_rank = -1
            gaps = unseen.get(rid, [])
            unobserved_total += ranges_len(in_replays.get(rid, []))
            for a, b, world in items:
                end = _past_unobserved(end, a, gaps)
                if a < end:
                    if len(violations) < 100:
                        violations.append(
                            {
                                "what": f"request {rid}: position {a} written by rank {prev_rank} and "
                                f"rank {world}: every position must be written exactly once",
                                "rid": rid,
                                "position": a,
                                "ranks": [prev_rank, world],
                            }
                        )
                elif a > end and len(holes) < 100:
                    holes.append(
                        {
                            "what": f"request {rid}: positions [{end}, {a}) written by no rank of DCP "
                            f"group {group}",
                            "rid": rid,
                            "position": end,
                            "group": group,
                        }
                    )
                if b > end:
                    n_positions += b - max(a, end)
                    end = b
                    prev_rank = world
            end = _past_unobserved(end, None, gaps)
            index = workload_index(rid)
            if index is not None and index in ends:
                lo, hi = ends[index]
                tail_checked += 1
                if not lo <= end <= hi and len(holes) < 100:
                    holes.append(
                        {
                            "what": f"request {rid}: K/V written up to position {end}, the request has "
                            f"{lo} positions to write (prompt + output - 1)",
                            "rid": rid,
                            "position": end,
                        }
                    )
    if n_ranges == 0:
        why = (f"every step of {role} was a CUDA-graph replay, inside which the K/V write is not observable"
               if replayed_steps else "the probe did not see K/V writes")
        return unknown(NAME, f"no kv_written evidence from any rank of {role}: {why}",
                       replayed_steps=replayed_steps, unobserved_positions=unobserved_total)
    by_origin = count_by_origin(seen_rids)
    figures = {
        "mode": "dcp_owner",
        "dcp": dcp,
        "interleave": inter,
        "groups": len(dcp_groups),
        "groups_from": source,
        "requests": n_requests,
        "requests_by_origin": by_origin,
        "positions": n_positions,
        "tail_checked": tail_checked,
        # only where a replay was seen: an eager run's verdict stays what it was (archived verdicts
        # are compared whole by `cptest check`)
        **({"replayed_steps": replayed_steps, "unobserved_positions": unobserved_total,
            "padding_rows": padding} if replayed_steps else {}),
        **({"rank_steps_dp_buffer_unrecorded": buffer_unseen} if buffer_unseen else {}),
        **({"rank_steps_write_unmapped": write_unseen_steps, "positions_write_unmapped": write_unseen_total}
           if write_unseen_total else {}),
    }
    ok = (f"{n_positions} K/V positions of {n_requests} request(s) {origin_note(by_origin)} each written "
          f"once, by rank p % {dcp}") + (
        f" (interleave {inter})" if inter != 1 else ""
    ) + (f"; queries not judged in {buffer_unseen} rank-step(s) under attention DP: rows beyond the batch "
         "and no DP buffer recorded to say they are padding" if buffer_unseen else "")
    verdict = _finish(violations, holes, _truncated(ev, [w for g in dcp_groups for w in g]), figures, ok)
    if verdict.status == "pass" and write_unseen_total:
        return unknown(
            NAME,
            f"{ok}; {write_unseen_total} more position(s) in {write_unseen_steps} rank-step(s) were not seen "
            "written: the probe could not map the step's KV write onto its rows (its notes say why)",
            **verdict.figures,
        )
    if verdict.status == "pass" and unobserved_total:
        # What was seen is right, but the rule is claimed for every position: the ones written
        # inside graph replays stay unknown (the graph parity contract judges their numerics).
        return unknown(
            NAME,
            f"{ok}; {unobserved_total} more position(s) were written inside {replayed_steps} CUDA-graph "
            "replay step(s), where the DCP owner mask is computed inside the graph and not observable",
            **verdict.figures,
        )
    return verdict


def _past_unobserved(end: int, upto: int | None, gaps: list[tuple[int, int]]) -> int:
    """`end` moved over the replayed (unobserved) ranges that start at or before it, up to `upto`
    (the next observed write) when given: a run of positions computed only in graph replays is
    neither a hole nor a write."""
    for lo, hi in gaps:
        if lo <= end < hi:
            end = hi if upto is None else min(hi, max(upto, end))
    return end


# ---------------------------------------------------------------- PCP: row split
def _pcp_split(ev: RoleEvidence, cp: int, strategy: str, ffn: str | None) -> Verdict:
    if strategy not in CP_STRATEGIES:
        raise ValueError(f"unknown cp strategy {strategy!r} (known: zigzag, interleave)")
    role = ev.role
    cp_groups, source = groups(ev, "attn_cp")
    violations: list[dict[str, Any]] = []
    holes: list[dict[str, Any]] = []
    n_steps = n_rows = n_requests = ffn_checked = fallback_by_rule = identity_unrecorded = 0
    seen_rids: list[str] = []
    need_per_extend = 2 * cp if strategy == "zigzag" else cp
    for group in cp_groups:
        if len(group) != cp:
            violations.append(
                {"what": f"ATTN_CP group {group} has {len(group)} ranks, expected {cp}", "group": group}
            )
            continue
        # step -> per CP rank the Step record
        by_step: dict[int, list[Any]] = defaultdict(lambda: [None] * cp)
        for c, world in enumerate(group):
            for s in ev.ranks[world].steps:
                if s.mode in ("extend", "mixed"):
                    by_step[s.step][c] = s
        for step_no in sorted(by_step):
            recs = by_step[step_no]
            if any(r is None for r in recs):
                lacking = group[recs.index(None)]
                if len(holes) < 100:
                    holes.append(
                        {
                            "what": f"extend step {step_no}: no Step record from rank {lacking}",
                            "step": step_no,
                            "rank": lacking,
                        }
                    )
                continue
            n_steps += 1
            if any(r.cp_active is False for r in recs):
                # The batch's extend lengths; every CP rank reports the same batch.
                lens = list(next((r.extend_lens for r in recs if r.extend_lens), []))
                short = min(lens, default=None)
                # SGLang's rules: zigzag needs every extend >= 2*cp (zigzag.py:109-119), interleave
                # needs >= cp extend tokens in the batch (interleave.py:64-69).
                by_rule = (short is not None and short < need_per_extend) if strategy == "zigzag" else (
                    sum(lens) < cp)
                if by_rule:
                    # SGLang's own rule (zigzag.py:109-119): one short extend disables the split for
                    # the whole batch, e.g. its 1-3 token health-check request. Not a violation of
                    # this step; a workload whose every step falls back still fails below.
                    fallback_by_rule += 1
                    continue
                violations.append(
                    {
                        "what": f"extend step {step_no}: CP not active on rank "
                        f"{group[[r.cp_active for r in recs].index(False)]}, every rank computed all "
                        f"rows (silent fallback; shortest extend {short}, "
                        + (f"zigzag needs >= {2 * cp})" if strategy == "zigzag" else
                           f"interleave needs >= {cp} tokens in the batch)"),
                        "step": step_no,
                        "shortest_extend": short,
                    }
                )
                continue
            if ffn in ("local", "gathered"):
                for c, r in enumerate(recs):
                    if r.ffn_rows is None:
                        continue
                    ffn_checked += 1
                    want = r.attn_rows if ffn == "local" else r.rows_in
                    fed, what = mlp_batch_rows(r, r.ffn_rows)
                    if fed != want and len(violations) < 100:
                        violations.append(
                            {
                                "what": f"extend step {step_no}: rank {group[c]} fed {what} "
                                f"to the MLP, {ffn} FFN means {want}",
                                "step": step_no,
                                "rank": group[c],
                                "ffn_rows": r.ffn_rows,
                                "expected": want,
                            }
                        )
            if not all(shard_identity_recorded(r) for r in recs):
                identity_unrecorded += 1  # which rows each rank held is not known: not judged
                continue
            rids: dict[str, None] = {}
            for r in recs:
                rids.update(dict.fromkeys(r.seq_positions))
            for rid in rids:
                per_rank = [ranges_merge(r.seq_positions.get(rid, ())) for r in recs]
                counts = [ranges_len(x) for x in per_rank]
                union = ranges_merge(x for rr in per_rank for x in rr)
                total = ranges_len(union)
                n_requests += 1
                seen_rids.append(rid)
                n_rows += total
                if total != sum(counts):
                    pos = _first_overlap(per_rank)
                    violations.append(
                        {
                            "what": f"extend step {step_no}, request {rid}: position {pos} computed "
                            "by more than one CP rank",
                            "step": step_no,
                            "rid": rid,
                            "position": pos,
                        }
                    )
                    continue
                if len(union) != 1:
                    if len(holes) < 100:
                        holes.append(
                            {
                                "what": f"extend step {step_no}, request {rid}: positions "
                                f"[{union[0][1]}, {union[1][0]}) computed by no CP rank",
                                "step": step_no,
                                "rid": rid,
                                "position": union[0][1],
                            }
                        )
                    continue
                lo, hi = union[0]
                want = expected_split(strategy, lo, hi, cp, per_rank)
                for c in range(cp):
                    if per_rank[c] != want[c]:
                        violations.append(
                            {
                                "what": f"extend step {step_no}, request {rid}: rank {group[c]} "
                                f"(CP rank {c}) has positions {short_ranges(per_rank[c])}, {strategy} "
                                f"gives {short_ranges(want[c])}",
                                "step": step_no,
                                "rid": rid,
                                "rank": group[c],
                                "found": short_ranges(per_rank[c]),
                                "expected": short_ranges(want[c]),
                            }
                        )
                        break
    if n_steps == 0 and not violations:
        return unknown(NAME, f"no extend Step records from the ATTN_CP groups of {role}")
    if n_steps == fallback_by_rule and not violations:
        # SGLang did what its rule says for every step seen; whether it splits a long extend was
        # never put to the test (a workload of short prompts, or a server that died first).
        return unknown(NAME, f"no extend step could be split: each of {n_steps} held an extend shorter "
                             f"than {need_per_extend} tokens, where SGLang's rule is no split; the split "
                             "was never exercised", fallback_by_rule=fallback_by_rule, steps=n_steps,
                       cp=cp, strategy=strategy)
    # only where it happened: the figures of every archive judged before it was counted stay as they were
    unread = {"steps_identity_unrecorded": identity_unrecorded} if identity_unrecorded else {}
    figures = {
        "mode": "pcp_split",
        "fallback_by_rule": fallback_by_rule,
        **unread,
        "cp": cp,
        "strategy": strategy,
        "groups": len(cp_groups),
        "groups_from": source,
        "steps": n_steps,
        "request_extends": n_requests,
        "request_extends_by_origin": count_by_origin(seen_rids),
        "rows": n_rows,
        "ffn": ffn,
        "ffn_checked": ffn_checked,
    }
    if ffn in ("local", "gathered") and ffn_checked == 0 and not violations:
        return unknown(
            NAME, f"{ffn} FFN declared but no Step record carries ffn_rows (MLP hook missing?)", **figures
        )
    if n_requests == 0 and identity_unrecorded and not violations:
        return unknown(NAME, f"the split ran in {identity_unrecorded} extend step(s), but no rank's record "
                       "says which rows it held (its sharded positions were not read): the split is not "
                       "judged",
                       **figures)
    ok = (
        f"{n_rows} rows of {n_requests} request extend(s) {origin_note(count_by_origin(seen_rids))} "
        f"in {n_steps} step(s) "
        f"split by {strategy} over {cp} ranks"
        + (f" ({identity_unrecorded} split step(s) without the ranks' rows recorded, not judged)"
           if identity_unrecorded else "")
    )
    return _finish(violations, holes, _truncated(ev, [w for g in cp_groups for w in g]), figures, ok)


def expected_split(
    strategy: str, lo: int, hi: int, cp: int, per_rank: list[list[tuple[int, int]]]
) -> list[list[tuple[int, int]]]:
    """Per CP rank, the positions of the extend `[lo, hi)` of one request that `strategy` gives it;
    interleave reads where the request starts in the packed batch from the rank holding `lo` in
    `per_rank` (what the ranks computed), so one of them must hold it."""
    if strategy == "zigzag":
        return [ranges_merge((lo + a, lo + b) for a, b in zigzag_blocks(hi - lo, cp, c)) for c in range(cp)]
    # interleave: packed index i -> rank i % cp; the request's first token sits at packed offset `off`,
    # and the rank holding position lo tells off % cp.
    first = next(c for c in range(cp) if per_rank[c] and per_rank[c][0][0] == lo)
    out: list[list[tuple[int, int]]] = [[] for _ in range(cp)]
    for j in range(hi - lo):
        out[(first + j) % cp].append((lo + j, lo + j + 1))
    return [ranges_merge(x) for x in out]


def _first_overlap(per_rank: list[list[tuple[int, int]]]) -> int:
    items = sorted(x for rr in per_rank for x in rr)
    end = -1
    for a, b in items:
        if a < end:
            return a
        end = max(end, b)
    return -1


def short_ranges(r: list[tuple[int, int]]) -> str:
    """Ranges as a verdict prints them: the first four, then how many there are."""
    s = " ".join(f"[{a},{b})" for a, b in r[:4])
    return s + (f" ... ({len(r)} ranges)" if len(r) > 4 else "") if r else "none"


# ---------------------------------------------------------------- TP only: replicated rows
def _replicated(ev: RoleEvidence) -> Verdict:
    tp_groups, source = groups(ev, "tp")
    violations: list[dict[str, Any]] = []
    holes: list[dict[str, Any]] = []
    n_steps = n_rows = replayed_steps = padding = 0
    for group in tp_groups:
        by_step = steps_by_number(ev, group)
        for step_no in sorted(by_step):
            recs = by_step[step_no]
            lacking = [w for w in group if w not in recs]
            if lacking:
                if len(holes) < 100:
                    holes.append(
                        {
                            "what": f"step {step_no}: no Step record from rank {lacking[0]}",
                            "step": step_no,
                            "rank": lacking[0],
                        }
                    )
                continue
            n_steps += 1
            first = recs[group[0]]
            n_rows += first.rows_in
            if first.graph_rows is not None:
                replayed_steps += 1
                padding += max(first.graph_rows - first.rows_in, 0)
            for w in group:
                r = recs[w]
                if r.attn_rows is not None and r.attn_rows != r.rows_in:
                    violations.append(
                        {
                            "what": f"step {step_no}: rank {w} computed attention for {r.attn_rows} of "
                            f"{r.rows_in} rows; TP replicates rows",
                            "step": step_no,
                            "rank": w,
                        }
                    )
                    break
                if r.graph_rows != first.graph_rows:
                    violations.append(
                        {
                            "what": f"step {step_no}: rank {w} ran it "
                            f"{_how(r.graph_rows)}, rank {group[0]} {_how(first.graph_rows)}",
                            "step": step_no,
                            "rank": w,
                        }
                    )
                    break
                if r.rows_in != first.rows_in or r.seq_positions != first.seq_positions:
                    violations.append(
                        {
                            "what": f"step {step_no}: rank {w} saw other rows than rank {group[0]} "
                            f"({r.rows_in} vs {first.rows_in})",
                            "step": step_no,
                            "rank": w,
                        }
                    )
                    break
            if len(violations) >= 100:
                break
    figures = {
        "mode": "replicated",
        "groups": len(tp_groups),
        "groups_from": source,
        "steps": n_steps,
        "rows": n_rows,
        **({"replayed_steps": replayed_steps, "padding_rows": padding} if replayed_steps else {}),
    }
    ok = f"{n_rows} rows in {n_steps} step(s) seen by every rank of each TP group"
    if replayed_steps:
        ok += f" ({replayed_steps} of them CUDA-graph replays, {padding} padding rows apart)"
    return _finish(violations, holes, _truncated(ev, [w for g in tp_groups for w in g]), figures, ok)


def _how(graph_rows: int | None) -> str:
    return "eagerly" if graph_rows is None else f"as a CUDA-graph replay of {graph_rows} rows"


# Not `needs_eager`: replayed steps are recorded, so the plan leaves the scenario's graph
# mode as declared; what a replay hides (the owner mask) is unknown here, never assumed.
def _read_replicated(c: list[Any]) -> Written:
    return Written(NAME, {"mode": "replicated"})


def _read_kv_owner(c: list[Any]) -> Written:
    return Written(NAME, {"mode": "kv_owner", "modulus": c[0]})


def _read_split(c: list[Any]) -> Written:
    strategy, ffn = c
    parts = {"strategy": strategy} | ({"ffn": ffn} if ffn is not None else {})
    value = {"mode": "split", "strategy": Ident(strategy), "ffn": Ident(ffn) if ffn is not None else None}
    return Written(NAME, value, parts)


def _write(key: str, v: Mapping[str, Any], show: Callable[[Any], str]) -> str:
    if v["mode"] == "replicated":
        return "rows replicated"
    if v["mode"] == "kv_owner":
        return f"rows kv_owner position % {show(v['modulus'])}"
    return f"rows split {v['strategy']}" + (f" ffn {v['ffn']}" if v["ffn"] is not None else "")


SYNTAX = Syntax("rows", {"rows_replicated": _read_replicated, "rows_kv_owner": _read_kv_owner,
                        "rows_split": _read_split}, _write)

CONTRACT = Contract(NAME, 20, RowsExpect, RowsParams, resolve, check, SYNTAX, dumped_when_absent=True,
                    examples=("rows replicated", "rows kv_owner position % 2"))
