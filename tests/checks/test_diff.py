"""Specifications of cptest/checks/diff.py and of `cptest diff` / `cptest rerun`'s diff: evidence of
two archives compared exactly, within the plan's tolerances, or as measurements.

Most cases start from two real runs of one small DCP2 scenario on the CPU reference engine (about
40 s for both on 2 cores) and alter a copy of the second archive's evidence: a changed token, a
logprob moved inside or outside the declared bound, a slower request, a K/V position lost.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cptest.checks.diff import PLACEMENT_BOUND, DiffRefused, diff
from cptest.contracts.parity import f32_ulp
from cptest.plan.model import Plan
from cptest.testing.archives import colocate
from tests.reference.conftest import free_port
from tests.test_store import finished_run

REPO = Path(__file__).resolve().parents[2]

SCENARIO = """\
cptest 1
scenario diff_reference {
  description "a small DCP2 scenario on the reference engine, run twice for the diff"
  engine reference "builtin"
  model synthetic llama {
    layers 2
    hidden 128
    heads 4
    kv_heads 1
    head_dim 32
    vocab 512
    intermediate 256
    seed 3
  }
  topology {
    gpus 2
    tp 2
    dcp 2
  }
  baseline {
    tp 1
  }
  workload {
    requests 6
    concurrency 3
    seed 7
    prompt_tokens uniform(16, 64)
    output_tokens 8
    sampling greedy
    timeout 60s
  }
  expect {
    launch accepted
    rows kv_owner position % 2
    generation logprob max <= 0.001 free_running topk 5 vs baseline
    serving all_complete
  }
}
"""
LOGPROB_BOUND = 0.001
"""The bound the scenario declares: the diff's logprob tolerance."""


