"""Specifications of cptest/report/support.py and cptest/engines/sglang/cells.py: the support matrix
(docs/support-matrix.md, `cptest matrix --support`, docs/decisions.md D61)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from cptest.checks.archived import parse_archived
from cptest.cli import matrix_judge
from cptest.engines.sglang.cells import (
    CELL_RULES,
    Cell,
    RuledOut,
    cell_rules,
    cells,
    default_release,
    evidence_archives,
    in_cell,
    ruled_out,
)
from cptest.engines.sglang.releases import get_release
from cptest.lang import parse_file
from cptest.report.support import (
    ArchiveRun,
    Outside,
    locate,
    read_inputs,
    render_support,
    support_matrix,
)
from cptest.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
RELEASE = get_release("0.5.17")
DOC = ROOT / "docs" / "support-matrix.md"


def _scenario(name: str) -> Scenario:
    return parse_file(ROOT / "scenarios" / f"{name}.cps")


def _with_backend(s: Scenario, backend: str) -> Scenario:
    return s.model_copy(update={"serve": s.serve.model_copy(update={"attention_backend": backend})})


def _row(md: str, family: str, *cells: str) -> str:
    """The one markdown row of the family's section (its title starts with `family`) that starts with
    these cells (the grid's coordinates)."""
    md = md.split(f"\n## {family}", 1)[1].split("\n## ", 1)[0]
    head = "| " + " | ".join(cells) + " |"
    rows = [line for line in md.splitlines() if line.startswith(head)]
    assert len(rows) == 1, (head, rows)
    return rows[0]


RUN = ArchiveRun("results/dcp2_llama_kv1/20990101T000000Z-feedface", "dcp2_llama_kv1", "fail",
                 {"launch": "pass", "rows": "pass", "capacity": "fail", "generation": "pass"})


# ------------------------------------------------------------------------------ the committed document
def test_the_committed_support_matrix_is_what_cptest_generates_now(monkeypatch: pytest.MonkeyPatch):
    # As `cptest matrix --support -o docs/support-matrix.md` from the checkout writes it, each archive
    # read as the command reads it (its newest re-analysis where `cptest check --write` made one).
    monkeypatch.chdir(ROOT)
    scenarios, runs, skipped = read_inputs(RELEASE, Path("scenarios"), [Path("results")], matrix_judge())
    assert skipped == []
    fresh = render_support(support_matrix(RELEASE, scenarios, runs))
    assert DOC.read_text(encoding="utf-8") == fresh, (
        "docs/support-matrix.md is stale: run `cptest matrix --support -o docs/support-matrix.md` and "
        "commit it")


def test_no_cell_of_the_committed_matrix_is_blank():
    md = DOC.read_text(encoding="utf-8")
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| KV regime")
            and not line.startswith("| scenario |")]
    assert len(rows) >= len(cells())
    for row in rows:
        values = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        state = 4 if len(values) == 7 else 2  # the grid's rows have 7 columns, the others 5
        assert all(values), row
        assert values[state] in ("run", "ruled out", "not yet run"), row
        if values[-1] == "-":  # nothing to cite: only a cell no scenario can run yet, saying why
            assert values[state] == "not yet run" and "no scenario" in values[state + 1], row


def test_every_grid_cell_is_run_ruled_out_or_names_what_would_run_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(ROOT)
    m = support_matrix(RELEASE, *read_inputs(RELEASE, Path("scenarios"), [Path("results")])[:2])
    assert [e.cell for e in m.grid] == cells()
    for e in m.grid:
        if e.state == "run":
            assert e.runs and all(r.archive.startswith("results/") and r.contracts for r in e.runs)
        elif e.state == "ruled out":
            assert e.rule is not None and (e.rule.citation or e.rule.evidence)
        else:
            assert e.scenarios or e.note, e
    counts = m.counts()
    assert counts["run"] + counts["ruled out"] + counts["not yet run"] == counts["grid cells"] == 168


