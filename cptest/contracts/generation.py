"""generation: the main run's greedy outputs agree with the baseline's (same workload, TP only).

    expect { generation tokens_agree >= 0.95 logprob_within 0.05 vs baseline }

Definitions (docs/decisions.md):
- Requests are paired by `index`; only pairs where both runs answered `ok` are compared (serving
  judges the rest). No comparable pair, or no baseline evidence at all => unknown.
- **Token agreement is prefix agreement**: per pair, `agreed` = number of leading output tokens equal
  in both runs (up to the first divergence), `compared` = the longer output's length. After a
  divergence greedy decoding is conditioned on different histories, so position-wise equality past
  it measures nothing. `tokens_agree` = sum(agreed) / sum(compared) over all pairs.
- **Log-prob difference**: max |lp_main - lp_baseline| over positions inside the agreed prefix
  (where the tokens, hence the distributions compared, are the same). Positions without a logprob
  in either run are skipped; `logprob_within` with no such position at all => unknown.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator, model_validator

from cptest.contracts.base import Contract, Declared, Params, PlanContext, invalid, number
from cptest.evidence import Evidence
from cptest.verdict import Verdict, failed, passed, unknown

NAME = "generation"


class GenerationExpect(Declared):
    tokens_agree: float | None = None
    logprob_within: float | None = None
    vs: Literal["baseline"] = "baseline"

    @field_validator("tokens_agree", mode="before")
    @classmethod
    def _agree(cls, x: Any) -> Any:
        return number("tokens_agree", x, 0.0, 1.0)

    @field_validator("logprob_within", mode="before")
    @classmethod
    def _logprob(cls, x: Any) -> Any:
        return number("logprob_within", x, 0.0)

    @model_validator(mode="after")
    def _something(self) -> GenerationExpect:
        if self.tokens_agree is None and self.logprob_within is None:
            raise invalid("generation expects nothing", expected="tokens_agree >= R and/or logprob_within X")
        return self


class GenerationParams(Params):
    kind: Literal["generation"] = "generation"
    tokens_agree: float | None = None
    logprob_within: float | None = None


def resolve(expect: GenerationExpect, ctx: PlanContext) -> GenerationParams:
    return GenerationParams(tokens_agree=expect.tokens_agree, logprob_within=expect.logprob_within)


def check(evidence: Evidence, p: GenerationParams) -> Verdict:
    min_agree = p.tokens_agree  # None: only the logprob tolerance was declared
    lp_tol = p.logprob_within
    main = evidence.role("main").runner
    base = evidence.role("baseline")
    if not base.planned:
        return unknown(NAME, "the plan has no baseline server to compare with")
    if base.runner is None:
        return unknown(NAME, "no baseline evidence (evidence/baseline/runner.jsonl missing)")
    if main is None:
        return unknown(NAME, "no main evidence (evidence/main/runner.jsonl missing)")
    m_ok = {r.index: r for r in main.requests if r.status == "ok"}
    b_ok = {r.index: r for r in base.runner.requests if r.status == "ok"}
    pairs = sorted(set(m_ok) & set(b_ok))
    if not pairs:
        return unknown(
            NAME, f"no request completed in both runs (main ok: {len(m_ok)}, baseline ok: {len(b_ok)})"
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
        "pairs": len(pairs),
        "not_compared": len(set(m_ok) ^ set(b_ok)),
        "agreed_tokens": agreed_total,
        "compared_tokens": compared_total,
        "tokens_agree": round(frac, 6),
        "min_tokens_agree": min_agree,
        "diverged_requests": diverged,
        "first_divergence": first_div,
        "max_logprob_diff": None if lp_max is None else round(lp_max, 6),
        "max_logprob_diff_at": lp_at,
        "logprob_positions": lp_positions,
        "logprob_within": lp_tol,
    }
    if min_agree is not None and frac < min_agree:
        fd = first_div or {}
        return failed(
            NAME,
            f"greedy tokens agree {frac:.4f} < {min_agree} over {len(pairs)} request(s); first "
            f"divergence: request {fd.get('index')} at output position {fd.get('position')}",
            **figures,
        )
    if lp_tol is not None:
        if lp_max is None:
            return unknown(
                NAME, f"tokens agree {frac:.4f} but no logprobs to compare within {lp_tol}", **figures
            )
        if lp_max > float(lp_tol):
            return failed(
                NAME,
                f"logprobs differ by {lp_max:.4g} > {lp_tol} at request {lp_at['index']} "
                f"position {lp_at['position']}",
                **figures,
            )
    return passed(
        NAME,
        f"greedy tokens agree {frac:.4f}"
        + (f" >= {min_agree}" if min_agree is not None else "")
        + f" over {len(pairs)} request(s)"
        + (f"; max logprob diff {lp_max:.4g} <= {lp_tol}" if lp_tol is not None else ""),
        **figures,
    )


CONTRACT = Contract(NAME, GenerationExpect, GenerationParams, resolve, check)
