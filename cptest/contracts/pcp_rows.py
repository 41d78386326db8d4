"""pcp rows: what the prefill split leads to, row by row, on every rank of each ATTN_CP group.

    expect { pcp rows }

`rows split` judges how an extend's attention rows are split over the CP ranks; this contract judges
what the split hands on, in each extend step where the split ran (`cp_active`), from the Step records
of every rank of the group matched by `Step.step`:
- row order after the split: each request's attention shard (`seq_positions`) is the one the strategy
  gives over the request's extend (`rows.expected_split`), and every layer's attention took the same
  rows (`layer_rows["attn"]`, the padded shard);
- padding reported apart: the shard's identity holds exactly the logical rows (`attn_rows`, the CP
  metadata's `per_rank_logical_token`), no K/V is written for a position outside the batch, and a
  padded count seen (a layer's attention rows, a local MLP's rows) is the logical one or SGLang's
  padded length, `ceil(max(logical) / align) * align` with align `2 x cp` for zigzag and `cp` for
  interleave (layers/cp/padding.py:24-44); on a model's own CP-v1 split (`cp_v1`) attention runs over
  the logical rows and only the MoE gather pads them, to `max(logical)`;
- the MLP handoff: rows entering the MLP are this rank's shard (logical or padded) or the batch
  gathered back (`rows_in`, or every rank's padded shard, `cp x padded`: the MoE gather); with their
  identity recorded (`ffn_seq_positions`) they are the batch's positions; rows leaving it are its
  input rows or cut back to the shard, and every layer hands on the same counts;
- the gather before logits: every rank hands the logits processor the whole batch's rows
  (`logits_rows == rows_in`, or with attention DP the batch and its DP padding), not its shard;
- the attention-DP buffer, with attention DP declared (`Step.dp_buffer`): each rank told the other
  DP ranks its own batch (`tokens[dp rank] == rows_in`), every DP rank's slice holds its rows
  (`padded >= tokens`, all slices one length under `max_len`), the buffer is its slices
  (`rows == sum(padded)`), the CP ranks of one DP rank sized the same buffer, and an MLP fed across
  DP ranks takes the whole buffer. Steps are matched by number within an ATTN_CP group only: each
  DP rank vouches for its own slice, so no step numbering is assumed across DP ranks.
A field not recorded leaves its part unknown, never failed; with attention DP declared and its
buffer not recorded on every judged rank-step, the verdict is unknown and says so.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from cptest.contracts.base import Contract, Declared, Params, PlanContext, Syntax, Written
from cptest.contracts.groups import all_ranks, groups, shard_identity_recorded, split_unseen, steps_by_number
from cptest.contracts.rows import expected_split, short_ranges
from cptest.errors import PlanError, Problem
from cptest.evidence import Evidence, RoleEvidence, Step, ranges_len, ranges_merge
from cptest.verdict import Verdict, failed, passed, unknown

NAME = "pcp_rows"
MAX_FINDINGS = 100


class PcpRowsExpect(Declared):
    pass


class PcpRowsParams(Params):
    kind: Literal["pcp_rows"] = "pcp_rows"
    cp: int
    strategy: Literal["zigzag", "interleave"]
    attn_dp: int = 1
    split_unobserved: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """Why the probe cannot see this launch's split (`PlanContext.split_unobserved`)."""
    cp_v1: bool = Field(default=False, exclude_if=lambda v: not v)
    """The split runs on a model's own CP-v1 path (`PlanContext.cp_v1`): no padding to the
    alignment, the MoE gather pads every shard to the longest (layers/communicator.py:1247-1273)."""