# ------------------------------------------------------------------------------ the generator
def test_a_cell_with_an_archive_shows_its_verdict_and_each_contracts():
    s = _scenario("dcp2_llama_kv1")
    m = support_matrix(RELEASE, {}, [(s, RUN)])
    entry = next(e for e in m.grid if e.cell == Cell("llama", "kv<=tp/dcp", "dcp2", "triton", "eager"))
    assert entry.state == "run" and entry.runs == (RUN,)
    row = _row(render_support(m), "Llama", "`kv<=tp/dcp`", "dcp2", "triton", "eager")
    assert "| run | **FAIL** (launch PASS, rows PASS, capacity FAIL, generation PASS) |" in row
    assert row.endswith("| `results/dcp2_llama_kv1/20990101T000000Z-feedface` |")


def test_a_ruled_out_cell_shows_the_sglang_source_lines_of_its_rule():
    m = support_matrix(RELEASE, {}, [])
    row = _row(render_support(m), "Qwen3 dense", "`kv<=tp/dcp`", "dcp2", "flashinfer", "eager")
    assert "ruled out, `dcp_backend_without_dcp_path` (inferred)" in row
    # The citation is the release table's rule's, as a path in the wheel.
    cited = RELEASE.rules["dcp_backend_without_dcp_path"].citation
    assert cited == "layers/attention/triton_backend.py:182-187"
    assert "`sglang/srt/layers/attention/triton_backend.py:182-187`" in row


def test_a_run_is_shown_even_where_a_rule_rules_the_cell_out_and_the_rule_is_named():
    s = _scenario("dcp2_llama_kv4")
    run = ArchiveRun("results/dcp2_llama_kv4/x", "dcp2_llama_kv4", "fail",
                     {"generation": "pass (no-go seen)"})
    m = support_matrix(RELEASE, {}, [(s, run)])
    e = next(e for e in m.grid if e.cell == Cell("llama", "kv>tp/dcp", "dcp2", "triton", "eager"))
    assert e.state == "run" and e.rule is not None and e.rule.code == "mha_dcp_kv_not_replicated"
    assert e.rule.provenance == "observed"


def test_a_cell_nobody_ran_names_the_scenario_that_would_run_it_or_why_none_can():
    s = parse_file(ROOT / "scenarios" / "qualification" / "dcp2_mla_flashinfer_eager.cps")
    m = support_matrix(RELEASE, {"scenarios/qualification/dcp2_mla_flashinfer_eager.cps": s}, [])
    e = next(e for e in m.grid if e.cell == Cell("mla", "latent", "dcp2", "flashinfer", "eager"))
    assert e.state == "not yet run"
    assert e.scenarios == ("scenarios/qualification/dcp2_mla_flashinfer_eager.cps",)
    # Without a scenario the cell says so and where one belongs.
    qwen3 = next(e for e in m.grid if e.cell == Cell("qwen3", "kv<=tp/dcp", "dcp2", "triton", "eager"))
    assert qwen3.state == "not yet run" and qwen3.scenarios == ()
    assert "write one under scenarios/qualification" in qwen3.note


def test_the_qwen3_moe_cells_are_run_and_name_the_rule_their_runs_showed(monkeypatch: pytest.MonkeyPatch):
    # cptest writes synthetic Qwen3-MoE weights (D64). Both DCP cells were run, and the rule (K/V
    # written inside RoPE, past DCP's owner mask) is named beside them, observed in each: it cites
    # both archives. The PCP cell was run too, under its inferred rule. No cell of the grid is left
    # without a scenario.
    monkeypatch.chdir(ROOT)
    scenarios, runs, _ = read_inputs(RELEASE, Path("scenarios"), [Path("results")], matrix_judge())
    m = support_matrix(RELEASE, scenarios, runs)
    for decode in ("eager", "graph"):
        e = next(e for e in m.grid if e.cell == Cell("qwen3-moe", "kv<=tp/dcp", "dcp2", "triton", decode))
        assert e.state == "run" and e.rule is not None and e.rule.code == "dcp_fused_rope_kv_write"
        assert e.rule.provenance == "observed" and not e.rule.observed_on
        assert [r.scenario for r in e.runs] == [f"dcp2_qwen3_moe_kv1_{decode}"]
        assert e.runs[0].contracts["generation"] == "fail"
    pcp = parse_file(ROOT / "scenarios" / "qualification" / "pcp2_zigzag_qwen3_moe_kv1.cps")
    assert locate(pcp) == Cell("qwen3-moe", "kv<=tp/dcp", "pcp2-zigzag", "triton", "eager")
    e = next(e for e in m.grid if e.cell == locate(pcp))
    assert e.state == "run" and e.rule is not None and e.rule.code == "pcp_backend_without_cp_path"
    assert m.counts()["no scenario"] == 0


