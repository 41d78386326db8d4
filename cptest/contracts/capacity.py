"""capacity: physical rows x multiplier == every surface that reports logical KV capacity.

    expect { capacity logical == 2 * physical within 0.01 }

The oracle (docs/architecture.md §9, capacity group): per-rank pool rows x D == the rank's scheduler capacity
(`Capacity.max_total_num_tokens`) == the allocator's token space (`KvPool.allocator_size`) ==
`/server_info` `max_total_num_tokens` == TP0's `max_total_num_tokens=` log line; and each rank's
`KV Cache is allocated ... #tokens: N` line equals its pool rows. sgl-project/sglang#32730 once
reported per-rank values while allocating logical capacity, so every surface is compared.

Required surfaces (missing => unknown): KvPool and Capacity of every planned rank, ServerInfo.
The allocator size and the log lines are compared when present and listed under `not_seen` when
not (the probe already reads the same numbers; a log format change must not hide them silently).
The log lines are read with the patterns the plan carries (`CapacityParams.log_patterns`, from the
engine's release table), so an archive says what it was judged with.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from cptest.contracts.base import (
    Contract,
    Declared,
    EngineFacts,
    Params,
    PlanContext,
    Syntax,
    Written,
    number,
)
from cptest.contracts.groups import all_ranks
from cptest.evidence import Evidence, RoleEvidence
from cptest.verdict import Verdict, failed, passed, unknown

NAME = "capacity"


class CapacityExpect(Declared):
    multiplier: float
    """logical capacity == multiplier * physical rows per rank."""
    tolerance: float = 0.0
    """Relative tolerance (`within 0.01`)."""

    @field_validator("multiplier", mode="before")
    @classmethod
    def _multiplier(cls, x: Any) -> Any:
        return number("capacity multiplier", x, 0.0, lo_open=True)

    @field_validator("tolerance", mode="before")
    @classmethod
    def _tolerance(cls, x: Any) -> Any:
        return number("capacity tolerance", x, 0.0, 1.0) or 0.0


class LogPatterns(BaseModel):
    """The log-line patterns a capacity verdict was judged with, and where they came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    source: str
    """e.g. `sglang <release> release table`."""
    kv_allocated: str | None = None
    """Per rank: `tp` (TP rank, from the line's prefix) and `tokens` (the pool's rows)."""
    max_total_num_tokens: str | None = None
    """The scheduler's logical capacity: `tokens`."""


class CapacityParams(Params):
    kind: Literal["capacity"] = "capacity"
    multiplier: float
    tolerance: float = 0.0
    log_patterns: LogPatterns


def log_patterns_of(engine: str, facts: EngineFacts) -> LogPatterns:
    return LogPatterns(source=f"{engine} {facts.release} release table",
                       kv_allocated=facts.log_patterns.get("kv_allocated"),
                       max_total_num_tokens=facts.log_patterns.get("max_total_num_tokens"))


def resolve(expect: CapacityExpect, ctx: PlanContext) -> CapacityParams:
    return CapacityParams(multiplier=expect.multiplier, tolerance=expect.tolerance,
                          log_patterns=log_patterns_of(ctx.engine, ctx.facts))


def missing_records(ev: RoleEvidence, ranks: list[int], name: str, role: str) -> Verdict | None:
    """Unknown for contract `name` when a rank wrote no KvPool or no Capacity record: both capacity
    contracts are judged from the two."""
    for what, attr in (("KvPool", "kv_pools"), ("Capacity", "capacities")):
        missing = [w for w in ranks if not getattr(ev.ranks[w], attr)]
        if missing:
            return unknown(name, f"no {what} record from rank {missing[0]} of {role}", missing_ranks=missing)
    return None


def server_info_tokens(ev: RoleEvidence) -> Any:
    """`/server_info`'s `max_total_num_tokens` as last answered, or None."""
    infos = ev.runner.server_info if ev.runner else []
    return infos[-1].info.get("max_total_num_tokens") if infos else None


def logged_totals(patterns: LogPatterns, text: str | None) -> list[dict[str, Any]]:
    """The engine's `max_total_num_tokens=` log lines, read with the plan's pattern."""
    return find_all(patterns.max_total_num_tokens, text) if text and patterns.max_total_num_tokens else []


def _close(found: float, want: float, tol: float) -> bool:
    return abs(found - want) <= tol * abs(want)


