"""capacity adapter: what an elastic KV-cache layer above the engine must translate, and that the
translation holds.

    expect { capacity adapter }

A layer that grows and shrinks KV capacity (or routes requests by free capacity) reads the engine's
reported capacity: the scheduler's `max_total_num_tokens` on every rank, `/server_info`, the
`max_total_num_tokens=` log line. What the DCP group really holds is the allocator's token space over
each rank's pool (`KvPool.allocator_size`, rows x dcp). The contract finds the one factor `f` that
maps every reported figure onto the allocator's slots: `f = 1` when the engine reports logical
capacity, `f = dcp` when it reports each rank's rows (as the `capacity` contract's FAIL on a per-rank
report shows). Then it checks what an adapter derives from that translation:
- page granularity: the allocator hands out pages of `page_size x dcp` tokens (each rank's page of
  `page_size` rows holds every dcp-th position), which is the unit radix-cache matching and paged
  admission count in;
- the longest request: `min(context_len, allocator slots)` tokens, and no served request is longer.

It fails when no single factor maps every surface onto the allocator (an adapter would have nothing
consistent to translate) or when the page granularity is not `page_size x dcp`; it is unknown where
the pool, the scheduler's figure or the allocator's size was not recorded. A surface not recorded
(the log line, `/server_info`) is listed under `not_seen`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from cptest.contracts.base import Contract, Declared, Params, PlanContext, Syntax, Written
from cptest.contracts.capacity import (
    LogPatterns,
    log_patterns_of,
    logged_totals,
    missing_records,
    server_info_tokens,
)
from cptest.contracts.groups import all_ranks
from cptest.evidence import Evidence
from cptest.verdict import Verdict, failed, passed, unknown

NAME = "capacity_adapter"


class CapacityAdapterExpect(Declared):
    pass


class CapacityAdapterParams(Params):
    kind: Literal["capacity_adapter"] = "capacity_adapter"
    dcp: int
    log_patterns: LogPatterns


def resolve(expect: CapacityAdapterExpect, ctx: PlanContext) -> CapacityAdapterParams:
    return CapacityAdapterParams(dcp=ctx.degrees.dcp, log_patterns=log_patterns_of(ctx.engine, ctx.facts))


def check(evidence: Evidence, p: CapacityAdapterParams) -> Verdict:
    role, dcp = p.role, p.dcp
    ev = evidence.role(role)
    ranks = all_ranks(ev, NAME)
    if isinstance(ranks, Verdict):
        return ranks
    missing = missing_records(ev, ranks, NAME, role)
    if missing:
        return missing
    pools = {w: ev.ranks[w].kv_pools[-1] for w in ranks}
    no_slots = [w for w in ranks if pools[w].allocator_size is None]
    if no_slots:
        return unknown(NAME, f"the allocator's size on rank {no_slots[0]} of {role} was not recorded: "
                       "there is nothing to translate onto", missing_ranks=no_slots)
    slots = {w: int(pools[w].allocator_size or 0) for w in ranks}
    # (surface, rank whose allocator it describes, figure): each rank's scheduler; /server_info and the
    # log line describe the server, which rank 0 answers for.
    reported: list[tuple[str, int, int]] = [("scheduler", w, ev.ranks[w].capacities[-1].max_total_num_tokens)
                                           for w in ranks]
    not_seen: list[str] = []
    info_tokens = server_info_tokens(ev)
    if isinstance(info_tokens, int):
        reported.append(("server_info", ranks[0], info_tokens))
    else:
        not_seen.append("/server_info max_total_num_tokens")
    lines = logged_totals(p.log_patterns, ev.log_text)
    if lines:
        reported.append(("log max_total_num_tokens", ranks[0], int(lines[-1]["tokens"])))
    else:
        not_seen.append("'max_total_num_tokens=' log line")

    factors = [f for f in sorted({1, dcp}) if all(value * f == slots[w] for _, w, value in reported)]
    figures: dict[str, Any] = {
        "dcp": dcp,
        "reported": {f"{s}{'' if s != 'scheduler' else f' rank {w}'}": v for s, w, v in reported},
        "allocator_slots": {str(w): s for w, s in slots.items()},
        "not_seen": not_seen,
    }
    if not factors:
        return failed(NAME, f"no single translation maps what {role} reports onto its allocator: "
                      + _disagreement(reported, slots, dcp), **figures)
    factor = factors[-1]
    figures["translation"] = factor

    wrong_pages = [(w, pool.page_size, pool.allocator_page_size) for w, pool in pools.items()
                   if pool.page_size is not None and pool.allocator_page_size is not None
                   and pool.allocator_page_size != pool.page_size * dcp]
    page = pools[ranks[0]]
    figures["page"] = {"page_size": page.page_size, "allocator_page_size": page.allocator_page_size}
    if page.allocator_page_size is None:
        not_seen.append("the allocator's page size")
    if wrong_pages:
        w, ps, aps = wrong_pages[0]
        return failed(NAME, f"rank {w}'s allocator pages are {aps} tokens, not page_size {ps} x dcp {dcp}: "
                      "radix and paged admission count in a unit an adapter cannot derive", **figures)

    context = ev.ranks[ranks[0]].capacities[-1].context_len
    longest_allowed = min(context, slots[ranks[0]]) if context else slots[ranks[0]]
    served = [r.prompt_len + len(r.output_ids) for r in (ev.runner.requests if ev.runner else [])
              if r.status == "ok"]
    longest = max(served, default=0)
    figures.update(context_len=context, longest_request_allowed=longest_allowed, longest_served=longest)
    if longest > longest_allowed:
        return failed(NAME, f"{role} served a request of {longest} tokens, longer than the {longest_allowed} "
                      "its capacity and context length allow", **figures)

    first = reported[0][2]
    how = ("reports logical capacity: an adapter uses it as is" if factor == 1 else
           f"reports each rank's rows: an adapter multiplies by dcp {dcp}")
    pages = (f"; pages of {page.allocator_page_size} tokens = page_size {page.page_size} x dcp {dcp}"
             if page.allocator_page_size is not None else "")
    return passed(NAME, f"{role} {how} ({first} -> {first * factor} = the allocator's slots on every rank, "
                  f"{len(reported)} surface(s)){pages}; longest request {longest_allowed} tokens "
                  f"(served up to {longest})", **figures)


def _disagreement(reported: list[tuple[str, int, int]], slots: dict[int, int], dcp: int) -> str:
    """Which surface breaks the translation: one that neither x1 nor x dcp maps onto its rank's
    slots, else the first that needs another factor than the first surface does."""
    def said(surface: str, w: int, value: int) -> str:
        return f"{surface} reports {value} tokens for rank {w}'s {slots[w]} allocator slots"
    for surface, w, value in reported:
        if value != slots[w] and value * dcp != slots[w]:
            return f"{said(surface, w, value)} (neither x1 nor x{dcp})"
    first = reported[0]
    factor = 1 if first[2] == slots[first[1]] else dcp
    other = next(r for r in reported if r[2] * factor != slots[r[1]])
    return f"{said(*first)} (x{factor}), {said(*other)}"


def _read(c: list[Any]) -> Written:
    return Written(NAME, {})


def _write(key: str, v: Mapping[str, Any], show: Callable[[Any], str]) -> str:
    return "capacity adapter"


SYNTAX = Syntax("capacity", {"capacity_adapter": _read}, _write)

CONTRACT = Contract(NAME, 33, CapacityAdapterExpect, CapacityAdapterParams, resolve, check, SYNTAX,
                    examples=("capacity adapter",))