def cptest(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cptest", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two archives of the scenario, run one after the other on the reference engine."""
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    root = tmp_path_factory.mktemp("diff-runs")
    scenario = root / "diff_reference.cps"
    scenario.write_text(SCENARIO)
    ports = f"{free_port()},{free_port()}"
    out = []
    for _ in range(2):
        done = cptest("run", scenario, "--engine", "reference", "--results", root / "results",
                      "--ports", ports, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        out.append(Path(json.loads(done.stdout)["archive"]))
    return out[0], out[1]


def altered(archive: Path, to: Path, role: str = "main", **edits: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of `archive` at `to` whose runner records of `role` are passed through `edits`
    (`request_3=fn` edits request 3's record, `score_3=fn` its teacher-forced score)."""
    shutil.copytree(archive, to)
    path = to / "evidence" / role / "runner.jsonl"
    lines = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        fn = edits.get(f"{rec.get('kind')}_{rec.get('index')}")
        if fn is not None:
            fn(rec)
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    return to


def record(archive: Path, kind: str, index: int, role: str = "main") -> dict[str, Any]:
    lines = (archive / "evidence" / role / "runner.jsonl").read_text().splitlines()
    return next(r for r in map(json.loads, lines) if r.get("kind") == kind and r.get("index") == index)


def _set(key: str, pos: int, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(rec: dict[str, Any]) -> None:
        rec[key][pos] = value(rec[key][pos]) if callable(value) else value
    return edit


# ------------------------------------------------------------------------------ two real runs
def test_two_runs_of_a_deterministic_reference_scenario_diff_clean(runs: tuple[Path, Path]) -> None:
    rep = diff(*runs)
    assert rep.same, rep.render()
    assert [e.what for e in rep.entries if e.kind == "exact"] == []
    # The tolerance is the one the plan declares, and says so.
    assert rep.tolerances.logprob == LOGPROB_BOUND
    assert rep.tolerances.logprob_from == f"generation logprob max <= {LOGPROB_BOUND:g}"
    # Timings are shown, never counted.
    assert {e.field for e in rep.measurements if e.subject == "main"} >= {"ttft p50 (s)", "e2e p50 (s)",
                                                                          "output tok/s", "ready (s)"}
    done = cptest("diff", *runs)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no difference outside the declared tolerances" in done.stdout.splitlines()[0]
    assert "measured (main, a / b; not compared): " in done.stdout


def test_a_changed_output_token_is_counted_and_shown(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = runs
    token = record(b, "request", 2)["output_ids"][3]
    c = altered(b, tmp_path / "c", request_2=_set("output_ids", 3, (token + 1) % 512))
    rep = diff(a, c)
    assert [e.what for e in rep.differences] == ["main request 2 output_ids"]
    assert rep.differences[0].why == (f"token ids are exact: first differs at output position 3 "
                                      f"({token} vs {(token + 1) % 512})")
    done = cptest("diff", a, c)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0].startswith("1 difference(s) between ")
    assert lines[1].split() == ["what", "a", "b", "why"]
    assert lines[2].startswith("  main request 2 output_ids  ") and "position 3" in lines[2]


def test_many_differing_requests_print_as_one_row_and_json_lists_each(runs: tuple[Path, Path],
                                                                     tmp_path: Path) -> None:
    a, b = runs
    edits = {f"request_{i}": _set("output_ids", 0, lambda t: (t + 1) % 512) for i in range(6)}
    c = altered(b, tmp_path / "c", **edits)
    done = cptest("diff", a, c)
    assert done.returncode == 1
    rows = [line for line in done.stdout.splitlines() if "output_ids" in line]
    assert len(rows) == 1 and rows[0].startswith("  main request 0..5 output_ids (6 items)  "), done.stdout
    js = cptest("diff", "--json", a, c)
    assert js.returncode == 1
    out = json.loads(js.stdout)
    assert (out["same"], out["differences"], out["scenario"]) == (False, 6, "diff_reference")
    counted = [e for e in out["entries"] if not e["within"]]
    assert [e["what"] for e in counted] == [f"main request {i} output_ids" for i in range(6)]
    assert all(e["kind"] == "exact" and e["a"] != e["b"] and e["why"] for e in counted)
    assert out["tolerances"]["logprob"] == LOGPROB_BOUND


def test_logprobs_within_the_declared_bound_are_not_counted_and_beyond_it_are(runs: tuple[Path, Path],
                                                                             tmp_path: Path) -> None:
    a, b = runs
    inside = altered(b, tmp_path / "in", request_1=_set("output_logprobs", 0, lambda x: x + 0.0004),
                     score_4=_set("token_logprobs", 2, lambda x: x - 0.0009))
    rep = diff(a, inside)
    assert rep.same, rep.render()
    assert {e.what for e in rep.within} >= {"main request 1 output_logprobs", "main score 4 token_logprobs"}
    outside = altered(b, tmp_path / "out", request_1=_set("output_logprobs", 0, lambda x: x + 0.01),
                      score_4=_set("token_logprobs", 2, lambda x: x - 0.002))
    rep = diff(a, outside)
    assert sorted(e.what for e in rep.differences) == ["main request 1 output_logprobs",
                                                        "main score 4 token_logprobs"]
    why = {e.what: e.why for e in rep.differences}
    assert why["main request 1 output_logprobs"].startswith("|Δ| 0.01 at position 0 > tolerance 0.001 "
                                                            "(generation logprob max <= 0.001)")


def test_one_ulp_of_float_noise_is_within_and_never_printed_as_equal_numbers(runs: tuple[Path, Path],
                                                                            tmp_path: Path) -> None:
    a, b = runs
    c = altered(b, tmp_path / "c", request_0=_set("output_logprobs", 1, lambda x: x + f32_ulp(x)))
    rep = diff(a, c, {"logprob": 0.0})  # no declared bound left: the resolution, one ulp, is still allowed
    (entry,) = [e for e in rep.within if e.what == "main request 0 output_logprobs"]
    assert entry.a != entry.b and math.isclose(abs(entry.a - entry.b), f32_ulp(entry.a), rel_tol=1e-3)
    assert rep.same
    text = rep.render()
    assert "0.0 != 0.0" not in text and "main request 0 output_logprobs: |Δ| " in text


def test_timings_are_measurements_never_differences(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = runs

    def slower(rec: dict[str, Any]) -> None:
        rec["ttft_s"] *= 10
        rec["e2e_s"] *= 10
    c = altered(b, tmp_path / "c", **{f"request_{i}": slower for i in range(6)})
    assert diff(a, c).same
    # Against its own source run, so that the two runs' timing noise cannot hide the factor of 10.
    rep = diff(b, c)
    assert rep.same, rep.render()
    ttft = next(e for e in rep.measurements if e.what == "main ttft p50 (s)")
    assert ttft.within and math.isclose(ttft.b, 10 * ttft.a, rel_tol=1e-6)


def test_a_kv_position_written_by_another_rank_is_counted(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = runs
    c = tmp_path / "c"
    shutil.copytree(b, c)
    rank = c / "evidence/main/rank1.jsonl"
    lines = rank.read_text().splitlines()
    for k, line in enumerate(lines):
        rec = json.loads(line)
        rids = [r for r in rec.get("kv_written") or {} if not r.startswith("HEALTH_CHECK")]
        if rec.get("kind") == "step" and rids:
            lo, hi = rec["kv_written"][rids[0]][0]
            rec["kv_written"][rids[0]][0] = [lo, hi + 1]  # one more position claimed by rank 1
            lines[k] = json.dumps(rec)
            break
    rank.write_text("\n".join(lines) + "\n")
    rep = diff(a, c)
    assert [e.what for e in rep.differences] == ["main rank 1 kv_written"]
    assert rep.differences[0].why.endswith("1 request(s)' positions only in a, 1 only in b")


def test_a_checker_status_is_exact(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = runs
    c = tmp_path / "c"
    shutil.copytree(b, c)
    verdict = json.loads((c / "verdict.json").read_text())
    verdict["status"] = "fail"
    next(v for v in verdict["verdicts"] if v["checker"] == "rows")["status"] = "fail"
    (c / "verdict.json").write_text(json.dumps(verdict))
    rep = diff(a, c)
    assert [(e.what, e.a, e.b) for e in rep.differences] == [("verdict scenario", "pass", "fail"),
                                                             ("verdict rows", "pass", "fail")]


def test_archives_of_different_scenarios_are_refused_with_exit_2(runs: tuple[Path, Path],
                                                                  tmp_path: Path) -> None:
    a, b = runs
    other = finished_run(tmp_path, "synthetic")
    with pytest.raises(DiffRefused, match="different scenarios: diff_reference .* and synthetic"):
        diff(a, other)
    done = cptest("diff", a, other)
    assert done.returncode == 2 and done.stdout == ""
    assert "runs of different scenarios" in done.stderr and "--other-scenario" in done.stderr
    js = cptest("diff", "--json", a, other)
    assert js.returncode == 2 and json.loads(js.stdout)["error"] == "DiffRefused"
    # Asked explicitly, it compares them (and they differ).
    assert cptest("diff", "--other-scenario", a, other).returncode == 1
    # One name, another canonical text: the scenario changed between the runs.
    changed = tmp_path / "changed"
    shutil.copytree(b, changed)
    manifest = json.loads((changed / "manifest.json").read_text())
    manifest["pins"]["scenario_sha256"] = "f" * 64
    (changed / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DiffRefused, match="the scenario changed between the runs"):
        diff(a, changed)
    assert diff(a, changed, other_scenario=True).same


def test_rerun_json_is_one_document_with_the_verdict_and_the_diff(runs: tuple[Path, Path],
                                                                  tmp_path: Path) -> None:
    done = cptest("rerun", runs[0], "--results", tmp_path / "results", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout)
    assert out["status"] == "pass" and Path(out["archive"]).is_relative_to(tmp_path / "results")
    assert out["diff"]["same"] and out["diff"]["differences"] == 0
    assert out["diff"]["a"] == str(runs[0]) and out["diff"]["b"] == out["archive"]


# ------------------------------------------------------------------------------ synthetic archives
def test_diff_of_identical_synthetic_runs_is_empty(tmp_path: Path) -> None:
    rep = diff(finished_run(tmp_path, "a"), finished_run(tmp_path, "b"))
    assert rep.same and [e for e in rep.entries if e.kind != "measurement"] == []


def test_given_tolerances_replace_the_plans_and_capacity_without_one_is_exact(tmp_path: Path) -> None:
    a = finished_run(tmp_path, "a")
    b = finished_run(tmp_path, "b", lps=(-0.15, -0.2), rows=90)
    rep = diff(a, b, {"logprob": 0.1})
    assert {e.what: e.within for e in rep.entries if e.kind != "measurement"} == {
        "main request 0 output_logprobs": True,
        "main rank 0 kv_pool rows": False,
        "main rank 0 max_total_num_tokens": False,
    }
    assert rep.tolerances.logprob_from == "given" and not rep.same
    assert "relative difference 0.1 > 0 (no capacity tolerance declared: exact)" in rep.render()


def _one_more_at_the_end(b: Path, c: Path, extra: int) -> None:
    """Copy archive b to c with rank 0's last K/V write of one request extended by `extra` positions
    past everything it wrote (what an overlap-scheduled decode step past the end leaves)."""
    shutil.copytree(b, c)
    rank = c / "evidence/main/rank0.jsonl"
    lines = rank.read_text().splitlines()
    last: dict[str, int] = {}
    for k, line in enumerate(lines):
        rec = json.loads(line)
        for rid in rec.get("kv_written") or {}:
            if not rid.startswith("HEALTH_CHECK") and rec["kv_written"][rid]:
                last[rid] = k
    rid, k = next(iter(last.items()))
    rec = json.loads(lines[k])
    lo, hi = rec["kv_written"][rid][-1]
    end = max(h for _, h in rec["kv_written"][rid])
    rec["kv_written"][rid].append([end + 1, end + 1 + extra])  # rank 0 owns even positions: skip one
    lines[k] = json.dumps(rec)
    rank.write_text("\n".join(lines) + "\n")


def test_one_trailing_position_is_the_overlap_schedulers_step_not_a_difference(
        runs: tuple[Path, Path], tmp_path: Path) -> None:
    """A real SGLang rerun (results/_measure/run16) wrote one position more or less at the end of
    15 of 65 requests: the overlap scheduler's step past a finished request, as timing has it."""
    a, b = runs
    _one_more_at_the_end(b, tmp_path / "c", extra=1)
    rep = diff(a, tmp_path / "c")
    assert rep.same, rep.render()
    (entry,) = [e for e in rep.entries if e.field == "kv_written"]
    assert entry.within and entry.why.startswith("1 request(s) differ by one trailing position only")


def test_more_than_one_trailing_position_is_a_difference(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = runs
    _one_more_at_the_end(b, tmp_path / "c", extra=3)
    rep = diff(a, tmp_path / "c")
    assert [e.what for e in rep.differences] == ["main rank 0 kv_written"]


# ------------------------------------------------------------------------------ placements
def _timed(ttft: float) -> Callable[[dict[str, Any]], None]:
    def edit(rec: dict[str, Any]) -> None:
        rec.update(ttft_s=ttft, tpot_s=ttft / 10, e2e_s=ttft * 2, sent_at=0.0)
    return edit


def _colocated(archive: Path) -> Path:
    """`archive` with its main server's ranks co-located in plan.json (the diff reads the placement
    from the plan)."""
    path = archive / "plan.json"
    plan = Plan.model_validate_json(path.read_text())
    path.write_text(plan.model_copy(update={"main": colocate(plan.main)}).model_dump_json(indent=2))
    return archive


def test_speed_and_memory_across_placements_are_not_comparable_and_both_placements_are_named(
        tmp_path: Path) -> None:
    base = finished_run(tmp_path, "base")
    a = altered(base, tmp_path / "a", request_0=_timed(0.1))
    b = _colocated(altered(base, tmp_path / "b", request_0=_timed(3.0)))
    rep = diff(a, b)
    assert rep.same and (rep.placement_a, rep.placement_b) == ("physical", "colocated")
    assert [e.field for e in rep.not_comparable] == ["ready (s)", "ttft p50 (s)", "tpot p50 (s)",
                                                     "e2e p50 (s)", "output tok/s"]
    assert all(e.within and e.why.startswith("not comparable (co-located)") for e in rep.not_comparable)
    assert not any(e.field in PLACEMENT_BOUND for e in rep.measurements)
    text = rep.render().splitlines()
    assert text[0] == (f"{a} and {b} agree (synthetic; a physical, b co-located): no difference outside the "
                       "declared tolerances")
    assert text[1].startswith("not comparable (co-located; main, a / b; a physical, b co-located): "
                              "ready (s) 1 / 1, ttft p50 (s) 0.1 / 3,")
    out = rep.as_json()
    assert (out["placement_a"], out["placement_b"]) == ("physical", "colocated")
    assert {e["kind"] for e in out["entries"]} == {"not comparable"}


def test_two_colocated_archives_keep_their_timings_as_measurements(tmp_path: Path) -> None:
    base = finished_run(tmp_path, "base")
    a = _colocated(altered(base, tmp_path / "a", request_0=_timed(0.1)))
    b = _colocated(altered(base, tmp_path / "b", request_0=_timed(0.2)))
    rep = diff(a, b)
    assert rep.not_comparable == [] and "ttft p50 (s)" in [e.field for e in rep.measurements]
    assert rep.render().splitlines()[0].endswith("agree (synthetic; both co-located): no difference outside "
                                                 "the declared tolerances")