def resolve(expect: PcpRowsExpect, ctx: PlanContext) -> PcpRowsParams:
    d = ctx.degrees
    if not d.pcp or d.cp_strategy not in ("zigzag", "interleave"):
        raise PlanError(Problem(expect.span, "pcp rows needs prefill context parallelism: the topology has "
                                f"attn_cp {d.attn_cp}, prefill_cp {str(d.prefill_cp).lower()}, cp_strategy "
                                f"{d.cp_strategy}",
                                expected="attn_cp > 1 with cp_strategy zigzag|interleave"))
    return PcpRowsParams(cp=d.attn_cp, strategy=d.cp_strategy, attn_dp=d.attn_dp,  # type: ignore[arg-type]
                         split_unobserved=ctx.split_unobserved, cp_v1=ctx.cp_v1)


def padded_len(logical: list[int], cp: int, strategy: str, *, cp_v1: bool = False) -> int:
    """SGLang's physical rows per CP rank of one batch: on CP v2 the longest logical shard rounded up
    to the strategy's alignment (layers/cp/padding.py:24-44); on a CP-v1 path the longest shard, the
    length the MoE gather pads to (layers/communicator.py:1247-1273; attention runs unpadded)."""
    if cp_v1:
        return max(logical)
    align = 2 * cp if strategy == "zigzag" else cp
    return -(-max(logical) // align) * align


@dataclass
class _Tally:
    findings: list[str] = field(default_factory=list)
    steps: int = 0
    not_split: int = 0
    requests: int = 0
    padding: int = 0
    """Padding rows SGLang's rule adds over the judged rank-steps (physical - logical)."""
    dp_padding: int = 0
    """Padding rows of the attention-DP buffers over the judged rank-steps (padded - tokens)."""
    seen: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("layers", "padded_count", "ffn_rows", "ffn_identity", "ffn_out_rows", "logits_rows"), 0))
    """Part -> rank-steps in which its evidence was recorded (`dp_buffer` with attention DP declared)."""
    ffn_modes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    identity: int = 0
    """Rank-steps whose shard identity (`seq_positions`) was read. Apart from `seen`, whose every part
    the figures list: a part new to them would change the figures of every archive judged before."""

    def fail(self, what: str) -> None:
        if len(self.findings) < MAX_FINDINGS:
            self.findings.append(what)


def check(evidence: Evidence, p: PcpRowsParams) -> Verdict:
    ev = evidence.role(p.role)
    ranks = all_ranks(ev, NAME)
    if isinstance(ranks, Verdict):
        return ranks
    if p.split_unobserved:
        return split_unseen(NAME, p.role, p.split_unobserved)
    cp_groups, source = groups(ev, "attn_cp")
    if not cp_groups:
        return unknown(NAME, f"no ATTN_CP groups known for {p.role}")
    t = _Tally()
    if p.attn_dp > 1:
        t.seen["dp_buffer"] = 0
    for group in cp_groups:
        if len(group) != p.cp:
            t.fail(f"ATTN_CP group {group} has {len(group)} ranks, expected {p.cp}")
            continue
        for recs in _split_steps(ev, group, t):
            _judge_step(recs, group, p, t)
    rank_steps = t.steps * p.cp
    unrecorded = (["identity"] if t.identity < rank_steps else []) + [
        part for part, n in t.seen.items() if n < rank_steps]
    dp_figures = {"dp_padding_rows": t.dp_padding} if p.attn_dp > 1 else {}
    figures: dict[str, Any] = {
        "cp": p.cp, "strategy": p.strategy, "groups": len(cp_groups), "groups_from": source,
        "steps": t.steps, "steps_not_split": t.not_split, "request_extends": t.requests,
        "padding_rows": t.padding, **dp_figures, "recorded_rank_steps": dict(t.seen),
        "ffn_modes": dict(t.ffn_modes),
        "not_judged": unrecorded, "findings": len(t.findings),
    }
    if t.findings:
        return failed(NAME, t.findings[0], first=t.findings[:5], **figures)
    if not t.steps:
        return unknown(NAME, f"no extend step of {p.role} ran the prefill split on every rank of an ATTN_CP "
                       f"group ({t.not_split} extend step(s) not split): nothing to judge", **figures)
    if not t.identity:
        return unknown(NAME, f"the split ran in {t.steps} extend step(s), but no rank's record says which "
                       "rows it held (its sharded positions were not read): the shards' order is not judged",
                       **figures)
    ok = (f"{t.requests} request extend(s) in {t.steps} split step(s): each shard in {p.strategy} order, "
          f"{t.padding} padding row(s) kept out of the rows' identity and K/V, the MLP fed "
          f"{'/'.join(sorted(t.ffn_modes)) or 'unobserved rows'} and the whole batch handed to the logits")
    if p.attn_dp > 1:
        if t.seen["dp_buffer"] < rank_steps:
            return unknown(NAME, f"{ok}; the attention-DP buffer is recorded in {t.seen['dp_buffer']} of "
                           f"{rank_steps} rank-step(s), so attention DP {p.attn_dp} is not judged", **figures)
        ok += (f"; each DP rank's slice of the attention-DP buffer held its batch, {t.dp_padding} DP padding "
               "row(s) apart")
    if unrecorded:
        ok += f" (not recorded, so not judged, in some steps: {', '.join(unrecorded)})"
    return passed(NAME, ok, **figures)