def test_where_a_scenario_falls():
    assert locate(_scenario("dcp2_llama_kv1")) == Cell("llama", "kv<=tp/dcp", "dcp2", "triton", "eager")
    assert locate(_scenario("dcp2_llama_kv4")) == Cell("llama", "kv>tp/dcp", "dcp2", "triton", "eager")
    assert locate(_scenario("pcp2_zigzag_qwen3_kv2")) == Cell("qwen3", "kv<=tp/dcp", "pcp2-zigzag", "triton",
                                                               "eager")
    graph = parse_file(ROOT / "scenarios" / "qualification" / "dcp2_mla_flashinfer_graph.cps")
    assert locate(graph) == Cell("mla", "latent", "dcp2", "flashinfer", "graph")
    assert locate(_with_backend(_scenario("dcp2_llama_kv1"), "fa3")).backend == "fa3"  # type: ignore[union-attr]
    outside = locate(_scenario("tp8_dcp2_qwen3_30b_geometry"))
    assert isinstance(outside, Outside) and outside.gpus == 8
    assert isinstance(locate(_scenario("pcp_dcp_rejected")), Outside)  # PCP with DCP: no grid mode


def test_a_scenario_of_more_ranks_than_gpus_runs_co_located_and_only_beyond_that_is_ruled_out():
    path = "scenarios/tp8_dcp2_qwen3_30b_geometry.cps"
    m = support_matrix(RELEASE, {path: _scenario("tp8_dcp2_qwen3_30b_geometry")}, [])
    (e,) = m.outside
    assert e.state == "not yet run" and e.rule is None and e.scenarios == (path,)
    assert e.note == "runs co-located: 8 ranks on the lent GPU"
    wide = _scenario("tp8_dcp2_qwen3_30b_geometry")
    wide = wide.model_copy(update={"topology": wide.topology.model_copy(update={"gpus": 64, "tp": 64})})
    (e,) = support_matrix(RELEASE, {path: wide}, []).outside
    assert e.state == "ruled out" and e.rule is not None and e.rule.code == "more_ranks_than_colocated"


def test_a_rule_reuses_the_release_table_where_it_has_one_and_otherwise_cites_its_own_lines():
    for rule in CELL_RULES["0.5.17"]:
        if rule.rule:
            assert rule.rule in RELEASE.rules and not rule.citation, rule.code
        else:
            assert re.search(r"\.py:\d+", rule.citation), rule.code
    # A reused rule carries the release table's provenance and evidence, not a copy.
    got = ruled_out(RELEASE, Cell("qwen3", "kv>tp/dcp", "dcp2", "triton", "graph"))
    assert got is not None and got.evidence == RELEASE.rules["mha_dcp_kv_not_replicated"].evidence


def test_the_default_release_is_a_known_release_with_cell_rules():
    # `matrix --support` without --release reads it: it must have a table, and a release entry.
    assert cell_rules(default_release()) and get_release(default_release()).name == default_release()


def test_the_first_matching_rule_wins_and_a_cell_with_a_path_is_left_to_a_run():
    # Dense Qwen3 PCP with fa3: the PCP flags are a no-op on a class outside CP v2, whatever the
    # backend, so that rule is named before any backend's.
    got = ruled_out(RELEASE, Cell("qwen3", "kv<=tp/dcp", "pcp2-zigzag", "fa3", "eager"))
    assert got is not None and got.code == "pcp_not_cp_v2_class"
    got = ruled_out(RELEASE, Cell("qwen3", "kv<=tp/dcp", "dcp2", "fa3", "eager"))
    assert got is not None and got.code == "dcp_backend_without_dcp_path"
    # fa3 and FlashMLA are installable on the lent machine (the kernel extras), so only SGLang's own
    # code rules their cells out: fa3's zigzag path on a CP-v2 class is left to runs.
    assert ruled_out(RELEASE, Cell("qwen3-moe", "kv<=tp/dcp", "pcp2-zigzag", "fa3", "eager")) is None
    assert ruled_out(RELEASE, Cell("mla", "latent", "pcp2-zigzag", "fa3", "graph")) is None
    # The rule as the release table holds it is observed; the graph cell shows it inferred, since the
    # archive it cites ran eager decode (`in_cell`, the next tests).
    got = ruled_out(RELEASE, Cell("mla", "latent", "dcp2", "flashmla", "graph"))
    assert got is not None and got.code == "mla_dcp_flashmla_lse_unpacked" and got.provenance == "observed"
    assert ruled_out(RELEASE, Cell("mla", "latent", "dcp2", "flashinfer", "graph")) is None


