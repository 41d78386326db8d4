"""Specifications of `graph parity vs eager` (D60): main (decode graphs) against its eager twin, on the
teacher-forced scores and on the decode prefix of the free-running outputs, within the control's floor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cptest.checks import check_loaded, load_archive
from cptest.contracts.generation import GenBound
from cptest.contracts.graph_parity import REFERENCE_NOTE, GraphParityParams
from cptest.contracts.parity import decode_prefix
from cptest.evidence import Graph, RequestResult, Score
from cptest.testing.archives import make_plan, rank_id, server_plan, write_archive
from cptest.verdict import Verdict

P99_REL = GenBound(metric="logprob", stat="p99", limit=4.0, relative=True)
PARAMS = GraphParityParams(bounds=[P99_REL], free_running_topk=5)


def score(run: str, index: int, lps: list[float]) -> Score:
    return Score(run=run, index=index, sequence_sha256=f"s{index}", start=4, status="ok",  # type: ignore[arg-type]
                 token_logprobs=lps, top=[[(7, -0.1), (8, -0.2)]] * len(lps))


def req(run: str, index: int, ids: list[int], lps: list[float]) -> RequestResult:
    return RequestResult(run=run, index=index, prompt_len=4, max_new_tokens=len(ids),  # type: ignore[arg-type]
                         prompt_sha256="x", status="ok", output_ids=ids, output_logprobs=lps,
                         output_top=[[(t, -0.1) for t in (ids[j], 1, 2, 3, 4)] for j in range(len(ids))])


def server(run: str, delta: float, ids: list[int] | None = None) -> list[Any]:
    """Runner records of one server: two scored sequences and two answers, `delta` away from 0."""
    ids = ids or [5, 6, 7, 8]
    return [score(run, i, [-1.0 - delta, -2.0, -3.0 + delta]) for i in range(2)] + \
           [req(run, i, ids, [-0.5, -1.0 - delta, -1.5, -2.0 + delta]) for i in range(2)]


CAPTURED = {0: [Graph(rank=rank_id(0), event="capture", phase="decode", batch_sizes=[1, 2]),
                Graph(rank=rank_id(0), event="replay", phase="decode", count=12)]}
EAGER = {0: [Graph(rank=rank_id(0), event="disabled", phase="decode")]}


def judge(tmp_path: Path, params: GraphParityParams, runner: dict[str, list[Any]], *, engine: str = "sglang",
          ranks: dict[str, dict[int, list[Any]]] | None = None, twin: bool = True) -> Verdict:
    plan = make_plan(server_plan(engine=engine), [params], baseline=server_plan("baseline", engine=engine))
    update: dict[str, Any] = {"control": server_plan("control", engine=engine)} if "control" in runner else {}
    if twin:
        update["eager"] = server_plan("eager", engine=engine)
    plan = plan.model_copy(update=update)
    default = {"main": CAPTURED, "eager": EAGER} if engine == "sglang" else {}
    write_archive(tmp_path, plan, runner=runner, ranks=default if ranks is None else ranks)
    return next(v for v in check_loaded(load_archive(tmp_path), finished=True).verdicts
                if v.checker == "graph_parity")


def runners(main: float, eager: float = 0.0, control: float | None = 0.01) -> dict[str, list[Any]]:
    out = {"main": server("main", main), "eager": server("eager", eager), "baseline": server("baseline", 0.0)}
    if control is not None:
        out["control"] = server("control", control)
    return out


def test_graphs_within_four_times_the_control_floor_pass_with_floor_figures_and_ratio(tmp_path: Path) -> None:
    v = judge(tmp_path, PARAMS, runners(main=0.02))
    assert v.status == "pass", v.reason
    rows = {r["measure"]: r for r in v.figures["bounds"]}
    assert set(rows) == {"teacher_forced", "decode"}
    assert rows["teacher_forced"]["floor"] == 0.01 and rows["teacher_forced"]["ratio"] == 2.0
    assert rows["decode"]["measured"] == 0.02 and rows["decode"]["limit"] == 0.04
    assert v.figures["free_running"]["pairs"] == 2


def test_graphs_beyond_the_floor_fail_and_name_the_measure(tmp_path: Path) -> None:
    v = judge(tmp_path, PARAMS, runners(main=0.5))
    assert v.status == "fail"
    assert "teacher_forced: logprob p99 0.5 > 0.04" in v.reason and "decode: logprob p99" in v.reason


def test_only_the_decode_measure_can_fail_the_contract(tmp_path: Path) -> None:
    # Same teacher-forced scores (prefill), different decode logprobs: a decode-graph fault scoring
    # cannot see.
    r = runners(main=0.0)
    r["main"] = [s for s in r["main"] if isinstance(s, Score)] + \
                [req("main", i, [5, 6, 7, 8], [-0.5, -1.9, -1.5, -2.0]) for i in range(2)]
    v = judge(tmp_path, PARAMS, r)
    assert v.status == "fail" and v.reason.startswith("decode: logprob p99 0.9 > 0.04"), v.reason


def test_a_relative_bound_without_control_evidence_is_unknown(tmp_path: Path) -> None:
    v = judge(tmp_path, PARAMS, runners(main=0.0, control=None))
    assert v.status == "unknown" and "no control evidence to measure the floor with" in v.reason


def test_an_absolute_bound_needs_no_control(tmp_path: Path) -> None:
    params = GraphParityParams(bounds=[GenBound(metric="logprob", stat="max", limit=0.1)])
    assert judge(tmp_path, params, runners(main=0.05, control=None)).status == "pass"


def test_a_free_running_divergence_outside_the_top_k_fails(tmp_path: Path) -> None:
    r = runners(main=0.0)
    r["main"] = [s for s in r["main"] if isinstance(s, Score)] + \
                [req("main", i, [5, 99, 7, 8], [-0.5, -1.0, -1.5, -2.0]) for i in range(2)]
    v = judge(tmp_path, GraphParityParams(free_running_topk=5), r)
    assert v.status == "fail" and "outside the other side's top 5" in v.reason


def test_a_main_server_that_captured_no_decode_graph_is_unknown_not_a_graph_result(tmp_path: Path) -> None:
    v = judge(tmp_path, PARAMS, runners(main=0.0), ranks={"main": EAGER, "eager": EAGER})
    assert v.status == "unknown" and "main recorded no decode CUDA-graph capture" in v.reason


def test_a_twin_that_captured_graphs_is_unknown(tmp_path: Path) -> None:
    v = judge(tmp_path, PARAMS, runners(main=0.0), ranks={"main": CAPTURED, "eager": CAPTURED})
    assert v.status == "unknown" and "the eager twin recorded 1 CUDA-graph capture" in v.reason


def test_the_reference_engine_passes_and_says_it_has_no_graphs(tmp_path: Path) -> None:
    v = judge(tmp_path, PARAMS, runners(main=0.0), engine="reference")
    assert v.status == "pass" and v.reason.endswith(REFERENCE_NOTE)
    assert v.figures["graphs"] == "none: reference engine"


def test_a_plan_without_the_twin_is_unknown(tmp_path: Path) -> None:
    v = judge(tmp_path, PARAMS, runners(main=0.0), twin=False)
    assert v.status == "unknown" and "no eager twin" in v.reason


def test_decode_prefix_compares_only_decode_positions_of_the_common_prefix() -> None:
    a = [req("main", 0, [5, 6, 7, 8], [-0.5, -1.0, -1.25, -2.0])]
    b = [req("eager", 0, [5, 6, 9, 8], [-0.7, -1.5, -9.0, -2.0])]
    fig = decode_prefix(a, b)
    # position 0 is the prefill's token; position 2 is the divergence; position 3 follows another history
    assert fig.deltas == [0.5] and fig.per_request[0]["prefix"] == 2


def test_an_archive_without_the_twin_s_evidence_is_an_unfinished_run(tmp_path: Path) -> None:
    from cptest.evidence import Lifecycle

    done = {role: [Lifecycle(run=role, event="shutdown_done", detail={})]  # type: ignore[arg-type]
            for role in ("main", "baseline", "control")}
    r = {role: recs + done[role] for role, recs in runners(main=0.0).items() if role != "eager"}
    plan = make_plan(server_plan(), [PARAMS], baseline=server_plan("baseline"))
    plan = plan.model_copy(update={"control": server_plan("control"), "eager": server_plan("eager"),
                                   "workload": plan.workload.model_copy(update={"score_topk": 1})})
    write_archive(tmp_path, plan, runner=r, ranks={"main": CAPTURED})
    v = check_loaded(load_archive(tmp_path), finished=True)
    assert v.status == "unknown"
    assert "no runner evidence for the eager server" in " ".join(x.reason for x in v.verdicts)
