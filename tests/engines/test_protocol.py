"""Specifications of cptest/engines: both engines behind one protocol, and the facts they state."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cptest.engines import ServerLaunch, engine_for
from cptest.engines.reference import ReferenceEngine
from cptest.engines.sglang.engine import SGLangEngine
from cptest.errors import PlanError
from cptest.reference.server import capacity_line
from cptest.scenario import Serve
from cptest.topology import Degrees

ROOT = Path(__file__).resolve().parents[2]
DCP2_LOGS = sorted(next((ROOT / "results" / "dcp2_llama_kv1").glob("*/logs")).glob("main-node*.log"))
"""Real SGLang 0.5.17 logs (TP2 + DCP2, one per co-located node: TP rank k logs on node k), committed
evidence."""


def launch(**degrees: int) -> ServerLaunch:
    return ServerLaunch(model_path="/m", degrees=Degrees(**{"tp": 1, **degrees}), serve=Serve(), port=31000)


def test_the_engine_a_scenario_names_is_the_one_the_plan_gets():
    assert isinstance(engine_for("reference", "builtin"), ReferenceEngine)
    sglang = engine_for("sglang", "0.5.17")
    assert isinstance(sglang, SGLangEngine) and sglang.release == "0.5.17"
    with pytest.raises(PlanError, match=r"unknown SGLang release \"0.5.71\".*did you mean 0.5.17\?"):
        engine_for("sglang", "0.5.71")


def test_sglang_capacity_log_patterns_read_the_lines_of_a_real_0_5_17_log():
    patterns = engine_for("sglang", "0.5.17").facts().log_patterns
    texts = [log.read_text() for log in DCP2_LOGS]
    kv = [m.groupdict() for text in texts for m in re.finditer(patterns["kv_allocated"], text, re.MULTILINE)]
    assert [(m["tp"], m["tokens"]) for m in kv] == [("0", "65536"), ("1", "65536")]
    [total] = (m for text in texts for m in re.finditer(patterns["max_total_num_tokens"], text, re.MULTILINE))
    assert total["tokens"] == "65536" and total["tp"] == "0"


def test_each_release_states_its_own_exit_statuses_and_kv_heads_rule():
    r17, r23 = engine_for("sglang", "0.5.17").facts(), engine_for("sglang", "0.5.23").facts()
    assert r17.sigterm_exit_statuses == frozenset({0, -9, 137}) and r17.rank_kill_exit_statuses == {-9, 137}
    assert (r17.kv_heads_rule, r23.kv_heads_rule) == ("attn_tp", "attn_tp_over_dcp")


def test_each_engine_names_its_server_info_paths_current_spelling_first():
    # The runner asks them in order; the release table holds SGLang's, the deprecated alias last.
    assert engine_for("sglang", "0.5.17").server_info_paths == ("/server_info", "/get_server_info")
    assert engine_for("sglang", "0.5.23").server_info_paths[0] == "/server_info"
    assert engine_for("reference", "builtin").server_info_paths[0] == "/server_info"


def test_the_reference_engine_states_its_own_log_line_and_no_exit_statuses():
    facts = engine_for("reference", "builtin").facts()
    line = f"[12:00:00 cptest-ref] {capacity_line(4096, 1, 2)}"  # as the server prints it
    assert re.search(facts.log_patterns["max_total_num_tokens"], line)["tokens"] == "8192"  # type: ignore[index]
    assert "kv_allocated" not in facts.log_patterns
    assert facts.sigterm_exit_statuses is None and facts.rank_kill_exit_statuses is None


def test_what_an_engine_cannot_express_is_said_and_what_it_rejects_is_not():
    ref = engine_for("reference", "builtin")
    assert "runs pp 1" in ref.unexpressible(Degrees(tp=2, pp=2))[0]
    # attention DP runs, and DCP inside each DP rank; a DCP group spanning DP ranks is no contract of it
    assert ref.unexpressible(Degrees(tp=4, attn_dp=2, attn_cp=2, prefill_cp=True, cp_strategy="zigzag")) == []
    assert ref.unexpressible(Degrees(tp=4, attn_dp=2, dcp=2)) == []
    assert "only inside each attention-DP rank" in ref.unexpressible(Degrees(tp=4, attn_dp=4, dcp=2))[0]
    # PCP with DCP is something the reference engine *refuses* at launch: its behaviour, not a plan error.
    assert ref.unexpressible(Degrees(tp=2, dcp=2, attn_cp=2, prefill_cp=True, cp_strategy="zigzag")) == []
    assert engine_for("sglang", "0.5.17").unexpressible(Degrees(tp=4, pp=2, nodes=2)) == []


def test_every_node_of_a_multi_node_sglang_server_gets_its_rank_and_the_rendezvous():
    engine = engine_for("sglang", "0.5.17")
    argvs = [engine.argv(launch(tp=16, nodes=2), n, 2) for n in (0, 1)]
    for n, argv in enumerate(argvs):
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == str(n)
        assert argv[argv.index("--dist-init-addr") + 1] == "127.0.0.1:31050"


def test_both_engines_take_the_same_launch_settings():
    for kind, release in (("sglang", "0.5.17"), ("reference", "builtin")):
        argv = engine_for(kind, release).argv(launch(tp=2, dcp=2), 0, 1)
        assert argv[argv.index("--tp-size") + 1] == "2" and argv[argv.index("--dcp-size") + 1] == "2"
        assert argv[argv.index("--port") + 1] == "31000"
