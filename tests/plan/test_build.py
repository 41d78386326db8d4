"""Specification of `cptest.plan.plan`: Scenario -> Plan, pure and deterministic.

Every scenario in scenarios/ has its plan pinned under tests/golden/plan/<stem>.json, so a change in
argv, environment, workload or expectations shows up as a reviewable diff. Regenerate with
`CPTEST_UPDATE_GOLDEN=1 python -m pytest tests/plan/test_build.py`.

Two normalisations keep the golden files portable and small: the repository's absolute path is
written `$REPO/`, and each request's token ids are replaced by their length and sha256 (the same hash
the workload driver re-computes; it pins the ids exactly without hundreds of KB per file).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cptest.errors import PlanError
from cptest.lang import parse_file, parse_text
from cptest.plan import plan
from cptest.plan.model import Plan
from cptest.plan.workload import prompt_sha256

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.cps"))
GOLDEN = ROOT / "tests" / "golden" / "plan"
CACHE = Path("/cache")

BASE = """cptest 1
scenario t {
  engine sglang "0.5.17"
  model synthetic llama { layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 vocab 128 intermediate 128 }
  topology { gpus 2 tp 2 dcp 2 }
  workload { requests 4 concurrency 2 prompt_tokens 16 output_tokens 4 }
  fault kill rank 1 after 2 requests
  expect { launch accepted rows kv_owner position % 2 }
}
"""
"""A small DCP2 scenario whose lines the tests below refer to (line 3: engine, line 7: fault)."""

SHELL_KEYS = {"shell", "command", "cmd", "command_line", "cmdline", "script"}


def _plan_of(text: str) -> Plan:
    return plan(parse_text(text, "t.cps"))


def _portable(p: Plan) -> dict[str, Any]:
    data = json.loads(p.model_dump_json())
    for planned, r in zip(p.workload.requests, data["workload"]["requests"], strict=True):
        # However the plan stores the ids (a list, or base64 in `prompt`), pin their values.
        r.pop("prompt", None)
        r["input_ids"] = {"len": len(planned.input_ids), "sha256": prompt_sha256(planned.input_ids)}
    return json.loads(json.dumps(data).replace(str(ROOT) + "/", "$REPO/"))


def _walk(value: Any, path: str = ""):
    """Every (path, key-or-None, leaf) of a JSON value."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield f"{path}.{k}", k, v
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield f"{path}[{i}]", None, v
            yield from _walk(v, f"{path}[{i}]")


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    return {p.stem: plan(parse_file(p)) for p in SCENARIOS}


def test_the_suite_has_scenarios_to_plan():
    assert len(SCENARIOS) >= 10