# ------------------------------------------------------------------------------ observed where it was run
def test_a_rule_is_observed_only_in_the_cell_its_cited_archive_ran():
    eager = Cell("llama", "kv>tp/dcp", "dcp2", "triton", "eager")
    rule = RuledOut("r", "why", "x.py:1", "observed", "results/dcp2_llama_kv4/20990101T000000Z-feedface")
    ran = {"results/dcp2_llama_kv4/20990101T000000Z-feedface": eager}.get
    assert in_cell(rule, eager, ran) == rule
    for other in (Cell("llama", "kv>tp/dcp", "dcp2", "triton", "graph"),  # another decode
                  Cell("qwen3", "kv>tp/dcp", "dcp2", "triton", "eager"),  # another family
                  Cell("llama", "kv>tp/dcp", "dcp2", "fa3", "eager"),  # another backend
                  Cell("llama", "kv<=tp/dcp", "dcp2", "triton", "eager")):  # another KV regime
        got = in_cell(rule, other, ran)
        assert got.provenance == "inferred" and got.observed_on == "llama kv>tp/dcp dcp2 triton eager", other
        assert got.evidence == rule.evidence  # the archive is still cited, as where it was seen
    # An archive of no known cell leaves every cell inferred; evidence that is no archive (the
    # release's parser in CI) and an inferred rule are left as they are.
    assert in_cell(rule, eager, lambda _: None).provenance == "inferred"
    ci = RuledOut("r", "why", "x.py:1", "observed", "tests/sglang_src/test_rules_differential.py (in CI)")
    assert evidence_archives(ci.evidence) == () and in_cell(ci, eager, ran) == ci
    inferred = RuledOut("r", "why", "x.py:1", "inferred", "")
    assert in_cell(inferred, eager, ran) == inferred


def test_the_matrix_says_observed_only_where_the_cited_archive_ran():
    s = _scenario("dcp2_llama_kv4")
    run = ArchiveRun("results/dcp2_llama_kv4/x", "dcp2_llama_kv4", "fail",
                     {"generation": "pass (no-go seen)"})
    graph = parse_file(ROOT / "scenarios" / "qualification" / "dcp2_llama_kv4_graph.cps")
    md = render_support(support_matrix(RELEASE, {"graph.cps": graph}, [(s, run)]))
    # The rule cites a run of each scenario: Llama on eager decode, and (by the scenario's name, not
    # run here) on graph decode; every other cell it rules out names both.
    for decode in ("eager", "graph"):
        assert "`mha_dcp_kv_not_replicated` (observed)" in _row(md, "Llama", "`kv>tp/dcp`", "dcp2", "triton",
                                                                 decode)
    elsewhere = ("(inferred here; observed on `llama kv>tp/dcp dcp2 triton eager`; "
                 "`llama kv>tp/dcp dcp2 triton graph`)")
    assert elsewhere in _row(md, "Llama", "`kv>tp/dcp`", "dcp2", "flashinfer", "graph")
    assert elsewhere in _row(md, "Qwen3 dense", "`kv>tp/dcp`", "dcp2", "triton", "eager")
    assert elsewhere in _row(md, "Qwen3-MoE", "`kv>tp/dcp`", "dcp2", "fa3", "graph")