def _split_steps(ev: RoleEvidence, group: list[int], t: _Tally) -> list[list[Step]]:
    """The group's eager extend steps where every CP rank ran the split, each as its ranks' records."""
    by_step = steps_by_number(ev, group, lambda s: s.mode in ("extend", "mixed") and not s.replayed)
    out = []
    for step_no in sorted(by_step):
        recs = by_step[step_no]
        if len(recs) == len(group) and all(s.cp_active for s in recs.values()):
            out.append([recs[w] for w in group])
        else:
            t.not_split += 1  # a fallback or a missing rank: `rows split` judges those
    return out


def _batch(s: Step) -> dict[str, tuple[int, int]] | None:
    """Request id -> its extend `[prefix, prefix + extend)`, from the step's batch; None when the
    batch's lengths are not recorded per request."""
    rids = list(s.ffn_seq_positions or {}) or list(s.seq_positions)
    if len(s.extend_lens) != s.batch_size or len(s.prefix_lens) != s.batch_size or len(rids) != s.batch_size:
        return None
    return {rid: (pre, pre + n) for rid, pre, n in zip(rids, s.prefix_lens, s.extend_lens, strict=True)}


def _judge_step(recs: list[Step], group: list[int], p: PcpRowsParams, t: _Tally) -> None:
    t.steps += 1
    first = recs[0]
    step = f"extend step {first.step}"
    logical = [s.attn_rows for s in recs]
    physical = padded_len([n for n in logical if n is not None] or [0], p.cp, p.strategy, cp_v1=p.cp_v1)
    batch = _batch(first)
    identity = all(shard_identity_recorded(s) for s in recs)
    if identity:
        t.identity += len(recs)
        _order(recs, group, p, batch, step, t)
    buffers = [s.dp_buffer for s in recs if s.dp_buffer is not None]
    if any(b != buffers[0] for b in buffers):
        t.fail(f"{step}: the CP ranks {group} of one DP rank sized different attention-DP buffers "
               f"({', '.join(f'{b.rows} rows' for b in buffers)}): one batch, one buffer")
    for c, s in enumerate(recs):
        world = group[c]
        where = f"{step}: rank {world} (CP rank {c})"
        mine = logical[c]
        shown = sum(ranges_len(r) for r in s.seq_positions.values())
        if mine is not None:
            t.padding += physical - mine
            if identity and shown != mine:
                t.fail(f"{where} names {shown} rows in its attention shard, its logical shard is {mine}: "
                       "padding rows are reported apart, never as rows")
        for rid, rs in s.kv_written.items():
            span = (batch or {}).get(rid)
            if span is not None and ranges_merge(rs) and not (span[0] <= rs[0][0] and rs[-1][1] <= span[1]):
                t.fail(f"{where} wrote K/V of request {rid} outside its extend [{span[0]}, {span[1]}): "
                       "a padding row written to the pool")
        # a CP-v1 attention runs over the rank's own rows: only the MoE gather pads them
        shard = {mine} if p.cp_v1 and mine is not None else {n for n in (mine, physical) if n is not None}
        own = _dp_buffer(s, where, p, t)
        _layers(s, where, shard, physical, t)
        _ffn(s, where, shard, p.cp * physical, batch, t)
        if s.logits_rows is not None:
            t.seen["logits_rows"] += 1
            if s.logits_rows not in (s.rows_in, own):
                t.fail(f"{where} handed {s.logits_rows} rows to the logits processor, the batch has "
                       f"{s.rows_in}: the shards were not gathered before the LM head")