# ------------------------------------------------------------------------------ golden plans
@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_plan_of_each_scenario_matches_its_golden_file(path: Path, plans: dict[str, Plan]):
    value = _portable(plans[path.stem])
    golden = GOLDEN / f"{path.stem}.json"
    if os.environ.get("CPTEST_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(json.dumps(value, sort_keys=True, indent=1) + "\n")
    assert golden.exists(), f"missing {golden}; set CPTEST_UPDATE_GOLDEN=1 to create it"
    assert json.loads(golden.read_text()) == value, f"the plan of {path.name} changed; see {golden}"


def test_golden_files_do_not_depend_on_where_the_repo_is_cloned():
    for golden in GOLDEN.glob("*.json"):
        assert str(ROOT) not in golden.read_text(), golden.name


def test_every_golden_file_has_a_scenario():
    # A golden plan left behind by a renamed scenario would pin nothing.
    assert {g.stem for g in GOLDEN.glob("*.json")} == {p.stem for p in SCENARIOS}


# ------------------------------------------------------------------------------ properties
@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_argv_is_a_list_of_single_line_strings_and_no_shell_string_exists(path: Path, plans: dict[str, Plan]):
    p = plans[path.stem]
    for server in filter(None, (p.main, p.baseline)):
        for node in server.nodes:
            assert isinstance(node.argv, list) and node.argv
            assert all(isinstance(a, str) for a in node.argv)
            assert not any("\n" in a or "\r" in a for a in node.argv)
            assert all(isinstance(v, str) and "\n" not in v for v in node.env.values())
    keys = {key for _, key, _ in _walk(json.loads(p.model_dump_json())) if key is not None}
    assert not keys & SHELL_KEYS


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_engine_process_gets_nvls_disabled(path: Path, plans: dict[str, Plan]):
    p = plans[path.stem]
    for server in filter(None, (p.main, p.baseline)):
        for node in server.nodes:
            assert node.env["NCCL_NVLS_ENABLE"] == "0"


def test_dcp_scenario_argv_carries_dcp_size():
    argv = _plan_of(BASE).main.nodes[0].argv
    assert argv[argv.index("--dcp-size") + 1] == "2"


def test_tp_only_scenario_argv_has_no_dcp_size():
    text = BASE.replace("tp 2 dcp 2", "tp 2").replace("rows kv_owner position % 2", "rows replicated")
    assert "--dcp-size" not in _plan_of(text).main.nodes[0].argv


def test_rows_expectation_leaves_the_graph_mode_as_served():
    # Replayed steps are recorded since D58: row evidence no longer forces an eager run, so the
    # serve block's graph modes reach the argv unchanged, and nothing is overridden.
    p = _plan_of(BASE)
    argv = p.main.nodes[0].argv
    assert not p.main.eager and p.contracts.eager is None
    assert "--cuda-graph-backend-prefill" not in argv


def test_rows_and_decode_graphs_captured_may_be_expected_together():
    # Refused before D58 ("the rows expectation needs eager decode"): replays are recorded now.
    text = BASE.replace("rows kv_owner position % 2", "rows replicated graph decode captured").replace(
        "tp 2 dcp 2", "tp 2")
    p = _plan_of(text)
    assert [e.kind for e in p.expectations].count("rows") == 1 and not p.main.eager


def test_a_served_decode_graph_mode_reaches_the_argv_beside_rows():
    scenario = parse_text(BASE, "t.cps")
    serve = scenario.serve.model_copy(update={"cuda_graph_decode": "full"})
    p = plan(scenario.model_copy(update={"serve": serve}))
    argv = p.main.nodes[0].argv
    assert argv[argv.index("--cuda-graph-backend-decode") + 1] == "full"
    assert argv.count("--cuda-graph-backend-decode") == 1


def test_a_rank_fault_carries_the_process_title_of_its_rank():
    (fault,) = _plan_of(BASE).faults
    assert (fault.rank, fault.process_title, fault.after_requests) == (1, "sglang::scheduler_TP1", 2)


def test_fault_on_a_rank_outside_the_world_is_a_plan_error_at_the_fault():
    # The parser already rejects this text; the plan must still refuse a Scenario built another way.
    scenario = parse_text(BASE, "t.cps")
    fault = scenario.faults[0].model_copy(update={"rank": 2})
    with pytest.raises(PlanError) as err:
        plan(scenario.model_copy(update={"faults": [fault]}))
    (problem,) = err.value.problems
    assert problem.span is not None and (problem.span.file, problem.span.line) == ("t.cps", 7)
    assert "rank 2 does not exist (world size 2)" in problem.message
    assert "t.cps:7:" in err.value.render()


def test_unknown_release_lists_known_releases_and_the_closest():
    with pytest.raises(PlanError) as err:
        _plan_of(BASE.replace('"0.5.17"', '"0.5.71"'))
    (problem,) = err.value.problems
    assert problem.span is not None and problem.span.line == 3
    assert "0.5.71" in problem.message and "known: 0.5.17" in problem.message
    assert "did you mean 0.5.17" in problem.message


def test_pass_through_flag_the_release_lacks_is_a_plan_error_with_did_you_mean():
    text = BASE.replace("  fault kill", '  serve { flag "--dcp-sise" "2" }\n  fault kill')
    with pytest.raises(PlanError) as err:
        _plan_of(text)
    (problem,) = err.value.problems
    assert problem.span is not None and problem.span.line == 7
    assert "--dcp-sise" in problem.message and "did you mean --dcp-size" in problem.message


def test_plan_errors_are_all_reported_together():
    text = BASE.replace('"0.5.17"', '"0.5.71"')
    scenario = parse_text(text, "t.cps")
    fault = scenario.faults[0].model_copy(update={"rank": 5})
    with pytest.raises(PlanError) as err:
        plan(scenario.model_copy(update={"faults": [fault]}))
    # The release problem stops the server from being built, so the rank check cannot run; the
    # release problem must still be there (and nothing crashes).
    assert [p.span.line for p in err.value.problems if p.span] == [3]


def test_the_plan_names_the_model_store_by_token_and_the_run_materialises_it():
    p = plan(parse_text(BASE, "t.cps"))
    mount = p.main.nodes[0].model_mount
    assert mount is not None and mount.startswith("<models>/llama-")
    assert mount in p.main.nodes[0].argv
    a = p.materialized({"<models>": "/a", "<scenario>": "/s"}).main.nodes[0]
    b = p.materialized({"<models>": "/b", "<scenario>": "/s"}).main.nodes[0]
    assert a.model_mount == "/a/" + mount.removeprefix("<models>/") and a.model_mount in a.argv
    assert b.model_mount == "/b/" + mount.removeprefix("<models>/")
    assert "<models>" not in " ".join(a.argv)


def test_a_local_model_is_named_relative_to_the_scenario_and_sources_are_relative(tmp_path: Path):
    model_line = BASE[BASE.index("  model "):BASE.index("\n", BASE.index("  model "))]
    local = ('  model local "ckpt"\n  facts { architecture "LlamaForCausalLM" layers 2 hidden 64 heads 4 '
             'kv_heads 1 head_dim 16 vocab 128 }')
    text = BASE.replace(model_line, local)
    f = tmp_path / "s.cps"
    f.write_text(text)
    p = plan(parse_file(f))
    assert p.main.nodes[0].model_mount == "<scenario>/ckpt" and p.pins.model.path == "<scenario>/ckpt"
    assert all(not e.source.startswith("/") and e.source.startswith("s.cps:") for e in p.expectations)
    assert str(tmp_path) not in p.model_dump_json()


def test_each_node_of_a_multi_node_server_gets_its_rank_and_the_same_rendezvous():
    text = BASE.replace("gpus 2 tp 2 dcp 2", "gpus 4 tp 4 dcp 2 nodes 2").replace("rank 1", "rank 3")
    p = _plan_of(text)
    assert [n.node_rank for n in p.main.nodes] == [0, 1]
    for n in p.main.nodes:
        argv = n.argv
        assert n.gpu_ids == [0, 1]
        assert argv.count("--nnodes") == 1 and argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--node-rank") + 1] == str(n.node_rank)
    addrs = {n.argv[n.argv.index("--dist-init-addr") + 1] for n in p.main.nodes}
    assert len(addrs) == 1
    assert p.faults[0].process_title == "sglang::scheduler_TP3"


def test_baseline_is_a_separate_tp_only_server_on_its_own_port():
    p = _plan_of(BASE.replace("  fault kill", "  baseline { tp 1 }\n  fault kill"))
    assert p.baseline is not None and p.baseline.role == "baseline"
    argv = p.baseline.nodes[0].argv
    assert argv[argv.index("--tp-size") + 1] == "1" and "--dcp-size" not in argv
    assert p.baseline.base_url != p.main.base_url and p.baseline.world_size == 1


def test_shutdown_accepts_the_release_exit_statuses_of_the_fault_it_follows():
    # SGLang 0.5.17 SIGKILLs its own tree when a rank dies (-9/137); after SIGTERM 0 is possible too.
    with_kill = _plan_of(BASE.replace("position % 2", "position % 2 shutdown within 30s"))
    without = _plan_of(BASE.replace("position % 2", "position % 2 shutdown within 30s").replace(
        "  fault kill rank 1 after 2 requests\n", ""))  # fmt: skip
    assert with_kill.expectations[-1].exit_statuses == [-9, 137]
    assert without.expectations[-1].exit_statuses == [-9, 0, 137]


def test_expectations_carry_their_scenario_position():
    p = _plan_of(BASE)
    assert [(e.kind, e.source) for e in p.expectations] == [
        ("launch", "t.cps:8:12"),
        ("rows", "t.cps:8:28"),
    ]


def test_synthetic_model_pins_everything_needed_to_write_the_weights_again():
    synthetic = _plan_of(BASE).pins.model.synthetic
    declared = {"architecture": "llama", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 1, "head_dim": 16,
                "vocab": 128, "intermediate": 128, "seed": 0}  # fmt: skip
    assert synthetic is not None and set(synthetic.model_dump()) >= set(declared)
    assert {k: getattr(synthetic, k) for k in declared} == declared


def test_scenario_hash_does_not_change_when_the_file_is_reformatted():
    messy = BASE.replace("  topology { gpus 2 tp 2 dcp 2 }", "  topology {gpus 2   tp 2 dcp 2}  # same")
    assert _plan_of(messy).pins.scenario_sha256 == _plan_of(BASE).pins.scenario_sha256
    changed = _plan_of(BASE.replace("requests 4", "requests 5"))
    assert changed.pins.scenario_sha256 != _plan_of(BASE).pins.scenario_sha256


# ------------------------------------------------------------------------------ determinism
def test_plan_is_deterministic_within_a_process(plans: dict[str, Plan]):
    for path in SCENARIOS:
        assert plan(parse_file(path)) == plans[path.stem]


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_plan_round_trips_through_json(path: Path, plans: dict[str, Plan]):
    p = plans[path.stem]
    assert Plan.model_validate_json(p.model_dump_json()) == p


HASH_SCRIPT = """
import hashlib, json, sys
from pathlib import Path
from cptest.lang import parse_file
from cptest.plan import plan
out = {}
for f in sys.argv[1:]:
    text = plan(parse_file(f)).model_dump_json()
    out[Path(f).stem] = hashlib.sha256(text.encode()).hexdigest()
print(json.dumps(out))
"""


def _hashes_with_seed(seed: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    done = subprocess.run([sys.executable, "-c", HASH_SCRIPT, *map(str, SCENARIOS)], env=env,
                          capture_output=True, text=True, check=True, cwd=ROOT)  # fmt: skip
    return json.loads(done.stdout)


def test_plan_is_the_same_under_any_hash_seed(plans: dict[str, Plan]):
    here = {k: hashlib.sha256(p.model_dump_json().encode()).hexdigest() for k, p in plans.items()}
    assert _hashes_with_seed("0") == here
    assert _hashes_with_seed("4242") == here
