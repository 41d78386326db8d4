"""graph parity: the main server, running CUDA graphs, computes what the same server computes eagerly,
within the measured noise floor.

    expect { graph parity vs eager logprob p99 <= 4 * control free_running topk 5 }

The plan adds an *eager twin* (role `eager`): the main topology and serve options with every
CUDA-graph phase disabled, run without faults. The main server must run decode graphs (its serve
declares `cuda_graph_decode full` or `breakable`; the plan refuses otherwise). Clauses, at least one
(docs/language.md "Graph parity"):
- `logprob STAT <= X [* control]` (STAT: p50, p99, max): |Δlogprob| between main and the eager twin
  on two measures, and the bound must hold on both:
  - *teacher-forced*: both scored the baseline's sequences with prompt logprobs (`parity.forced`):
    one prefill forward per sequence, so it exercises prefill graphs (where declared) and not decode
    graphs;
  - *decode*: the free-running outputs along each pair's common greedy prefix, past the first token
    (`parity.decode_prefix`): same history on both sides, each logprob from a decode forward, i.e.
    a graph replay on main and an eager forward on the twin.
  With `* control` the limit is X times the same measure of the control against the baseline
  (the generation contract's noise floor); never below one float32 ulp of the figures.
- `topk K agree >= R [* control]`: teacher-forced top-K agreement (no top lists on the decode measure).
- `free_running topk K`: the free-running outputs of main and twin by vLLM's first-divergence rule.

What the comparison needs to be graph against eager is checked, not assumed: on SGLang, a main
server that recorded no decode capture, or a twin that recorded one, is unknown (the graph contract
judges the declared state; this one refuses to call eager-vs-eager a graph result). The CPU
reference engine has no CUDA graphs at all: it takes the same plan, main and twin run the same code,
and the verdict says so in its reason and its `graphs` figure (a test of the pipeline, never an
SGLang qualification).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from cptest.contracts import parity
from cptest.contracts.base import Contract, Declared, Params, PlanContext, Syntax, Written, choice, invalid
from cptest.contracts.generation import CLAUSES, GenBound, gather, judge_bound, write_clauses
from cptest.evidence import Evidence, RoleEvidence
from cptest.values import Ident
from cptest.verdict import Verdict, failed, passed, unknown

NAME = "graph_parity"
ROLE = "eager"
"""The eager twin's role in the plan and the archive (`evidence/eager/`, `logs/eager-node<k>.log`)."""
REFERENCE_NOTE = ("the reference engine has no CUDA graphs: main and its eager twin ran the same code "
                  "(a test of the pipeline, not a graph qualification)")


class GraphParityExpect(Declared):
    what: Literal["parity"] = "parity"
    against: Literal["eager"] = "eager"
    bounds: list[GenBound] = Field(default_factory=list, exclude_if=lambda v: not v)
    free_running_topk: int | None = Field(default=None, exclude_if=lambda v: v is None)

    @model_validator(mode="before")
    @classmethod
    def _no_older_keys(cls, data: Any) -> Any:
        old = [k for k in ("tokens_agree", "logprob_within") if isinstance(data, dict) and k in data]
        if old:
            raise invalid(f"{old[0]} is an older key of generation only",
                          expected="logprob STAT <= X [* control], topk K agree >= R, free_running topk K")
        return data

    @field_validator("what", mode="before")
    @classmethod
    def _what(cls, x: Any) -> Any:
        return choice("graph comparison", x, ("parity",))

    @field_validator("against", mode="before")
    @classmethod
    def _against(cls, x: Any) -> Any:
        return choice("graph parity reference", x, ("eager",))

    @field_validator("free_running_topk", mode="before")
    @classmethod
    def _free_k(cls, x: Any) -> Any:
        return GenBound._k(x)

    @model_validator(mode="after")
    def _something(self) -> GraphParityExpect:
        if not self.bounds and self.free_running_topk is None:
            raise invalid("graph parity expects nothing",
                          expected="logprob p99 <= X [* control], topk K agree >= R, free_running topk K")
        return self


class GraphParityParams(Params):
    kind: Literal["graph_parity"] = "graph_parity"
    bounds: list[GenBound] = Field(default_factory=list, exclude_if=lambda v: not v)
    free_running_topk: int | None = Field(default=None, exclude_if=lambda v: v is None)

    def score_topk(self) -> int:
        """The top-k list length the teacher-forced scoring must return (0: no scoring needed)."""
        return max([b.k or 1 for b in self.bounds] + [1]) if self.bounds else 0

    def needs_control(self) -> bool:
        return any(b.relative for b in self.bounds)


def resolve(expect: GraphParityExpect, ctx: PlanContext) -> GraphParityParams:
    return GraphParityParams(bounds=expect.bounds, free_running_topk=expect.free_running_topk)


def _captures(ev: RoleEvidence) -> int:
    return sum(1 for r in ev.ranks.values() for g in r.graphs if g.event == "capture")