def _dp_buffer(s: Step, where: str, p: PcpRowsParams, t: _Tally) -> int | None:
    """The attention-DP buffer the rank's step sized: its own slice says its batch, every slice
    holds its DP rank's rows, the buffer is its slices. Returns this rank's padded slice length
    (the batch as its forward ran it), None where the buffer is not recorded."""
    b = s.dp_buffer
    if b is None or p.attn_dp < 2:
        return None
    t.seen["dp_buffer"] += 1
    dp = s.rank.attn_dp
    if len(b.tokens) != p.attn_dp or len(b.padded) != p.attn_dp:
        t.fail(f"{where}: its attention-DP buffer has {len(b.tokens)} DP slices, attention DP is {p.attn_dp}")
        return None
    t.dp_padding += sum(b.padded) - sum(b.tokens)
    if b.tokens[dp] != s.rows_in:
        t.fail(f"{where} (DP rank {dp}) gave the other DP ranks {b.tokens[dp]} rows as its batch, its batch "
               f"has {s.rows_in}")
    short = next((i for i, (n, q) in enumerate(zip(b.tokens, b.padded, strict=True)) if q < n), None)
    if short is not None:
        t.fail(f"{where}: DP rank {short}'s slice of the attention-DP buffer holds {b.padded[short]} rows "
               f"for its {b.tokens[short]}: rows of its batch left out of the MLP")
    if b.rows != sum(b.padded):
        t.fail(f"{where}: the attention-DP buffer has {b.rows} rows, its slices {b.padded} add up to "
               f"{sum(b.padded)}")
    if b.mode == "max_len" and len(set(b.padded)) > 1:
        t.fail(f"{where}: under max_len every DP slice is the longest, its slices are {b.padded}")
    return b.padded[dp]


def _order(recs: list[Step], group: list[int], p: PcpRowsParams, batch: dict[str, tuple[int, int]] | None,
           step: str, t: _Tally) -> None:
    """Each request's shard on each CP rank against the strategy's split of its extend."""
    rids: dict[str, None] = {}
    for s in recs:
        rids.update(dict.fromkeys(s.seq_positions))
    for rid in rids:
        t.requests += 1
        per_rank = [ranges_merge(s.seq_positions.get(rid, ())) for s in recs]
        union = ranges_merge(x for rr in per_rank for x in rr)
        lo, hi = (batch or {}).get(rid) or (union[0][0], union[-1][1])
        if not any(rr and rr[0][0] == lo for rr in per_rank):
            t.fail(f"{step}, request {rid}: no CP rank holds its first position {lo}")
            continue
        want = expected_split(p.strategy, lo, hi, p.cp, per_rank)
        for c in range(p.cp):
            if per_rank[c] != want[c]:
                t.fail(f"{step}, request {rid}: rank {group[c]} (CP rank {c}) holds "
                       f"{short_ranges(per_rank[c])}, {p.strategy} over [{lo}, {hi}) gives "
                       f"{short_ranges(want[c])}")
                break