def check(evidence: Evidence, p: CapacityParams) -> Verdict:
    role = p.role
    mult = p.multiplier
    tol = p.tolerance
    ev = evidence.role(role)
    ranks = all_ranks(ev, NAME)
    if isinstance(ranks, Verdict):
        return ranks
    missing = missing_records(ev, ranks, NAME, role)
    if missing:
        return missing

    mismatches: list[dict[str, Any]] = []
    not_seen: list[str] = []
    per_rank: dict[str, dict[str, Any]] = {}
    for w in ranks:
        pool = ev.ranks[w].kv_pools[-1]
        cap = ev.ranks[w].capacities[-1]
        want = pool.rows * mult
        row = {
            "rows": pool.rows,
            "expected_logical": want,
            "scheduler": cap.max_total_num_tokens,
            "allocator": pool.allocator_size,
        }
        per_rank[str(w)] = row
        if not _close(cap.max_total_num_tokens, want, tol):
            mismatches.append(
                {"surface": "scheduler", "rank": w, "found": cap.max_total_num_tokens, "expected": want}
            )
        if pool.allocator_size is None:
            not_seen.append(f"allocator size of rank {w}")
        elif not _close(pool.allocator_size, want, tol):
            mismatches.append(
                {"surface": "allocator", "rank": w, "found": pool.allocator_size, "expected": want}
            )

    # One logical number for the server: rank 0's (TP0 logs it and answers /server_info).
    logical = ev.ranks[0].kv_pools[-1].rows * mult if 0 in ev.ranks else None
    figures: dict[str, Any] = {
        "multiplier": mult,
        "tolerance": tol,
        "per_rank": per_rank,
        "expected_logical": logical,
    }
    server_tokens = server_info_tokens(ev)
    figures["server_info"] = server_tokens
    if server_tokens is not None and logical is not None and not _close(server_tokens, logical, tol):
        mismatches.append({"surface": "server_info", "found": server_tokens, "expected": logical})

    patterns = p.log_patterns
    figures["patterns_from"] = patterns.source
    text = ev.log_text
    tp_to_world = _tp_to_world(ev)
    kv_lines = find_all(patterns.kv_allocated, text) if text and patterns.kv_allocated else []
    figures["log_kv_allocated"] = {}
    for m in kv_lines:
        w = tp_to_world.get(int(m["tp"])) if m.get("tp") is not None else (0 if len(ranks) == 1 else None)
        if w is None or w not in ev.ranks:
            continue
        tokens = int(m["tokens"])
        figures["log_kv_allocated"][str(w)] = tokens
        rows = ev.ranks[w].kv_pools[-1].rows
        if tokens != rows:
            mismatches.append(
                {
                    "surface": "log kv_allocated",
                    "rank": w,
                    "found": tokens,
                    "expected": rows,
                    "line": m["line"],
                }
            )
    if not kv_lines:
        not_seen.append("'KV Cache is allocated' log lines")
    mt_lines = logged_totals(patterns, text)
    if mt_lines:
        tokens = int(mt_lines[-1]["tokens"])
        figures["log_max_total_num_tokens"] = tokens
        if logical is not None and not _close(tokens, logical, tol):
            mismatches.append(
                {
                    "surface": "log max_total_num_tokens",
                    "found": tokens,
                    "expected": logical,
                    "line": mt_lines[-1]["line"],
                }
            )
    else:
        not_seen.append("'max_total_num_tokens=' log line")
    figures["not_seen"] = not_seen
    figures["mismatches"] = mismatches

    if mismatches:
        m = mismatches[0]
        where = f" of rank {m['rank']}" if "rank" in m else ""
        hint = ""
        if m["surface"] in ("scheduler", "server_info", "log max_total_num_tokens") and logical:
            ratio = m["found"] / (m["expected"] / mult) if m["expected"] else 0
            hint = f" (= {ratio:g} x physical rows; declared {mult:g} x)"
        return failed(
            NAME,
            f"{m['surface']}{where} reports {m['found']} tokens, expected {m['expected']:g}{hint}"
            + (f"; and {len(mismatches) - 1} more mismatch(es)" if len(mismatches) > 1 else ""),
            **figures,
        )
    if server_tokens is None:
        return unknown(
            NAME,
            f"per-rank capacity agrees ({mult:g} x rows) but /server_info has no max_total_num_tokens",
            **figures,
        )
    return passed(
        NAME,
        f"capacity {logical:g} tokens == {mult:g} x {ev.ranks[0].kv_pools[-1].rows} rows on every "
        "surface" + (f" (not seen: {', '.join(not_seen)})" if not_seen else ""),
        **figures,
    )


def _tp_to_world(ev: RoleEvidence) -> dict[int, int]:
    """Log prefixes name the TP rank; map it to the world rank (probe geometry first, else equal)."""
    out = {}
    for w, r in ev.ranks.items():
        out[r.geometry[-1].rank.tp if r.geometry else w] = w
    return out


def find_all(pattern: str, text: str) -> list[dict[str, Any]]:
    """Every match of `pattern` over the lines of `text`: named groups plus the matched line."""
    rx = re.compile(pattern, re.MULTILINE)
    out = []
    for m in rx.finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        end = text.find("\n", m.end())
        out.append({**m.groupdict(), "line": text[start : end if end >= 0 else len(text)]})
    return out


def _read(c: list[Any]) -> Written:
    return Written(NAME, {"multiplier": c[0], "tolerance": c[1]})


def _write(key: str, v: Mapping[str, Any], show: Callable[[Any], str]) -> str:
    body = f"capacity logical == {show(v['multiplier'])} * physical"
    return body + (f" within {show(v['tolerance'])}" if v["tolerance"] is not None else "")


SYNTAX = Syntax("capacity", {"capacity": _read}, _write)

CONTRACT = Contract(NAME, 30, CapacityExpect, CapacityParams, resolve, check, SYNTAX, dumped_when_absent=True,
                    examples=("capacity logical == 2 * physical within 0.01",))
