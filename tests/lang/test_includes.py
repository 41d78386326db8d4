"""`extends` reads only `.cps` files of the scenario tree, and an error never quotes a file from
outside it (issue 32: `extends "/proc/self/environ"` printed the process environment)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cptest.errors import ScenarioError
from cptest.lang import parse_file

ROOT = Path(__file__).resolve().parents[2]
SECRET = "cptest-secret-7f3a9c"


def scenario(extends: str) -> str:
    return f"""cptest 1
scenario s {{
  extends "{extends}"
  engine sglang "0.5.17"
  model synthetic llama {{ layers 1 hidden 64 heads 8 kv_heads 1 head_dim 16 vocab 256 intermediate 128 }}
  topology {{ gpus 1 tp 1 }}
  workload {{ requests 2 concurrency 1 prompt_tokens 8 output_tokens 4 }}
}}
"""


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    # First, so that it is at the start of /proc/self/environ, where a quoted first line would show it.
    env = {"CPTEST_LEAK_PROBE": SECRET, **os.environ}
    return subprocess.run([sys.executable, "-m", "cptest", "validate", str(path)], capture_output=True,
                          text=True, cwd=path.parent, env=env, timeout=120)


def test_extends_of_the_process_environment_is_refused_without_quoting_it(tmp_path: Path) -> None:
    f = tmp_path / "s.cps"
    f.write_text(scenario("/proc/self/environ"))
    done = validate(f)
    assert done.returncode == 2
    assert "s.cps:3:3: extends '/proc/self/environ': not a scenario file" in done.stderr
    assert SECRET not in done.stdout + done.stderr


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the scenario's, holding a `.cps` file whose text is a secret (not a scenario,
    so that a parser that read it would quote it in its syntax error)."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "secret.cps").write_text(f"{SECRET}\n")
    (tmp_path / "tree").mkdir()
    return folder / "secret.cps"


@pytest.mark.parametrize("target", ["/etc/passwd", "../../x", "~/.ssh", "~/.ssh/id_rsa.cps",
                                    "/proc/1/environ", "/dev/zero"])
def test_extends_of_a_file_that_is_not_a_scenario_is_refused(tmp_path: Path, target: str) -> None:
    f = tmp_path / "s.cps"
    f.write_text(scenario(target))
    with pytest.raises(ScenarioError) as e:
        parse_file(f)
    (problem,) = e.value.problems
    assert str(problem.span) == f"{f}:3:3" and f"extends '{target}'" in problem.message
    assert set(e.value.sources) == {str(f)}  # nothing but the scenario itself can be quoted


@pytest.mark.parametrize("how", ["relative", "absolute", "symlink"])
def test_extends_of_a_cps_file_outside_the_tree_is_refused_unread(tmp_path: Path, outside: Path,
                                                                   how: str) -> None:
    tree = tmp_path / "tree"
    if how == "symlink":  # a link inside the tree that points out of it
        (tree / "defaults.cps").symlink_to(outside)
        target = "defaults.cps"
    else:
        target = "../elsewhere/secret.cps" if how == "relative" else str(outside)
    f = tree / "s.cps"
    f.write_text(scenario(target))
    done = validate(f)
    assert done.returncode == 2
    assert f"s.cps:3:3: extends '{target}' lies outside the scenario tree" in done.stderr
    assert SECRET not in done.stdout + done.stderr


def test_a_broken_cps_file_inside_the_tree_is_quoted_as_before(tmp_path: Path) -> None:
    (tmp_path / "defaults").mkdir()
    (tmp_path / "defaults" / "bad.cps").write_text("not a scenario\n")
    f = tmp_path / "s.cps"
    f.write_text(scenario("defaults/bad.cps"))
    done = validate(f)
    assert done.returncode == 2 and "not a scenario" in done.stderr and "bad.cps:1:1" in done.stderr


def test_the_checkouts_committed_defaults_may_be_extended_from_anywhere(tmp_path: Path) -> None:
    f = tmp_path / "s.cps"
    f.write_text(scenario(str(ROOT / "scenarios" / "defaults" / "tiny.cps")))
    assert parse_file(f).includes == [str(ROOT / "scenarios" / "defaults" / "tiny.cps")]


def test_a_local_models_config_outside_the_tree_is_not_read(tmp_path: Path, outside: Path) -> None:
    (outside.parent / "config.json").write_text(f'{{"num_hidden_layers": "{SECRET}"}}')
    f = tmp_path / "tree" / "s.cps"
    text = scenario(str(ROOT / "scenarios" / "defaults" / "tiny.cps"))
    synthetic = text[text.index("model synthetic"):text.index("}", text.index("model synthetic")) + 1]
    f.write_text(text.replace(synthetic, 'model local "../elsewhere"'))
    with pytest.raises(ScenarioError) as e:
        parse_file(f)
    (problem,) = e.value.problems
    assert "lies outside the scenario tree and no facts block declares the model" in problem.message
    assert SECRET not in str(e.value.problems)
    assert SECRET not in "".join(e.value.sources.values())
