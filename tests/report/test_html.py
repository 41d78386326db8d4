"""Specifications of cptest/report/html.py (and ownership.py, views.py, plots.py): report.html without
a browser. The browser test (test_html_browser.py) shows the same pages rendering in chromium."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from cptest.checks.load import load_archive
from cptest.cli import main
from cptest.contracts import LaunchParams, RowsParams, ServingParams
from cptest.evidence import Capacity, KvPool, Lifecycle, ProbeNote, RequestResult, Step
from cptest.pipeline import check_archive, finish_archive
from cptest.report.html import render_html, render_suite_html
from cptest.report.ownership import DOUBLE, HOLE, matrix, ownership
from cptest.store import Layout, verify
from cptest.testing.archives import colocate, dcp_steps, make_plan, rank_id, server_plan, write_archive
from cptest.verdict import Verdict, scenario_verdict

REPO = Path(__file__).resolve().parents[2]
DCP2 = next((REPO / "results/dcp2_llama_kv1").iterdir())
FAULT = next((REPO / "results/fault_kill_rank_dcp2").iterdir())
SECTIONS = ("verdicts", "ownership", "rows", "capacity", "latency", "outcomes", "environment", "scenario")
HOSTILE = "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">"


def _tags(html: str, name: str) -> int:
    return len(re.findall(rf"<{name}[\s>]", html, flags=re.IGNORECASE))


def dcp2_archive(d: Path, *, rid: str = "cptest-main-0", hole: bool = False, double: bool = False,
                 reason: str = "ready", error: str = "", note: str | None = None,
                 colocated: bool = False) -> Path:
    """A DCP2 archive of one request (prompt 8, 4 decode steps) with a verdict and a scenario; a
    `hole` drops rank 1's write of position 3, a `double` makes rank 0 write position 1 too;
    `colocated`: both ranks were co-located on GPU 0."""
    main = colocate(server_plan(world=2, dcp=2)) if colocated else server_plan(world=2, dcp=2)
    plan = make_plan(main, [
        LaunchParams(accepted=True, source="s.cps:3:5"),
        RowsParams(mode="dcp_owner", dcp=2, source="s.cps:4:5"),
    ], requests=1, prompt_len=8)  # fmt: skip
    ranks: dict[int, list] = {}
    for w in (0, 1):
        steps = list(dcp_steps(w, 2, {rid: 8}, 4))
        first = steps[0]
        kv = dict(first.kv_written)
        if hole and w == 1:
            kv[rid] = [(1, 2), (5, 6), (7, 8)]
        if double and w == 0:
            kv[rid] = [(0, 2), (2, 3), (4, 5), (6, 7)]
        steps[0] = first.model_copy(update={"kv_written": kv})
        recs: list = [KvPool(rank=rank_id(w, dcp=2), rows=64, allocator_size=128),
                      Capacity(rank=rank_id(w, dcp=2), max_total_num_tokens=128), *steps]
        if note is not None:
            recs.append(ProbeNote(rank=rank_id(w, dcp=2), level="warning", message=note))
        ranks[w] = recs
    runner = [Lifecycle(t=0.1, event="launched"), Lifecycle(t=1.0, event="ready"),
              RequestResult(t=1.5, index=0, prompt_len=8, max_new_tokens=4, prompt_sha256="x",
                            status="error" if error else "ok", error=error, output_ids=[1, 2, 3, 4],
                            sent_at=1.1, ttft_s=0.1, tpot_s=0.02, e2e_s=0.3),
              Lifecycle(t=2.0, event="signal", detail={"sig": "SIGTERM", "note": reason}),
              Lifecycle(t=2.2, event="shutdown_done")]  # fmt: skip
    write_archive(d, plan, ranks={"main": ranks}, runner={"main": runner}, logs={"main-node0.log": "ok\n"})
    (d / "scenario.cps").write_text(f'scenario synthetic {{\n  description "{reason}"\n}}\n')
    verdict = scenario_verdict("synthetic", "sglang", "0.5.17", [
        Verdict(checker="launch", status="pass", reason=reason, source="s.cps:3:5"),
        Verdict(checker="rows", status="fail", reason="hole", source="s.cps:4:5", figures={"x": reason}),
    ], placement=plan.placement)  # fmt: skip
    (d / "verdict.json").write_text(verdict.to_json())
    return d


@pytest.fixture(scope="module")
def dcp2_html() -> str:
    return render_html(DCP2)


def test_the_real_dcp2_report_has_every_section_a_row_per_verdict_and_its_source(dcp2_html: str) -> None:
    verdict = json.loads((DCP2 / "verdict.json").read_text())
    for sid in SECTIONS:
        assert f'id="{sid}"' in dcp2_html
    assert dcp2_html.count('<tr class="verdict ') == len(verdict["verdicts"])
    for v in verdict["verdicts"]:
        assert v["source"] in dcp2_html
    assert _tags(dcp2_html, "svg") == 5  # ownership, rows, capacity, latency, outcomes
    assert "could not be drawn" not in dcp2_html and 'class="absent"' not in dcp2_html
    assert "38283" in dcp2_html  # positions written per rank 19158 + 19125, as the rows checker counted
    assert "rank 0: 19158; rank 1: 19125" in dcp2_html


def test_a_report_fetches_nothing_and_runs_nothing(dcp2_html: str) -> None:
    assert _tags(dcp2_html, "script") == 0 and _tags(dcp2_html, "link") == 0
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", dcp2_html, flags=re.IGNORECASE)
    assert "@import" not in dcp2_html
    assert not re.search(r"url\(\s*['\"]?(?!#)", dcp2_html)  # only clip paths of the page itself: url(#id)
    assert "default-src 'none'" in dcp2_html  # the CSP forbids any fetch or script a bug could add
    assert not re.search(r"<\?xml|<!DOCTYPE svg", dcp2_html)  # SVG pasted as elements, not documents


def test_a_fault_report_is_byte_for_byte_the_same_twice_and_shows_the_fault() -> None:
    first, second = render_html(FAULT), render_html(FAULT)
    assert first == second
    assert "Planned faults" in first and '"after_requests": 8' in first
    assert "Request outcomes: error 24, ok 8." in first
    assert "ClientPayloadError" in first  # the in-flight requests of the killed server


def test_holes_and_double_writes_are_counted_and_coloured(tmp_path: Path) -> None:
    ev = load_archive(dcp2_archive(tmp_path / "a", hole=True, double=True)).evidence.role("main")
    own = ownership(ev)
    assert not isinstance(own, str)
    (group,) = own.groups
    (req,) = group.requests
    assert (req.end, req.holes, req.doubles) == (12, [(3, 4)], [(1, 2)])
    codes, per, shown = matrix(group, max_requests=10, max_columns=100)
    assert (per, shown, codes.shape) == (1, 1, (2, 12))
    assert codes[0, 1] == DOUBLE and codes[1, 1] == DOUBLE and codes[0, 3] == HOLE and codes[1, 3] == HOLE
    assert list(codes[0, 4:8]) == [2, 1, 2, 1]  # rank 0 owns even positions, rank 1's show as another's
    binned, per, _ = matrix(group, max_requests=10, max_columns=3)
    assert per == 4 and list(binned[0]) == [DOUBLE, 2, 2]  # a column shows the worst it covers
    html = render_html(tmp_path / "a")
    assert "Hole: request <code>cptest-main-0</code>, positions [3, 4)" in html
    assert "Double write: request <code>cptest-main-0</code>, positions [1, 2)" in html


def test_hostile_text_of_an_archive_is_escaped_everywhere(tmp_path: Path) -> None:
    d = dcp2_archive(tmp_path / "a", rid=HOSTILE, reason=HOSTILE, error=HOSTILE, note=HOSTILE)
    html = render_html(d)
    assert _tags(html, "script") == 0 and _tags(html, "img") == 0
    escaped = "&lt;script&gt;window.__pwned=1&lt;/script&gt;"
    # the verdict's reason, its figures, the scenario, the probe note, the request's error, the lifecycle
    # detail and the rids in the ownership table all show the text, escaped
    assert html.count(escaped) >= 6
    assert "&lt;script&gt;w~" in html  # the ownership map's request label, escaped by matplotlib's SVG writer


def test_an_archive_without_evidence_says_so_in_every_section(tmp_path: Path) -> None:
    d = tmp_path / "bare"
    write_archive(d, make_plan(server_plan(world=2, dcp=2), [LaunchParams(accepted=True, source="s.cps:3:5")],
                               requests=1))
    html = render_html(d)
    assert "No verdict.json: the archive was never checked" in html
    assert "no probe evidence from any rank" in html
    assert "no runner evidence for main" in html
    assert "No scenario.cps in this archive" in html and "No readable manifest.json" in html
    assert 'id="pins"' in html  # from the plan
    assert "evidence/main/rank0.jsonl" in html  # named as missing
    assert _tags(html, "svg") == 0 and "could not be drawn" not in html


def test_a_run_without_step_records_has_no_rows_but_its_latencies(tmp_path: Path) -> None:
    d = dcp2_archive(tmp_path / "a")
    for w in (0, 1):  # a CUDA-graph run: the probe wrote its pool and capacity, no step
        path = Layout(d).rank_file("main", w)
        kept = [line for line in path.read_text().splitlines() if '"step"' not in line]
        path.write_text("".join(line + "\n" for line in kept))
    html = render_html(d)
    assert html.count("no Step records from any rank") == 2  # ownership and rows
    assert "No timeline: no rank recorded a K/V write" in html
    assert _tags(html, "svg") == 2  # latency and outcomes


def test_a_colocated_report_states_its_placement_first_and_labels_its_latencies(tmp_path: Path) -> None:
    html = render_html(dcp2_archive(tmp_path / "a", colocated=True))
    assert html.index('id="colocated"') < html.index('id="placement"') < html.index('id="verdicts"')
    placement = html[html.index('<section id="placement">'):html.index('<section id="verdicts">')]
    for shown in ("rank 0: GPU 0<br>rank 1: GPU 0", "<th>ranks per GPU</th><td class=\"num\">2</td>",
                  "NCCL over sockets on loopback", "NCCL_SOCKET_IFNAME=lo",
                  "node 1: NCCL_HOSTID=cptest-node1", "--disable-custom-all-reduce",
                  "0.25 (the scenario&#39;s mem_fraction 0.5 / 2 rank(s) per GPU)",
                  "<li>speed: throughput and latency figures"):
        assert shown in placement, shown
    latency = html[html.index('<section id="latency"'):html.index('<section id="outcomes"')]
    assert "these figures are not speed measurements" in latency
    physical = render_html(dcp2_archive(tmp_path / "b"))
    assert 'id="placement"' not in physical and "not speed measurements" not in physical


def test_unreadable_evidence_is_shown_not_raised(tmp_path: Path) -> None:
    d = dcp2_archive(tmp_path / "a")
    path = Layout(d).rank_file("main", 0)
    path.write_text('{"v": 1, "kind": "nonsense"}\n' + path.read_text())
    html = render_html(d)
    assert 'id="problem"' in html and "rank0.jsonl" in html
    assert "the evidence could not be read" in html
    assert "could not be drawn" not in html and 'id="verdict-table"' in html


def test_an_older_evidence_version_and_a_reference_engine_render(tmp_path: Path) -> None:
    d = tmp_path / "ref"
    plan = make_plan(server_plan(world=1, engine="reference", release="builtin"),
                     [ServingParams(completed_min=1, of=1, source="r.cps:5:5")], requests=1)  # fmt: skip
    step = Step(rank=rank_id(0), step=1, mode="extend", batch_size=1, rows_in=4, kv_written={"r": [(0, 4)]})
    v1 = json.loads(step.model_dump_json()) | {"v": 1}
    write_archive(d, plan, ranks={"main": {0: [json.dumps(v1)]}}, runner={"main": []})
    (d / "verdict.json").write_text(scenario_verdict("synthetic", "reference", "", [
        Verdict(checker="serving", status="unknown", reason="no requests", source="r.cps:5:5")]).to_json())
    html = render_html(d)
    assert 'id="not-sglang"' in html and "never count as SGLang qualification" in html
    assert "No DCP: every rank keeps the whole K/V" in html
    assert "no request records from any server" in html


def test_finishing_an_archive_writes_report_html_that_verify_covers_and_check_write_reproduces(
        tmp_path: Path) -> None:
    d = dcp2_archive(tmp_path / "a")
    (d / "verdict.json").unlink()
    from cptest.checks import check

    finish_archive(d, check(d, require_finished=False))
    written = (d / "report.html").read_text()
    assert written.startswith("<!DOCTYPE html>") and 'id="verdict-table"' in written
    assert verify(d) == []
    check_archive(d, write=True, integrity=False)  # a synthetic archive: no scenario to recompile
    assert (d / "report.html").read_text() == written and verify(d) == []
    (d / "report.html").write_text(written + "<!-- edited -->")
    assert [p.message for p in verify(d)] == ["report.html changed since the run"]


def test_cli_report_refuses_an_archive_that_has_no_seal(tmp_path: Path) -> None:
    # A synthetic archive has no manifest.json: nothing says its evidence is what a run wrote.
    d = dcp2_archive(tmp_path / "a")
    for args in (["report", str(d)], ["report", str(d), "--html"]):
        done = CliRunner().invoke(main, args)
        assert done.exit_code == 3 and "archive has no manifest.json" in done.output, done.output


def test_cli_report_html_prints_or_writes_the_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The wiring only: the synthetic archive stands in for a sealed one that `judge` accepted.
    from cptest import pipeline
    from cptest.checks import load_plan
    from cptest.verdict import read_verdict

    d = dcp2_archive(tmp_path / "a")
    monkeypatch.setattr(pipeline, "judge", lambda root: pipeline.Judged(
        read_verdict(root / "verdict.json"), load_plan(root), "0" * 64, None))
    printed = CliRunner().invoke(main, ["report", str(d), "--html"])
    assert printed.exit_code == 0 and printed.output.startswith("<!DOCTYPE html>")
    out = tmp_path / "r.html"
    written = CliRunner().invoke(main, ["report", str(d), "--html", "-o", str(out)])
    assert written.exit_code == 0 and out.read_text() == render_html(d)
    markdown = CliRunner().invoke(main, ["report", str(d)])
    assert markdown.exit_code == 0 and markdown.output.startswith("# synthetic: FAIL")


def test_the_suite_index_links_each_scenarios_report_where_it_is_found(tmp_path: Path) -> None:
    results = tmp_path / "results"
    archive = dcp2_archive(results / "synthetic" / "20260101T000000Z-00000000")
    (archive / "report.html").write_text(render_html(archive))
    plain = dcp2_archive(results / "old" / "20260101T000000Z-11111111")
    suite = results / "_suites" / "20260101T000000Z"
    suite.mkdir(parents=True)
    moved = f"/elsewhere/results/synthetic/{archive.name}"  # a results tree copied since the suite ran
    scenarios = [
        {"scenario": "synthetic", "status": "fail", "exit_code": 1, "duration_s": 3.5, "archive": moved},
        {"scenario": "old", "status": "pass", "exit_code": 0, "duration_s": 1.0, "archive": str(plain)},
        {"scenario": "gone", "status": "unknown", "exit_code": 3, "archive": "/nowhere/gone/x"},
        {"scenario": HOSTILE, "status": "unknown", "exit_code": 3, "not_run": HOSTILE},
    ]
    (suite / "suite.json").write_text(json.dumps({"scenarios": scenarios, "wall_s": 9.0,
                                                  "counts": {"pass": 1, "fail": 1, "unknown": 2}}))
    html = render_suite_html(suite)
    assert html.count('<tr class="scenario">') == 4
    assert 'href="../../synthetic/20260101T000000Z-00000000/report.html"' in html
    assert "no report.html (an archive made before cptest wrote one" in html
    assert "archive not found on this machine" in html
    assert _tags(html, "script") == 0 and "&lt;script&gt;" in html
    via_cli = CliRunner().invoke(main, ["report", str(suite), "--html"])
    assert via_cli.exit_code == 0 and 'id="suite-table"' in via_cli.output
    # Without --html a suite folder's report is the summary the suite wrote, not an archive's error.
    missing = CliRunner().invoke(main, ["report", str(suite)])
    assert missing.exit_code == 3 and "has no summary.md" in missing.output
    (suite / "summary.md").write_text("# suite 20260101T000000Z: 1 pass, 1 fail, 2 unknown\n")
    summary = CliRunner().invoke(main, ["report", str(suite)])
    assert summary.exit_code == 0 and summary.output.startswith("# suite 20260101T000000Z: 1 pass")
    shutil.rmtree(plain)
