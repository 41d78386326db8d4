"""graph: the declared CUDA-graph state is what ran, on every rank.

    expect { graph decode captured }      expect { graph prefill eager }

Evidence: Graph records (capture at capture time; replay/eager counts from the runner's
`can_run_graph` hook) and Step records (an eager forward's, or a replay's, marked by `graph_rows`;
the inner hooks fire only on eager forwards: docs/sglang.md, "CUDA graphs"). "Step records"
below means eager ones.
- captured: every rank recorded a capture for the phase; if replay/eager counts were recorded, at
  least one replay (captured but never replayed means it ran eager).
- disabled: no rank recorded a capture for the phase, and every rank has Step records of the phase
  (proof the forwards ran eager, not that the probe was silent).
- eager: no replay for the phase on any rank, and every rank has Step records of the phase.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import ValidationInfo, field_validator

from cptest.contracts.base import Contract, Declared, Params, PlanContext, Syntax, Written, choice
from cptest.contracts.groups import all_ranks
from cptest.evidence import Evidence
from cptest.values import Ident
from cptest.verdict import Verdict, failed, passed, unknown

NAME = "graph"
_STEP_MODES = {"decode": ("decode",), "prefill": ("extend", "mixed")}
MODES: dict[str, tuple[str, ...]] = {"decode": ("captured", "disabled"), "prefill": ("eager", "captured")}
"""What each phase may be declared as (SGLang has no prefill graph to disable, only eager prefill)."""


class GraphExpect(Declared):
    phase: Literal["decode", "prefill"]
    mode: Literal["captured", "disabled", "eager"]

    @field_validator("phase", mode="before")
    @classmethod
    def _phase(cls, phase: Any) -> Any:
        return choice("graph phase", phase, MODES)

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, mode: Any, info: ValidationInfo) -> Any:
        phase = info.data.get("phase")
        return mode if phase is None else choice(f"{phase} graph mode", mode, MODES[phase])


class GraphParams(Params):
    kind: Literal["graph"] = "graph"
    phase: Literal["decode", "prefill"]
    state: Literal["captured", "disabled", "eager"]


def resolve(expect: GraphExpect, ctx: PlanContext) -> GraphParams:
    return GraphParams(phase=expect.phase, state=expect.mode)


def check(evidence: Evidence, p: GraphParams) -> Verdict:
    role = p.role
    phase, state = p.phase, p.state
    ev = evidence.role(role)
    ranks = all_ranks(ev, NAME)
    if isinstance(ranks, Verdict):
        return ranks
    sizes: dict[str, list[int]] = {}
    replays: dict[str, int] = {}
    eagers: dict[str, int] = {}
    steps: dict[str, int] = {}
    for w in ranks:
        g = [r for r in ev.ranks[w].graphs if r.phase == phase]
        sizes[str(w)] = sorted({b for r in g if r.event == "capture" for b in r.batch_sizes})
        of_phase = [s for s in ev.ranks[w].steps if s.mode in _STEP_MODES[phase]]
        # Replays are counted by the runner's counters and recorded as steps too; the
        # larger count stands (counters of a killed rank may not have been flushed).
        replays[str(w)] = max(sum(r.count for r in g if r.event == "replay"),
                              sum(1 for s in of_phase if s.graph_rows is not None))
        eagers[str(w)] = sum(r.count for r in g if r.event == "eager")
        steps[str(w)] = sum(1 for s in of_phase if s.graph_rows is None)
    captured_any = any(
        any(r.event == "capture" and r.phase == phase for r in ev.ranks[w].graphs) for w in ranks
    )
    figures = {
        "phase": phase,
        "state": state,
        "captured_sizes": sizes,
        "replays": replays,
        "eager": eagers,
        "steps": steps,
    }
    counted = any(replays.values()) or any(eagers.values())
    if state == "captured":
        missing = [
            w for w in ranks if not any(r.event == "capture" and r.phase == phase for r in ev.ranks[w].graphs)
        ]
        if missing:
            if not captured_any and all(steps[str(w)] for w in ranks):
                return failed(
                    NAME, f"no {phase} CUDA graph captured on any rank and {phase} ran eager", **figures
                )
            return unknown(NAME, f"no {phase} graph capture recorded by rank {missing[0]}", **figures)
        if counted and sum(replays.values()) == 0:
            return failed(
                NAME,
                f"{phase} graphs captured but never replayed: {sum(eagers.values())} eager forward(s)",
                **figures,
            )
        return passed(
            NAME,
            f"{phase} graphs captured on every rank (sizes {sizes[str(ranks[0])]}), "
            f"{sum(replays.values())} replay(s)",
            **figures,
        )
    if state == "disabled" and captured_any:
        w = next(
            w
            for w in ranks
            if sizes[str(w)] or any(r.event == "capture" and r.phase == phase for r in ev.ranks[w].graphs)
        )
        return failed(
            NAME, f"{phase} graphs should be disabled but rank {w} captured sizes {sizes[str(w)]}", **figures
        )
    if sum(replays.values()):
        w = next(w for w in ranks if replays[str(w)])
        return failed(
            NAME,
            f"{phase} should run eager but rank {w} replayed graphs {replays[str(w)]} time(s)",
            **figures,
        )
    quiet = [w for w in ranks if not steps[str(w)]]
    if quiet:
        return unknown(
            NAME,
            f"no {phase} Step records from rank {quiet[0]}: cannot tell eager from a silent probe",
            **figures,
        )
    return passed(
        NAME,
        f"{phase} ran eager on every rank ({sum(steps.values())} step records"
        + (", no capture)" if state == "disabled" else ")"),
        **figures,
    )


def _read(c: list[Any]) -> Written:
    phase, mode = c
    value = {"phase": Ident(phase), "mode": Ident(mode)}
    return Written(f"graph {phase}", value, {"phase": phase, "mode": mode})


def _write(key: str, v: Mapping[str, Any], show: Callable[[Any], str]) -> str:
    return f"graph {v['phase']} {v['mode']}"


SYNTAX = Syntax("graph", {"graph": _read}, _write, keys=tuple(f"graph {phase}" for phase in MODES))

CONTRACT = Contract(NAME, 50, GraphExpect, GraphParams, resolve, check, SYNTAX, repeatable=True,
                    dumped_when_absent=True, qualifier="phase", examples=("graph decode disabled",))
