"""dcp handoff: what every rank of a DCP group hands on after attention, and that each rank's attention
read exactly the KV rows of its own share.

    expect { dcp handoff }

Under decode context parallelism queries are not split: each DCP rank attends over its share of the
KV (position p is held by DCP rank `p % dcp`, at its pool row `out_cache_loc // dcp`), the partial
outputs are merged across the group (LSE), then `o_proj`; every rank of the group then hands the
same rows to the MLP. Evidence: the Step records of every rank of the role; the ranks of a group are
matched by `Step.step`.

- Rows, every layer: on each DCP rank the rows entering attention, entering the MLP and leaving it
  are the whole batch (`attn_rows`, `ffn_rows`, `ffn_out_rows` == `rows_in`, and per layer through
  `layer_rows`; under attention DP, attention's rows are the DP rank's padded slice of the buffer
  and the MLP's the whole buffer, `groups.attention_batch_rows` and `mlp_batch_rows`), with the same
  requests and positions on every rank of the group at that step
  (`seq_positions`; the MLP's `ffn_seq_positions` / `ffn_out_seq_positions`, None: the attention's).
- KV, write to read: in each decode step that records `kv_read`, the rows a rank read for a request
  hold, as last written by that rank (its earlier `kv_slots`), exactly the positions it owns of the
  request, `{p < seq_len : p % dcp == dcp_rank}` (as many as SGLang's `get_dcp_lens`). A prefix row
  written by an earlier request at the same position is fine (prefix caching), and counted.

A field not recorded (an older archive, a CUDA-graph replay) leaves its part unknown, never failed. A
read row whose last write was not observed (written in a replay, or by a step whose slots were not
recorded) leaves that request's step unknown; a row holding another position, another rank's
position, a position past the request or a position held twice, or an owned position not read, fails.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cptest.contracts.base import Contract, Declared, Params, PlanContext, Syntax, Written
from cptest.contracts.groups import (
    all_ranks,
    attention_batch_rows,
    attention_dp_size,
    groups,
    mlp_batch_rows,
    steps_by_number,
)
from cptest.errors import PlanError, Problem
from cptest.evidence import Evidence, RoleEvidence, Step, ranges_iter, ranges_merge, slot_pairs
from cptest.topology import dcp_local_positions, dcp_owner
from cptest.verdict import Verdict, failed, passed, unknown

NAME = "dcp_handoff"
MAX_FINDINGS = 100


class DcpHandoffExpect(Declared):
    pass


class DcpHandoffParams(Params):
    kind: Literal["dcp_handoff"] = "dcp_handoff"
    dcp: int


def resolve(expect: DcpHandoffExpect, ctx: PlanContext) -> DcpHandoffParams:
    if ctx.degrees.dcp <= 1:
        raise PlanError(Problem(expect.span, "dcp handoff needs decode context parallelism: the topology "
                                f"has dcp {ctx.degrees.dcp}", expected="dcp > 1 in the topology"))
    return DcpHandoffParams(dcp=ctx.degrees.dcp)


@dataclass
class _Tally:
    findings: list[str] = field(default_factory=list)
    row_steps: int = 0
    layers: int = 0
    rows_unseen: int = 0
    """Rank-steps whose rows (a replay's inside, an older archive's MLP) were not all observed."""
    reads: int = 0
    """(rank, decode step, request) reads judged."""
    read_rows: int = 0
    from_prefix: int = 0
    """Read rows last written by another request at the same position (a shared prefix)."""
    unknown_reads: Counter[str] = field(default_factory=Counter)
    unrecorded: Counter[str] = field(default_factory=Counter)
    """Part -> rank-steps compared without its row count recorded (an older archive: first layer only,
    no MLP output)."""
    buffer_unseen: int = 0
    """Rank-steps under attention DP whose row counts differ from the batch with no attention-DP
    buffer recorded to say which rows are padding (an older archive's decode steps): not judged."""

    def fail(self, what: str) -> None:
        if len(self.findings) < MAX_FINDINGS:
            self.findings.append(what)


def check(evidence: Evidence, p: DcpHandoffParams) -> Verdict:
    ev = evidence.role(p.role)
    ranks = all_ranks(ev, NAME)
    if isinstance(ranks, Verdict):
        return ranks
    if not any(ev.ranks[w].steps for w in ranks):
        return unknown(NAME, f"no Step records from any rank of {p.role}")
    dcp_groups, source = groups(ev, "dcp")
    if not dcp_groups:
        return unknown(NAME, f"no DCP groups known for {p.role}")
    tally = _Tally()
    for group in dcp_groups:
        if len(group) != p.dcp:
            tally.fail(f"DCP group {group} has {len(group)} ranks, expected {p.dcp}")
            continue
        _rows(ev, group, tally, attention_dp_size(ev))
        for d, world in enumerate(group):
            _reads(ev.ranks[world].steps, world, d, p.dcp, tally)
    figures: dict[str, Any] = {
        "dcp": p.dcp, "groups": len(dcp_groups), "groups_from": source,
        "steps_compared": tally.row_steps, "layers_compared": tally.layers,
        "rank_steps_rows_unseen": tally.rows_unseen, "reads_judged": tally.reads,
        "rows_read": tally.read_rows, "rows_from_another_request": tally.from_prefix,
        "reads_unknown": dict(tally.unknown_reads), "rank_steps_unrecorded": dict(tally.unrecorded),
        "findings": len(tally.findings),
    }
    if tally.buffer_unseen:
        figures["rank_steps_dp_buffer_unrecorded"] = tally.buffer_unseen
    if tally.findings:
        return failed(NAME, tally.findings[0], first=tally.findings[:5], **figures)
    if not tally.row_steps and not tally.reads:
        return unknown(NAME, f"nothing to judge on {p.role}: no step with every DCP rank's rows and no "
                       "decode step that records the KV rows it read" + _why_unknown(tally), **figures)
    depth = f" ({tally.layers} layer forward(s))" if tally.layers else " (first layer only)"
    rows = (f"{tally.row_steps} step(s){depth}: every DCP rank handed the whole batch, the same requests "
            "and positions, to attention and the MLP")
    if tally.unrecorded:
        rows += " (not recorded: " + ", ".join(f"{part} in {n} rank-step(s)"
                                               for part, n in tally.unrecorded.most_common()) + ")"
    if tally.buffer_unseen:
        rows += (f" ({tally.buffer_unseen} rank-step(s) under attention DP not judged: rows beyond the "
                 "batch and no DP buffer recorded to say they are padding)")
    reads = (f"{tally.reads} decode read(s) of {tally.read_rows} KV row(s) held exactly the positions "
             f"p % {p.dcp} of their rank ({tally.from_prefix} row(s) written by an earlier request)")
    if not tally.row_steps:
        return unknown(NAME, f"{reads}; the rows handed on were not observed", **figures)
    if not tally.reads:
        return unknown(NAME, f"{rows}; no decode step's KV read could be judged" + _why_unknown(tally),
                       **figures)
    if tally.unknown_reads:
        return passed(NAME, f"{rows}; {reads}" + _why_unknown(tally), **figures)
    return passed(NAME, f"{rows}; {reads}", **figures)


def _why_unknown(t: _Tally) -> str:
    if not t.unknown_reads:
        return ""
    return " (not judged: " + ", ".join(f"{n} {why}" for why, n in t.unknown_reads.most_common()) + ")"


# ---------------------------------------------------------------- rows handed on, every layer
def _rows(ev: RoleEvidence, group: list[int], t: _Tally, dp: int) -> None:
    by_step = steps_by_number(ev, group)
    for step_no in sorted(by_step):
        recs = by_step[step_no]
        if len(recs) != len(group) or any(s.replayed for s in recs.values()):
            continue  # a rank without the step, or a replay: what ran inside is not observed
        first = recs[group[0]]
        judged = True
        for world, s in recs.items():
            judged &= _counts(s, world, t, dp)
            if s.seq_positions != first.seq_positions:
                t.fail(f"step {step_no}: rank {world} computed attention for other requests or positions "
                       f"than rank {group[0]}: DCP ranks must see the same rows")
            for part, seen in (("entering", s.ffn_seq_positions), ("leaving", s.ffn_out_seq_positions)):
                if seen is not None and _merged(seen) != _merged(s.seq_positions):
                    t.fail(f"step {step_no}: rank {world}'s rows {part} the MLP are not its attention rows")
        if judged:
            t.row_steps += 1
            t.layers += first.layers or 0  # layers the step recorded; none on older evidence
        else:
            t.rows_unseen += 1


def _counts(s: Step, world: int, t: _Tally, dp: int) -> bool:
    """The row counts of `s` against its batch (findings into `t`); False when neither the rows
    entering attention nor those entering the MLP were observed, or when under attention DP (`dp` >
    1) a count differs from the batch and no DP buffer says how much of it is padding. A part not
    recorded is counted."""
    seen = False
    counts = (("attention", s.attn_rows), ("the MLP", s.ffn_rows), ("the MLP's output", s.ffn_out_rows))
    for part, n in counts:
        if n is None:
            t.unrecorded[part] += 1
            continue
        seen |= part != "the MLP's output"
        mine, what = attention_batch_rows(s, n) if part == "attention" else mlp_batch_rows(s, n)
        if mine != s.rows_in and dp > 1 and s.dp_buffer is None:
            t.buffer_unseen += 1
            return False
        if mine != s.rows_in:
            t.fail(f"step {s.step}: rank {world} handed {what} of its batch's {s.rows_in} to {part}: "
                   "DCP must not split rows")
    for part, per_layer in (s.layer_rows or {}).items():
        mine = [(attention_batch_rows if part == "attn" else mlp_batch_rows)(s, n)[0] for n in per_layer]
        wrong = [k for k, n in enumerate(mine) if n != s.rows_in]
        if wrong:
            t.fail(f"step {s.step}: rank {world}'s layer {wrong[0]} ran {per_layer[wrong[0]]} {part} rows "
                   f"of the batch's {s.rows_in}: every layer hands on the whole batch")
    if s.layers is None:
        t.unrecorded["every layer (layers)"] += 1
    return seen


def _merged(m: Mapping[str, list[tuple[int, int]]]) -> dict[str, list[tuple[int, int]]]:
    return {rid: ranges_merge(r) for rid, r in m.items() if r}


# ---------------------------------------------------------------- KV rows: written, then read
@dataclass(frozen=True)
class _Held:
    position: int
    rid: str
    step: int


def _reads(steps: list[Step], world: int, d: int, dcp: int, t: _Tally) -> None:
    """Replay this rank's KV writes in step order and judge each decode step's reads against them."""
    held: dict[int, _Held] = {}
    unseen_writes: list[int] = []
    """Steps in which this rank wrote K/V rows the evidence does not name."""
    for s in sorted(steps, key=lambda x: x.step):
        if _observed_writes(s, d, dcp):
            for rid, runs in s.kv_slots.items():
                for pos, row in slot_pairs(runs, s.kv_written.get(rid, [])):
                    held[row] = _Held(pos, rid, s.step)
        else:
            unseen_writes.append(s.step)
        if s.mode != "decode" or not s.kv_read:
            continue
        for rid, rows in s.kv_read.items():
            _judge_read(s, world, d, dcp, rid, list(ranges_iter(rows)), held, unseen_writes, t)


def _observed_writes(s: Step, d: int, dcp: int) -> bool:
    """Whether every K/V write of this step on this rank is named by its `kv_slots`: a replay's are
    not; an eager step's are when the slots cover each request's positions this rank owns."""
    if s.replayed:
        return False
    for rid, rs in s.seq_positions.items():
        owned = [p for p in ranges_iter(rs) if dcp_owner(p, dcp) == d]
        if owned and len(slot_pairs(s.kv_slots.get(rid, []), s.kv_written.get(rid, []))) < len(owned):
            return False
    return True


def _judge_read(s: Step, world: int, d: int, dcp: int, rid: str, rows: list[int], held: dict[int, _Held],
                unseen_writes: list[int], t: _Tally) -> None:
    where = f"decode step {s.step}, rank {world} (DCP rank {d}), request {rid}"
    if rid not in s.seq_positions or not s.seq_positions[rid]:
        t.unknown_reads["read(s) of a request without its position"] += 1
        return
    seq_len = s.seq_positions[rid][-1][1]
    owned = dcp_local_positions(seq_len, d, dcp)
    positions: Counter[int] = Counter()
    blind = 0
    for row in rows:
        h = held.get(row)
        if h is None or any(h.step < u <= s.step for u in unseen_writes):
            blind += 1  # written where the evidence does not name the row (a replay, unrecorded slots)
            continue
        positions[h.position] += 1
        if h.rid != rid:
            t.from_prefix += 1
        owner = dcp_owner(h.position, dcp)
        if owner != d:
            t.fail(f"{where}: row {row} holds position {h.position}, of DCP rank {owner}'s share")
        elif h.position >= seq_len:
            t.fail(f"{where}: row {row} holds position {h.position}, past the request's {seq_len} tokens")
    twice = sorted(p for p, n in positions.items() if n > 1)
    if twice:
        t.fail(f"{where}: position {twice[0]} read from {positions[twice[0]]} rows")
    if blind:
        t.unknown_reads["read(s) of a row whose last write was not observed"] += 1
        return
    missing = [p for p in owned if p not in positions]
    if missing:
        t.fail(f"{where}: read {len(rows)} rows, the rank owns {len(owned)} positions of "
               f"{seq_len}; position {missing[0]} was not read")
    t.reads += 1
    t.read_rows += len(rows)


def _read(c: list[Any]) -> Written:
    return Written(NAME, {})


def _write(key: str, v: Mapping[str, Any], show: Callable[[Any], str]) -> str:
    return "dcp handoff"


SYNTAX = Syntax("dcp", {"dcp_handoff": _read}, _write)

CONTRACT = Contract(NAME, 22, DcpHandoffExpect, DcpHandoffParams, resolve, check, SYNTAX,
                    examples=("dcp handoff",))