def _graph_state(main: RoleEvidence, twin: RoleEvidence) -> tuple[str | None, dict[str, Any]]:
    """(why the run is not graph against eager, or None; the figures saying what ran)."""
    if main.engine == "reference":
        return None, {"graphs": "none: reference engine"}
    state = {"main_decode_captures": sum(1 for r in main.ranks.values() for g in r.graphs
                                         if g.event == "capture" and g.phase == "decode"),
             "eager_captures": _captures(twin)}
    if not main.ranks:
        return "no rank evidence from main: cannot tell whether it ran decode graphs", state
    if not state["main_decode_captures"]:
        return ("main recorded no decode CUDA-graph capture: the comparison would be eager against "
                "eager (see the graph contract)"), state
    if state["eager_captures"]:
        return f"the eager twin recorded {state['eager_captures']} CUDA-graph capture(s)", state
    return None, state


def check(evidence: Evidence, p: GraphParityParams) -> Verdict:
    main, twin = evidence.role("main"), evidence.role(ROLE)
    if not twin.planned:
        return unknown(NAME, "the plan has no eager twin to compare with")
    if main.runner is None:
        return unknown(NAME, "no main evidence (evidence/main/runner.jsonl missing)")
    if twin.runner is None:
        return unknown(NAME, f"no eager twin evidence (evidence/{ROLE}/runner.jsonl missing)")
    not_graph, figures = _graph_state(main, twin)
    base, ctl = evidence.role("baseline").runner, evidence.role("control").runner
    verdicts: dict[str, list[str]] = {"pass": [], "fail": [], "unknown": []}
    if p.bounds:
        ks = sorted({b.k for b in p.bounds if b.k is not None})
        floors = ctl is not None and base is not None
        measures = {
            "teacher_forced": (parity.forced(main.runner.scores, twin.runner.scores, ks),
                               parity.forced(ctl.scores, base.scores, ks) if floors else None),
            "decode": (parity.decode_prefix(main.runner.requests, twin.runner.requests),
                       parity.decode_prefix(ctl.requests, base.requests) if floors else None),
        }  # fmt: skip
        for name, (got, floor) in measures.items():
            figures[name] = {"main": got.summary(ks), "control": None if floor is None else floor.summary(ks),
                             "per_request": got.per_request}
        rows = []
        for b in p.bounds:
            for name, (got, floor) in measures.items():
                if name == "decode" and b.metric != "logprob":
                    continue  # free-running answers carry no top lists to agree on
                status, why, row = judge_bound(b, got, floor, sides="main and the eager twin",
                                               measure=name.replace("_", "-"), label=f"{name}: ")
                rows.append({**row, "measure": name, "status": status})
                verdicts[status].append(why)
        figures["bounds"] = rows
    if p.free_running_topk is not None:
        k = p.free_running_topk
        greedy = parity.free_running(main.runner.requests, twin.runner.requests, k)
        figures["free_running"] = greedy.summary()
        if not greedy.pairs:
            verdicts["unknown"].append("free-running: no request completed on both servers")
        elif greedy.violations:
            v = greedy.violations[0]
            verdicts["fail"].append(
                f"free-running: {len(greedy.violations)} of {greedy.diverged} divergence(s) outside the "
                f"other side's top {k} (first: request {v['index']} at output position {v['position']})")
        elif greedy.unjudged:
            verdicts["unknown"].append(
                f"free-running: {len(greedy.unjudged)} divergence(s) without top-{k} lists to judge")
        else:
            verdicts["pass"].append(f"free-running: {greedy.diverged} of {greedy.pairs} diverged, every "
                                    f"divergence within the other side's top {k}")
    if not_graph is not None:
        return unknown(NAME, "; ".join([not_graph] + verdicts["fail"] + verdicts["unknown"]), **figures)
    note = [REFERENCE_NOTE] if main.engine == "reference" else []
    if verdicts["fail"]:
        return failed(NAME, "; ".join(verdicts["fail"] + verdicts["unknown"] + note), **figures)
    if verdicts["unknown"]:
        return unknown(NAME, "; ".join(verdicts["unknown"] + note), **figures)
    return passed(NAME, "; ".join(verdicts["pass"] + note), **figures)


def _read(c: list[Any]) -> Written:
    what, against, *clauses = c
    value = {"what": Ident(what), "against": Ident(against), "bounds": [], "free_running_topk": None}
    return Written(NAME, gather(value, clauses), {"what": what, "against": against})


def _write(key: str, v: Mapping[str, Any], show: Callable[[Any], str]) -> str:
    return f"graph {v['what']} vs {v['against']}" + write_clauses(v, show)


SYNTAX = Syntax("graph", {"graph_parity": _read, **CLAUSES}, _write)

CONTRACT = Contract(NAME, 55, GraphParityExpect, GraphParityParams, resolve, check, SYNTAX,
                    examples=("graph parity vs eager logprob p99 <= 4 * control free_running topk 5",))
