"""Specifications of cptest/scenario.py: the typed model's contract with later stages."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from cptest.errors import Span
from cptest.scenario import Baseline, Dist, Scenario, Topology, baseline_topology, json_schema


def test_equality_and_dump_ignore_positions():
    a = Topology(gpus=2, tp=2, span=Span("a.cps", 1, 1), field_spans={"tp": Span("a.cps", 1, 5)})
    b = Topology(gpus=2, tp=2, span=Span("b.cps", 9, 9))
    assert a == b and hash(a) == hash(b)
    assert "span" not in a.model_dump() and "field_spans" not in a.model_dump()
    assert a != Topology(gpus=2, tp=2, dcp=2)


def test_nodes_are_frozen_and_reject_unknown_fields():
    t = Topology(gpus=1, tp=1)
    with pytest.raises(ValidationError):
        t.tp = 2  # type: ignore[misc]
    with pytest.raises(ValidationError):
        Topology(gpus=1, tp=1, tpp=1)  # type: ignore[call-arg]


def test_json_schema_names_every_block_and_no_positions():
    schema = json_schema()
    text = json.dumps(schema)
    assert set(schema["required"]) >= {"name", "engine", "model", "topology", "workload"}
    assert "field_spans" not in text and '"span"' not in text and "source_file" not in text
    assert schema == Scenario.model_json_schema()


def test_where_falls_back_to_the_node_span():
    t = Topology(gpus=2, tp=2, span=Span("a.cps", 3, 3), field_spans={"tp": Span("a.cps", 3, 20)})
    assert t.where("tp") == Span("a.cps", 3, 20) and t.where("dcp") == Span("a.cps", 3, 3)


def test_baseline_drops_context_parallelism_unless_overridden():
    main = Topology(gpus=4, tp=4, dcp=4)
    b = baseline_topology(main, Baseline(tp=2))
    assert b is not None and (b.gpus, b.tp, b.dcp, b.attn_cp, b.prefill_cp) == (2, 2, 1, 1, False)
    pcp = baseline_topology(main, Baseline(attn_cp=2, cp_strategy="zigzag"))
    assert pcp is not None and pcp.prefill_cp and pcp.gpus == 4


@pytest.mark.parametrize(
    ("dist", "bounds"),
    [
        (Dist(kind="fixed", n=0), (0, 0)),
        (Dist(kind="uniform", lo=3, hi=9), (3, 9)),
        (Dist(kind="choice", choices=[64, 16, 256]), (16, 256)),
    ],
)
def test_dist_bounds(dist: Dist, bounds: tuple[int, int]):
    assert dist.bounds() == bounds
