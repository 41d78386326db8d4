"""A declared violation is about one engine and release: `violated X [on ENGINE ["RELEASE"]] because ...`.

Unscoped, it means the engine and release the scenario names; on any other engine or release the
contract is expected to hold (issue 11: the README's command on a CPU machine ran SGLang 0.5.17's
defect against the reference engine, which does not have it, and reported FAIL).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cptest.engines.reference import choose
from cptest.errors import ScenarioError
from cptest.lang import parse_file
from cptest.lang.fmt import format_text
from cptest.plan import plan

REPO = Path(__file__).resolve().parents[2]
TEXT = """cptest 1
scenario scoped {{
  extends "{defaults}"
  model synthetic llama {{
    layers 2
    hidden 256
    heads 8
    kv_heads 8
    head_dim 32
    vocab 512
    intermediate 512
    seed 1
  }}
  topology {{
    gpus 2
    tp 2
    dcp 2
  }}
  baseline {{
    tp 2
  }}
  expect {{
    violated generation tokens_agree >= 0.5 vs baseline{scope} because "DCP ranks hold different heads"
  }}
}}
"""


def write(tmp_path: Path, scope: str) -> Path:
    f = tmp_path / "scoped.cps"
    f.write_text(TEXT.format(defaults=REPO / "scenarios/defaults/tiny.cps", scope=scope))
    return f


def generation_of(f: Path, *, engine: str | None, tmp_path: Path) -> dict[str, object]:
    choice = choose(parse_file(f), engine, gpu_present=engine != "reference")
    planned = plan(choice.scenario)
    (gen,) = [e for e in planned.expectations if e.kind == "generation"]
    return {"expect_violation": gen.expect_violation, "violated_on": gen.violated_on}


@pytest.mark.parametrize(("scope", "on_sglang", "on_reference"), [
    ("", True, False),                          # unscoped: the scenario's own engine and release
    (' on sglang "0.5.17"', True, False),       # the release it runs
    (" on sglang", True, False),                # any release of sglang
    (' on sglang "0.5.16"', False, False),      # another release: expected to hold on 0.5.17
    (" on reference", False, True),             # only on the reference engine
])
def test_a_violation_is_expected_only_where_it_is_declared(tmp_path: Path, scope: str, on_sglang: bool,
                                                           on_reference: bool) -> None:
    f = write(tmp_path, scope)
    assert generation_of(f, engine=None, tmp_path=tmp_path)["expect_violation"] is on_sglang
    ref = generation_of(f, engine="reference", tmp_path=tmp_path)
    assert ref["expect_violation"] is on_reference
    assert ref["violated_on"] == {"": "sglang 0.5.17", ' on sglang "0.5.17"': "sglang 0.5.17",
                                  " on sglang": "sglang", ' on sglang "0.5.16"': "sglang 0.5.16",
                                  " on reference": "reference"}[scope]


def test_the_scope_is_kept_by_the_formatter(tmp_path: Path) -> None:
    f = write(tmp_path, ' on sglang "0.5.17"')
    out = format_text(f.read_text(), str(f))
    assert 'vs baseline on sglang "0.5.17" because "DCP ranks hold different heads"' in out
    assert format_text(out, str(f)) == out


def test_an_unknown_engine_is_named_at_its_position(tmp_path: Path) -> None:
    f = write(tmp_path, " on sglangg")
    with pytest.raises(ScenarioError) as e:
        parse_file(f)
    text = e.value.render()
    assert f"{f}:23:" in text and "unknown engine 'sglangg'" in text and "did you mean 'sglang'" in text
