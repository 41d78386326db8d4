"""`workload { fill_drain P }`: a closed loop sized from the main server's KV pool
(docs/language.md "Capacity transitions").

The pool's logical capacity L comes from `serve max_total_tokens`, read the way the engine reads it
(`EngineFacts.max_total_tokens_per_rank`), the DCP degree and the page size. Every request takes
the same budget B (its fixed prompt and output tokens, rounded up to whole allocator pages of
`page x dcp` tokens, as both engines allocate). The plan then keeps k = ceil(P x L / B) requests in
the pool and one more waiting at the limit: concurrency k + 1. While the workload runs, finishing
requests make room for waiting ones (admissions and finishes throughout); when the last requests
finish, the pool drains. Pure: the caller collects the problems.
"""

from __future__ import annotations

import math

from cptest.contracts.base import EngineFacts
from cptest.errors import ProblemCollector
from cptest.lang.tables import MAX_CONCURRENCY
from cptest.plan.model import WorkloadPlan
from cptest.scenario import Scenario


def logical_capacity(max_total_tokens: int, page: int, dcp: int, *, per_rank: bool) -> int:
    """Tokens the allocator hands out: rows x dcp, rows in whole pages."""
    if per_rank:
        return (max_total_tokens // page) * page * dcp
    block = page * dcp
    return (max_total_tokens // block) * block


def sized(scenario: Scenario, facts: EngineFacts, workload: WorkloadPlan,
          problems: ProblemCollector) -> WorkloadPlan:
    """`workload` with the concurrency that fills `fill_drain` of the pool; unchanged, with a
    problem at the statement, when the plan cannot size it."""
    w = scenario.workload
    peak = w.fill_drain
    assert peak is not None
    where = w.where("fill_drain")
    serve = scenario.serve
    if serve.max_total_tokens is None:
        problems.add(where, "fill_drain sizes the workload from the KV pool, which the plan knows only "
                     "from serve max_total_tokens", hint="set serve { max_total_tokens N }")
        return workload
    if w.prompt_tokens.kind != "fixed" or w.output_tokens.kind != "fixed":
        problems.add(where, "fill_drain needs fixed prompt_tokens and output_tokens (every request takes "
                     "the same share of the pool)", expected="prompt_tokens N and output_tokens M")
        return workload
    dcp, page = scenario.topology.dcp, serve.page_size or 1
    block = page * dcp
    cap = logical_capacity(serve.max_total_tokens, page, dcp, per_rank=facts.max_total_tokens_per_rank)
    budget = math.ceil((int(w.prompt_tokens.n or 0) + int(w.output_tokens.n or 0)) / block) * block
    fit = cap // budget
    k = math.ceil(peak * cap / budget)
    if fit < 1 or k > fit:  # fit 0: a pool smaller than one request (max_total_tokens under a page)
        share = fit * budget / cap
        hint = ""
        if fit >= 1:
            better = max(cap // math.ceil(peak * cap / budget) - int(w.output_tokens.n or 0), 1)
            hint = f"prompt_tokens {better} would let requests hold {peak:g} of it"
        problems.add(where, f"requests of {budget} tokens cannot hold {peak:g} of the {cap}-token KV pool: "
                     f"{fit} fit, {share:.3f} of it", hint=hint or None)
        return workload
    if k + 1 > MAX_CONCURRENCY:
        problems.add(where, f"fill_drain would keep {k + 1} requests in flight", expected=f"at most "
                     f"{MAX_CONCURRENCY} (larger prompt_tokens)")
        return workload
    if w.requests < k + 1:
        problems.add(w.where("requests") or where, f"fill_drain needs at least {k + 1} requests: {k} hold "
                     f"{peak:g} of the {cap}-token pool and one waits at the limit",
                     expected=f"requests >= {k + 1}")
        return workload
    return workload.model_copy(update={"concurrency": k + 1})
