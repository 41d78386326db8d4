"""generation: the main server's numerics agree with the baseline's (same model, TP only), judged
against a measured noise floor.

    expect { generation logprob p99 <= 4 * control topk 5 agree >= 0.95 free_running topk 5 vs baseline }

Clauses (any number, at least one; docs/language.md, "Generation parity"):
- `logprob STAT <= X [* control]` (STAT: p50, p99, max): teacher-forced |Δlogprob| between main and
  baseline over every scored position (`cptest.contracts.parity.forced`). With `* control`, the bound
  is X times the same figure of the control server (the baseline's model at another TP degree:
  numerically different, known to be equivalent) against the baseline: the measured noise floor.
- `topk K agree >= R [* control]`: the fraction of scored positions where each side's most likely
  token is in the other's top K is at least R (or R times the control's).
- `free_running topk K`: the free-running greedy outputs, compared by the vLLM rule (at the first
  divergence each side's token is in the other's top K; nothing after it).
- Older keys, kept for archives and scenarios written before teacher-forced parity: `tokens_agree
  >= R` (greedy-prefix agreement: agreed tokens / longer output, summed over requests) and
  `logprob_within X` (max |Δlogprob| over the agreed prefixes of the free-running outputs).

Requests are paired by `index`; only pairs where both sides answered `ok` are compared (serving judges
the rest). Nothing comparable for a declared clause, or no control evidence for a relative bound:
unknown. The verdict records every figure, the floor, and each measured/floor ratio.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from cptest.contracts import parity
from cptest.contracts.base import (
    Contract,
    Declared,
    Params,
    PlanContext,
    Syntax,
    Written,
    choice,
    invalid,
    number,
)
from cptest.evidence import Evidence
from cptest.node import Node
from cptest.values import Ident, describe
from cptest.verdict import Verdict, failed, passed, unknown

NAME = "generation"
STATS = ("p50", "p99", "max")
MAX_TOPK = 20


class GenBound(Node):
    """One teacher-forced bound: `logprob STAT <= X [* control]` or `topk K agree >= R [* control]`."""

    metric: Literal["logprob", "topk_agree"]
    stat: str | None = None
    k: int | None = None
    limit: float
    relative: bool = False

    @field_validator("stat", mode="before")
    @classmethod
    def _stat(cls, x: Any) -> Any:
        return None if x is None else choice("logprob statistic", x, STATS)

    @field_validator("k", mode="before")
    @classmethod
    def _k(cls, x: Any) -> Any:
        if x is None:
            return None
        if isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_TOPK:
            raise invalid(
                "topk is out of range", expected=f"an integer from 1 to {MAX_TOPK}", found=describe(x)
            )
        return x

    @model_validator(mode="after")
    def _range(self) -> GenBound:
        if self.limit < 0:
            raise invalid("a bound must not be negative", expected=">= 0", found=f"{self.limit:g}")
        if self.metric == "topk_agree" and not self.relative and self.limit > 1:
            raise invalid(
                "an agreement is a fraction", expected="a number from 0 to 1", found=f"{self.limit:g}"
            )
        return self

    def text(self) -> str:
        rel = " * control" if self.relative else ""
        if self.metric == "logprob":
            return f"logprob {self.stat} <= {self.limit:g}{rel}"
        return f"topk {self.k} agree >= {self.limit:g}{rel}"


class GenerationExpect(Declared):
    tokens_agree: float | None = None
    logprob_within: float | None = None
    bounds: list[GenBound] = Field(default_factory=list, exclude_if=lambda v: not v)
    free_running_topk: int | None = Field(default=None, exclude_if=lambda v: v is None)
    vs: Literal["baseline"] = "baseline"

    @field_validator("tokens_agree", mode="before")
    @classmethod
    def _agree(cls, x: Any) -> Any:
        return number("tokens_agree", x, 0.0, 1.0)

    @field_validator("logprob_within", mode="before")
    @classmethod
    def _logprob(cls, x: Any) -> Any:
        return number("logprob_within", x, 0.0)

    @field_validator("free_running_topk", mode="before")
    @classmethod
    def _free_k(cls, x: Any) -> Any:
        return GenBound._k(x)

    @model_validator(mode="after")
    def _something(self) -> GenerationExpect:
        if (
            self.tokens_agree is None
            and self.logprob_within is None
            and not self.bounds
            and self.free_running_topk is None
        ):
            raise invalid(
                "generation expects nothing",
                expected="logprob p99 <= X [* control], topk K agree >= R, free_running topk K",
            )
        return self


class GenerationParams(Params):
    kind: Literal["generation"] = "generation"
    tokens_agree: float | None = None
    logprob_within: float | None = None
    bounds: list[GenBound] = Field(default_factory=list, exclude_if=lambda v: not v)
    free_running_topk: int | None = Field(default=None, exclude_if=lambda v: v is None)

    def score_topk(self) -> int:
        """The top-k list length the teacher-forced scoring must return (0: no scoring needed)."""
        if not self.bounds:
            return 0
        return max([b.k or 1 for b in self.bounds] + [1])

    def needs_control(self) -> bool:
        return any(b.relative for b in self.bounds)


def resolve(expect: GenerationExpect, ctx: PlanContext) -> GenerationParams:
    return GenerationParams(
        tokens_agree=expect.tokens_agree,
        logprob_within=expect.logprob_within,
        bounds=expect.bounds,
        free_running_topk=expect.free_running_topk,
    )


def _figure(fig: parity.ForcedFigures, b: GenBound) -> float | None:
    return fig.stat(b.stat or "max") if b.metric == "logprob" else fig.agreement(b.k or 1)


def judge_bound(
    b: GenBound, main: parity.ForcedFigures, control: parity.ForcedFigures | None, *,
    sides: str = "main and baseline", measure: str = "teacher-forced", label: str = "",
) -> tuple[str, str, dict[str, Any]]:
    """(status, reason, figures) of one bound over `main`'s figures, the floor being `control`'s;
    `sides`, `measure` and `label` only word the reasons (graph parity judges main against its
    eager twin, and on two measures)."""
    got = _figure(main, b)
    row: dict[str, Any] = {"bound": b.text(), "measured": None if got is None else parity.sig(got)}
    if got is None:
        return "unknown", f"{label}{b.text()}: no {measure} position scored on both {sides}", row
    limit = b.limit
    if b.relative:
        floor = None if control is None else _figure(control, b)
        if floor is None:
            row["floor"] = None
            return "unknown", f"{label}{b.text()}: no control evidence to measure the floor with", row
        if b.metric == "logprob":
            # No floor below what the figures can resolve: two servers that agree to the last bit
            # of float32 on almost every position would otherwise make any one-ulp difference fail.
            resolution = max(main.resolution, control.resolution if control is not None else 0.0)
            row["resolution"] = parity.sig(resolution)
            floor = max(floor, resolution)
        row["floor"] = parity.sig(floor)
        limit = b.limit * floor
        row["ratio"] = None if floor == 0 else round(got / floor, 4)
    row["limit"] = parity.sig(limit)
    ok = got <= limit if b.metric == "logprob" else got >= limit
    op = "<=" if b.metric == "logprob" else ">="
    what = f"logprob {b.stat} {got:.4g}" if b.metric == "logprob" else f"top{b.k} agreement {got:.4f}"
    what = label + what
    floor_txt = f" ({b.limit:g} x floor {row['floor']:.4g})" if b.relative else ""
    if ok:
        return "pass", f"{what} {op} {limit:.4g}{floor_txt}", row
    bad = "> " if b.metric == "logprob" else "< "
    return "fail", f"{what} {bad}{limit:.4g}{floor_txt}", row


def check(evidence: Evidence, p: GenerationParams) -> Verdict:
    main = evidence.role("main").runner
    base = evidence.role("baseline")
    if not base.planned:
        return unknown(NAME, "the plan has no baseline server to compare with")
    if base.runner is None:
        return unknown(NAME, "no baseline evidence (evidence/baseline/runner.jsonl missing)")
    if main is None:
        return unknown(NAME, "no main evidence (evidence/main/runner.jsonl missing)")
    figures: dict[str, Any] = {}
    fails: list[str] = []
    unknowns: list[str] = []
    passes: list[str] = []
    if p.bounds:
        ks = sorted({b.k for b in p.bounds if b.k is not None})
        forced_main = parity.forced(main.scores, base.runner.scores, ks)
        ctl_role = evidence.role("control")
        forced_ctl = (
            parity.forced(ctl_role.runner.scores, base.runner.scores, ks)
            if ctl_role.runner is not None
            else None
        )
        figures["teacher_forced"] = {
            "main": forced_main.summary(ks),
            "control": None if forced_ctl is None else forced_ctl.summary(ks),
            "per_request": forced_main.per_request,
        }
        rows = []
        for b in p.bounds:
            status, why, row = judge_bound(b, forced_main, forced_ctl)
            row["status"] = status
            rows.append(row)
            {"pass": passes, "fail": fails, "unknown": unknowns}[status].append(why)
        figures["bounds"] = rows
    greedy = parity.free_running(main.requests, base.runner.requests, p.free_running_topk)
    if p.bounds or p.free_running_topk is not None:  # plans of the older keys keep their figures
        figures["free_running"] = greedy.summary()
    if p.free_running_topk is not None:
        k = p.free_running_topk
        if not greedy.pairs:
            unknowns.append("free-running: no request completed on both servers")
        elif greedy.violations:
            v = greedy.violations[0]
            fails.append(
                f"free-running: {len(greedy.violations)} of {greedy.diverged} divergence(s) outside the "
                f"other side's top {k} (first: request {v['index']} at output position {v['position']})"
            )
        elif greedy.unjudged:
            unknowns.append(
                f"free-running: {len(greedy.unjudged)} divergence(s) without top-{k} lists to judge"
            )
        else:
            passes.append(
                f"free-running: {greedy.diverged} of {greedy.pairs} diverged, every divergence "
                f"within the other side's top {k}"
            )
    if p.tokens_agree is not None or p.logprob_within is not None:
        status, why, legacy = _greedy_prefix(
            main.requests, base.runner.requests, p.tokens_agree, p.logprob_within
        )
        figures.update(legacy)
        {"pass": passes, "fail": fails, "unknown": unknowns}[status].append(why)
    if fails:
        return failed(NAME, "; ".join(fails + unknowns), **figures)
    if unknowns:
        return unknown(NAME, "; ".join(unknowns), **figures)
    return passed(NAME, "; ".join(passes), **figures)


def _greedy_prefix(
    main: list[Any], base: list[Any], min_agree: float | None, lp_tol: float | None
) -> tuple[str, str, dict[str, Any]]:
    """The older keys: greedy-prefix agreement and max |Δlogprob| over the agreed prefixes."""
    m_ok = {r.index: r for r in main if r.status == "ok"}
    b_ok = {r.index: r for r in base if r.status == "ok"}
    pairs = sorted(set(m_ok) & set(b_ok))
    if not pairs:
        return (
            "unknown",
            f"no request completed in both runs (main ok: {len(m_ok)}, baseline ok: {len(b_ok)})",
            {},
        )
    agreed_total = compared_total = 0
    first_div: dict[str, Any] | None = None
    diverged = 0
    lp_max: float | None = None
    lp_at: dict[str, int] | None = None
    lp_positions = 0
    for i in pairs:
        a, b = m_ok[i].output_ids, b_ok[i].output_ids
        n = min(len(a), len(b))
        k = 0
        while k < n and a[k] == b[k]:
            k += 1
        agreed_total += k
        compared_total += max(len(a), len(b))
        if k < max(len(a), len(b)):
            diverged += 1
            if first_div is None:
                first_div = {
                    "index": i,
                    "position": k,
                    "main": a[k] if k < len(a) else None,
                    "baseline": b[k] if k < len(b) else None,
                }
        la, lb = m_ok[i].output_logprobs, b_ok[i].output_logprobs
        for j in range(min(k, len(la), len(lb))):
            d = abs(la[j] - lb[j])
            lp_positions += 1
            if lp_max is None or d > lp_max:
                lp_max, lp_at = d, {"index": i, "position": j}
    frac = agreed_total / compared_total if compared_total else 1.0
    figures: dict[str, Any] = {
        "pairs": len(pairs), "not_compared": len(set(m_ok) ^ set(b_ok)), "agreed_tokens": agreed_total,
        "compared_tokens": compared_total, "tokens_agree": round(frac, 6), "min_tokens_agree": min_agree,
        "diverged_requests": diverged, "first_divergence": first_div,
        "max_logprob_diff": None if lp_max is None else round(lp_max, 6), "max_logprob_diff_at": lp_at,
        "logprob_positions": lp_positions, "logprob_within": lp_tol,
    }  # fmt: skip
    if min_agree is not None and frac < min_agree:
        fd = first_div or {}
        return (
            "fail",
            f"greedy tokens agree {frac:.4f} < {min_agree} over {len(pairs)} request(s); first "
            f"divergence: request {fd.get('index')} at output position {fd.get('position')}",
            figures,
        )
    if lp_tol is not None:
        if lp_max is None:
            return "unknown", f"tokens agree {frac:.4f} but no logprobs to compare within {lp_tol}", figures
        if lp_max > float(lp_tol):
            assert lp_at is not None
            return (
                "fail",
                f"logprobs differ by {lp_max:.4g} > {lp_tol} at request {lp_at['index']} "
                f"position {lp_at['position']}",
                figures,
            )
    return (
        "pass",
        f"greedy tokens agree {frac:.4f}"
        + (f" >= {min_agree}" if min_agree is not None else "")
        + f" over {len(pairs)} request(s)"
        + (
            f"; max logprob diff {lp_max:.4g} <= {lp_tol}"
            if lp_tol is not None and lp_max is not None
            else ""
        ),
        figures,
    )


# ------------------------------------------------------------------------------------ syntax
# The clauses `generation ... vs baseline` and `graph parity vs eager ...` share: each read as
# (key, value), a bound as ("bound", its raw values).
def _tokens_agree(c: list[Any]) -> tuple[str, Any]:
    return ("tokens_agree", c[1])


def _logprob_within(c: list[Any]) -> tuple[str, Any]:
    return ("logprob_within", c[1])


def _logprob(c: list[Any]) -> tuple[str, Any]:
    _tok, stat, limit, rel = c
    return ("bound", {"metric": "logprob", "stat": Ident(stat), "limit": limit, "relative": rel is not None})


def _topk_agree(c: list[Any]) -> tuple[str, Any]:
    _tok, k, _agree, limit, rel = c
    return ("bound", {"metric": "topk_agree", "k": k, "limit": limit, "relative": rel is not None})


def _free_running(c: list[Any]) -> tuple[str, Any]:
    return ("free_running_topk", c[2])


CLAUSES = {"gen_tokens_agree": _tokens_agree, "gen_logprob_within": _logprob_within, "gen_logprob": _logprob,
           "gen_topk_agree": _topk_agree, "gen_free_running": _free_running}
"""The clause rules (`gen_clause` in cps.lark) -> their readers."""


def gather(value: dict[str, Any], clauses: list[tuple[str, Any]]) -> dict[str, Any]:
    """`value` with each clause set (a bound appended to `bounds`)."""
    for key, v in clauses:
        if key == "bound":
            value["bounds"].append(v)
        else:  # the older keys too, which a contract that has none of them refuses by name
            value[key] = v
    return value


def write_clauses(v: Mapping[str, Any], show: Callable[[Any], str]) -> str:
    """The teacher-forced bounds and the free-running clause, as written back."""
    out = ""
    for b in v.get("bounds") or []:
        rel = " * control" if b["relative"] else ""
        if b["metric"] == "logprob":
            out += f" logprob {b['stat']} <= {show(b['limit'])}{rel}"
        else:
            out += f" topk {show(b['k'])} agree >= {show(b['limit'])}{rel}"
    if v.get("free_running_topk") is not None:
        out += f" free_running topk {show(v['free_running_topk'])}"
    return out


def _read(c: list[Any]) -> Written:
    value = {"tokens_agree": None, "logprob_within": None, "bounds": [], "free_running_topk": None}
    return Written(NAME, gather(value, c))


def _write(key: str, v: Mapping[str, Any], show: Callable[[Any], str]) -> str:
    body = "generation"
    if v["tokens_agree"] is not None:
        body += f" tokens_agree >= {show(v['tokens_agree'])}"
    if v["logprob_within"] is not None:
        body += f" logprob_within {show(v['logprob_within'])}"
    return body + write_clauses(v, show) + " vs baseline"


SYNTAX = Syntax("generation", {"generation": _read, **CLAUSES}, _write)

CONTRACT = Contract(NAME, 40, GenerationExpect, GenerationParams, resolve, check, SYNTAX,
                    dumped_when_absent=True, examples=(
                        "generation logprob p99 <= 4 * control topk 5 agree >= 0.9 vs baseline",
                        "generation free_running topk 5 vs baseline"))