def _layers(s: Step, where: str, shard: set[int], physical: int, t: _Tally) -> None:
    """Every layer's attention rows: the first layer's, the logical or the padded shard."""
    if s.layers is not None:
        t.seen["layers"] += 1
    per_layer = (s.layer_rows or {}).get("attn")
    if per_layer is None and s.attn_rows_padded is not None:
        per_layer = [s.attn_rows_padded]  # every layer the first's: the padded count the probe kept
    if per_layer is None:
        return
    t.seen["padded_count"] += 1
    if len(set(per_layer)) > 1:
        k = next(k for k, n in enumerate(per_layer) if n != per_layer[0])
        t.fail(f"{where}: layer {k}'s attention took {per_layer[k]} rows, layer 0's {per_layer[0]}: every "
               "layer attends over the same shard")
    elif per_layer[0] not in shard:
        t.fail(f"{where}: its attention took {per_layer[0]} rows, neither its logical shard nor the "
               f"padded length {physical} of SGLang's rule")


def _ffn(s: Step, where: str, shard: set[int], gathered_padded: int, batch: dict[str, tuple[int, int]] | None,
         t: _Tally) -> None:
    """The rows entering and leaving the MLP: this rank's shard, or the batch gathered back."""
    if s.ffn_rows is None:
        return
    t.seen["ffn_rows"] += 1
    modes = {s.rows_in: "gathered", gathered_padded: "gathered (padded)"}
    modes.update(dict.fromkeys(shard, "local"))
    if s.dp_buffer is not None:
        modes[s.dp_buffer.rows] = "the attention-DP buffer"
    mode = modes.get(s.ffn_rows)
    if mode is None:
        sizes = "/".join(map(str, sorted(shard)))
        dp = f", nor the attention-DP buffer ({s.dp_buffer.rows})" if s.dp_buffer is not None else ""
        t.fail(f"{where} fed {s.ffn_rows} rows to the MLP: neither its shard ({sizes}) "
               f"nor the batch gathered back ({s.rows_in}, or {gathered_padded} with every shard's "
               f"padding){dp}")
        return
    t.ffn_modes[mode] += 1
    if s.ffn_seq_positions is not None:
        t.seen["ffn_identity"] += 1
        want = {rid: [span] for rid, span in (batch or {}).items()}
        if batch is not None and {r: ranges_merge(x) for r, x in s.ffn_seq_positions.items()} != want:
            t.fail(f"{where}: the rows entering the MLP are not the batch's positions")
    out_ok = {s.ffn_rows, *shard}
    if s.ffn_out_rows is not None:
        t.seen["ffn_out_rows"] += 1
        if s.ffn_out_rows not in out_ok:
            t.fail(f"{where}: {s.ffn_out_rows} rows left the MLP, which took {s.ffn_rows}: neither its rows "
                   "nor cut back to the shard")
    if s.ffn_out_seq_positions is not None and s.ffn_out_seq_positions not in (s.ffn_seq_positions,
                                                                                  s.seq_positions):
        t.fail(f"{where}: the rows leaving the MLP are neither its input rows nor the shard")
    for part, first in (("ffn", s.ffn_rows), ("ffn_out", s.ffn_out_rows)):
        per_layer = (s.layer_rows or {}).get(part)  # type: ignore[call-overload]
        if per_layer and any(n != first for n in per_layer):
            k = next(k for k, n in enumerate(per_layer) if n != first)
            t.fail(f"{where}: layer {k} has {per_layer[k]} {part} rows, layer 0 {first}: every layer hands "
                   "the MLP the same rows")


def _read(c: list[Any]) -> Written:
    return Written(NAME, {})


def _write(key: str, v: Mapping[str, Any], show: Callable[[Any], str]) -> str:
    return "pcp rows"


SYNTAX = Syntax("pcp", {"pcp_rows": _read}, _write)

CONTRACT = Contract(NAME, 24, PcpRowsExpect, PcpRowsParams, resolve, check, SYNTAX, examples=("pcp rows",))
