"""The `topology` and `baseline` blocks: the servers' parallel degrees, checked against the layout
rules of `cptest.topology` and positioned at the setting to change."""

from __future__ import annotations

from cptest.errors import ProblemCollector, Span
from cptest.lang.settings import Values, missing_block, node, was_written
from cptest.lang.syntax import BLOCK
from cptest.scenario import Baseline, Topology, baseline_topology
from cptest.topology import ADMISSION_CODES, layout_problems


def topology_block(v: Values, where: Span, about_admission: bool) -> Topology | None:
    opener = v.stmt("", "topology")
    if opener is None:
        missing_block(v, "topology", where)
        return None
    values, spans = v.block("topology")
    for key in ("gpus", "tp"):
        if key not in values and not was_written(v, "topology", key):
            v.p.add(opener.span, f"topology needs {key}")
    if (
        "gpus" not in values
        or "tp" not in values
        or len(values) < len([k for (b, k) in v.one if b == "topology"])
    ):
        return None
    values.setdefault("prefill_cp", values.get("cp_strategy") is not None)
    topo = node(Topology, v.p, opener.span, field_spans=spans, **values)
    if topo is None:
        return None
    _check_geometry(v.p, topo, "topology", about_admission)
    return topo


def _check_geometry(p: ProblemCollector, t: Topology, label: str, about_admission: bool) -> None:
    """The layout rules of `cptest.topology`, positioned at the setting to change. Those SGLang also
    enforces itself are left to the engine when the scenario is about that rejection: the engine's
    own refusal is then the evidence."""
    hint = 'a scenario about this rejection declares: expect { launch rejected matching "..." }'
    for problem in layout_problems(t):
        admission = problem.code in ADMISSION_CODES
        if admission and about_admission:
            continue
        p.add(t.where(problem.field), f"{label}: {problem.message}", expected=problem.expected,
              hint=hint if admission else None)


def baseline_block(v: Values, topo: Topology | None) -> Baseline | None:
    s = v.stmt("", "baseline")
    if s is None:
        return None
    if s.value is not BLOCK:
        if str(s.value) != "none":
            v.p.add(
                s.span,
                f"unknown baseline {str(s.value)!r}",
                expected="baseline none or baseline { tp N ... }",
            )
        return None
    values, spans = v.block("baseline")
    base = node(Baseline, v.p, s.span, field_spans=spans, **values)
    if base is not None and topo is not None:
        resolved = baseline_topology(topo, base)
        if resolved is not None:
            _check_geometry(v.p, resolved, "baseline", about_admission=False)
    return base
