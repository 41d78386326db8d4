"""The TP1 baselines of every family (scenarios/baselines/): each is the one-GPU reference of its
family's CP scenario, so it must serve exactly that scenario's checkpoint, and the device run list
(tools/device/baselines.txt) must name each baseline once."""

from __future__ import annotations

from pathlib import Path

import pytest

from cptest.lang import parse_file
from cptest.plan.build import plan

ROOT = Path(__file__).resolve().parents[1]
BASELINES = sorted((ROOT / "scenarios" / "baselines").glob("*.cps"))
RUN_LIST = ROOT / "tools" / "device" / "baselines.txt"
CP_TWIN = {
    "llama": "dcp2_llama_kv1_graph",
    "qwen3": "dcp2_qwen3_kv1_graph",
    "qwen3_moe": "dcp2_qwen3_moe_kv1_graph",
    "mla": "dcp2_mla_flashmla_graph",
}
EAGER_ONLY = {"torch_native", "flex_attention"}


def family_and_backend(path: Path) -> tuple[str, str]:
    stem = path.stem.removeprefix("tp1_")
    family = max((f for f in CP_TWIN if stem.startswith(f + "_")), key=len)
    return family, stem[len(family) + 1:]


def test_the_run_list_names_every_baseline_once_each_family_first_on_its_main_backend() -> None:
    listed = [line.strip() for line in RUN_LIST.read_text().splitlines() if line.strip()]
    assert sorted(listed) == [p.relative_to(ROOT).as_posix() for p in BASELINES]
    firsts = [family_and_backend(Path(p)) for p in listed[:4]]
    assert firsts == [("llama", "triton"), ("qwen3", "triton"), ("qwen3_moe", "triton"), ("mla", "flashmla")]


@pytest.mark.parametrize("path", BASELINES, ids=lambda p: p.stem)
def test_a_baseline_serves_its_cp_twins_checkpoint_at_tp1_on_its_named_backend(path: Path) -> None:
    family, backend = family_and_backend(path)
    scenario = parse_file(path)
    twin = parse_file(ROOT / "scenarios" / "qualification" / f"{CP_TWIN[family]}.cps")
    assert scenario.model.synthetic_geometry().store_name() == twin.model.synthetic_geometry().store_name()
    assert scenario.serve.attention_backend == backend
    planned = plan(scenario)
    assert planned.main.topology.tp == 1 and planned.main.world_size == 1
    kinds = {e.kind for e in planned.expectations}
    # SGLang turns graphs off for the eager-only backends, so they claim no graph parity.
    assert ("graph_parity" in kinds) == (backend not in EAGER_ONLY)