def _grid_rows(md: str) -> list[tuple[Cell, str]]:
    """(cell, row) of every grid row of the document, its family from its section's title."""
    titles = {"Llama (": "llama", "Qwen3 dense": "qwen3", "Qwen3-MoE": "qwen3-moe",
              "DeepSeek-style MLA": "mla"}
    out: list[tuple[Cell, str]] = []
    for section in md.split("\n## ")[1:]:
        family = next((f for t, f in titles.items() if section.startswith(t)), None)
        if family is None:
            continue
        for row in section.splitlines():
            values = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
            if len(values) == 7 and values[0].startswith("`"):
                out.append((Cell(family, values[0].strip("`"), *values[1:4]), row))  # type: ignore[arg-type]
    return out


def test_no_cell_of_the_committed_matrix_is_observed_by_an_archive_of_another_cell():
    # Each cited archive read as it was run (its own scenario.cps), not by name: the committed matrix
    # says `(observed)` only in the cell one of the rule's archives ran, and names that cell elsewhere.
    rows = _grid_rows(DOC.read_text(encoding="utf-8"))
    assert [c for c, _ in rows] == cells()
    where: dict[str, object] = {}
    observed = 0
    for cell, row in rows:
        rule = ruled_out(RELEASE, cell)
        archives = evidence_archives(rule.evidence) if rule is not None else ()
        for a in archives:
            if a not in where:
                where[a] = locate(parse_archived(ROOT / a))
        ran = [where[a] for a in archives]
        if "(observed)" in row:
            observed += 1
            assert rule is not None and f"`{rule.code}` (observed)" in row, row
            assert not archives or cell in ran, (cell, archives, ran)
        if rule is not None and rule.provenance == "observed" and archives and cell not in ran:
            assert "(observed)" not in row and "inferred here; observed on " in row, row
            for c in ran:
                assert isinstance(c, Cell) and f"`{c.words()}`" in row, row
    # one cell per archive a rule cites: 7 rules, 4 of them with a graph twin of their eager archive
    assert observed == 11


def test_a_colocated_run_is_labelled_in_its_cell_beside_a_physical_run_of_the_same_scenario():
    s = _scenario("dcp2_llama_kv1")
    colocated = ArchiveRun("results/dcp2_llama_kv1/21000101T000000Z-c0c0c0c0", "dcp2_llama_kv1", "pass",
                           {"launch": "pass", "rows": "pass"}, placement="colocated")
    m = support_matrix(RELEASE, {}, [(s, RUN), (s, colocated)])
    row = _row(render_support(m), "Llama", "`kv<=tp/dcp`", "dcp2", "triton", "eager")
    assert ("| run | **FAIL** (launch PASS, rows PASS, capacity FAIL, generation PASS); "
            "co-located: **PASS** (launch PASS, rows PASS) |") in row
    assert row.endswith("| `results/dcp2_llama_kv1/20990101T000000Z-feedface`<br>"
                        "`results/dcp2_llama_kv1/21000101T000000Z-c0c0c0c0` (co-located) |")


def test_the_newest_archive_is_read_per_scenario_and_placement(tmp_path: Path):
    # A newer co-located archive does not push the physical one out of the matrix, nor the reverse.
    committed = next((ROOT / "results" / "dcp2_llama_kv1").iterdir())
    results = tmp_path / "results"
    for stamp, placement in (("20990101T000000Z-aaaaaaaa", "physical"),
                             ("20990102T000000Z-bbbbbbbb", "colocated"),
                             ("20990103T000000Z-cccccccc", "physical")):
        d = results / "dcp2_llama_kv1" / stamp
        d.mkdir(parents=True)
        shutil.copy(committed / "scenario.cps", d / "scenario.cps")
        shutil.copytree(committed / "includes", d / "includes")
        verdict = {k: v for k, v in json.loads((committed / "verdict.json").read_text()).items()
                   if k != "placement"}
        (d / "verdict.json").write_text(json.dumps(verdict | ({"placement": placement}
                                                             if placement == "colocated" else {})))
    _, runs, skipped = read_inputs(RELEASE, ROOT / "scenarios", [results])
    assert skipped == []
    assert sorted((r.archive, r.placement) for _, r in runs) == [
        ("results/dcp2_llama_kv1/20990102T000000Z-bbbbbbbb", "colocated"),
        ("results/dcp2_llama_kv1/20990103T000000Z-cccccccc", "physical")]
