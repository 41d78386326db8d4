"""What a scenario may put into the engine's environment and argv (cptest/lang/safety.py): each class
of variable and flag that loads code or config is a validate-time error at its statement, unless the
scenario declares `unsafe "reason"` and the user passes `--allow-unsafe`; what the machine requires
can never be changed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cptest.engines.sglang.releases import KNOWN_RELEASES
from cptest.errors import PlanError, ScenarioError
from cptest.lang import parse_text
from cptest.lang.safety import MACHINE_ENV, POLICIES, flag_verdict
from cptest.plan import plan
from cptest.plan.build import ENGINE_ENV, require_allowed

ROOT = Path(__file__).resolve().parents[2]


def scenario(serve: str, *, unsafe: str | None = None, engine: str = 'engine sglang "0.5.17"') -> str:
    return f"""cptest 1
scenario s {{
  {engine}
  model synthetic llama {{ layers 1 hidden 64 heads 8 kv_heads 1 head_dim 16 vocab 256 intermediate 128 }}
  topology {{ gpus 1 tp 1 }}
  serve {{
    {serve}
  }}
  workload {{ requests 2 concurrency 1 prompt_tokens 8 output_tokens 4 }}
  {f'unsafe "{unsafe}"' if unsafe else ""}
}}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ScenarioError) as e:
        parse_text(text, "s.cps", base_dir="/nonexistent")
    return [f"{p.span}: {p.message}" for p in e.value.problems]


@pytest.mark.parametrize(("entry", "why"), [
    ('env "PYTHONPATH" "/tmp/x"', "read by the Python interpreter"),
    ('env "PYTHONSTARTUP" "/tmp/x.py"', "read by the Python interpreter"),
    ('env "LD_PRELOAD" "/tmp/x.so"', "dynamic linker"),
    ('env "LD_LIBRARY_PATH" "/tmp"', "dynamic linker"),
    ('env "NCCL_NET_PLUGIN" "x"', "library or module the engine loads"),
    ('env "TORCH_EXTENSIONS_DIR" "/tmp"', "directory of files"),
    ('env "TRITON_CACHE_DIR" "/tmp"', "directory of files"),
    ('env "CUDA_HOME" "/tmp"', "installation it loads code from"),
    ('env "HOME" "/tmp"', "not in the release's allow table"),
    ('flag "--config" "x.yaml"', "YAML file of further server arguments"),
    ('flag "--trust-remote-code"', "loads code into the engine"),
    ('flag "--custom-weight-loader" "mod.fn"', "loads code into the engine"),
    ('flag "--enable-custom-logit-processor"', "loads code into the engine"),
    ('flag "--json-model-override-args" "{}"', "overrides the model's config.json"),
    ('flag "--lora-paths" "a"', "names a file, directory, config, loader or endpoint"),
    ('flag "--download-dir" "/tmp"', "names a file, directory, config, loader or endpoint"),
])  # fmt: skip
def test_an_unsafe_env_or_flag_is_an_error_at_its_statement(entry: str, why: str) -> None:
    (found,) = problems(scenario(entry))
    assert found.startswith("s.cps:7:5: unsafe: ") and why in found


@pytest.mark.parametrize("name", [*MACHINE_ENV, "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED"])
def test_the_machine_settings_cannot_be_changed_even_when_declared_unsafe(name: str) -> None:
    for unsafe in (None, "I know"):
        found = problems(scenario(f'env "{name}" "1"', unsafe=unsafe))
        assert any(f.startswith("s.cps:7:5: not allowed: ") for f in found), found


@pytest.mark.parametrize("entry", ['env "SGLANG_ENABLE_CP_V2" "1"', 'env "NCCL_DEBUG" "INFO"',
                                   'env "OMP_NUM_THREADS" "4"', 'flag "--log-level" "info"',
                                   'flag "--disable-radix-cache"', 'flag "--disable-custom-all-reduce"'])
def test_settings_that_load_nothing_pass(entry: str) -> None:
    s = parse_text(scenario(entry), "s.cps", base_dir="/nonexistent")
    assert s.unsafe is None and plan(s).unsafe is None


def test_declared_unsafe_validates_compiles_and_records_what_it_covers() -> None:
    text = scenario('env "PYTHONPATH" "/tmp/x"\n    flag "--trust-remote-code"',
                    unsafe="tests a custom model")
    p = plan(parse_text(text, "s.cps", base_dir="/nonexistent"))
    assert p.unsafe is not None and p.unsafe.reason == "tests a custom model"
    assert p.unsafe.covers == ["flag --trust-remote-code", "env PYTHONPATH"]
    assert p.unsafe.source == "s.cps:11:3"  # the serve block has two lines here
    assert "--trust-remote-code" in p.main.nodes[0].argv
    assert json.loads(p.model_dump_json())["unsafe"]["reason"] == "tests a custom model"


def test_a_declared_unsafe_plan_runs_only_with_allow_unsafe() -> None:
    p = plan(parse_text(scenario('env "PYTHONPATH" "/x"', unsafe="why"), "s.cps", base_dir="/nonexistent"))
    with pytest.raises(PlanError, match="declared unsafe .why.: it sets env PYTHONPATH"):
        require_allowed(p, allow_unsafe=False)
    require_allowed(p, allow_unsafe=True)  # nothing raised


def test_the_cli_refuses_an_unsafe_scenario_without_allow_unsafe(tmp_path: Path) -> None:
    f = tmp_path / "u.cps"
    f.write_text(scenario('env "PYTHONPATH" "/x"', unsafe="why", engine="engine reference"))
    for command in ("run", "suite"):
        argv = [sys.executable, "-m", "cptest", command, str(f), "--results", str(tmp_path / "r")]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert done.returncode == 2, done.stderr
        assert "u.cps:10:3" in done.stderr and "--allow-unsafe" in done.stderr
        assert not (tmp_path / "r").exists()


def test_an_unsafe_declaration_that_covers_nothing_is_an_error() -> None:
    (found,) = problems(scenario('flag "--log-level" "info"', unsafe="just in case"))
    assert found.startswith("s.cps:10:3: unsafe is declared but the scenario sets no unsafe env or flag")


def test_the_formatter_keeps_unsafe_and_deadline() -> None:
    from cptest.lang import format_text

    text = scenario('env "PYTHONPATH" "/x"', unsafe="why")[:-2] + "  deadline 90m\n}\n"
    once = format_text(text, "s.cps")
    assert '  unsafe "why"\n  deadline 5400s\n' in once and format_text(once, "s.cps") == once
    assert parse_text(once, "s.cps", base_dir="/x") == parse_text(text, "s.cps", base_dir="/x")


def test_an_unsafe_declaration_needs_a_reason() -> None:
    assert any("unsafe needs a reason" in f for f in problems(scenario('env "PYTHONPATH" "/x"', unsafe=" ")))


def test_the_scenario_cannot_override_the_machine_environment_in_the_plan() -> None:
    p = plan(parse_text(scenario('env "NCCL_DEBUG" "INFO"'), "s.cps", base_dir="/nonexistent"))
    env = p.main.nodes[0].env
    assert env["NCCL_DEBUG"] == "INFO" and all(env[k] == v for k, v in ENGINE_ENV.items())


def test_extra_values_of_a_flag_are_an_error_not_dropped() -> None:
    s = parse_text(scenario('flag "--max-running-requests" "4" "5"'), "s.cps", base_dir="/nonexistent")
    with pytest.raises(PlanError) as e:
        plan(s)
    (p,) = e.value.problems
    # At the first value too many: "5".
    assert str(p.span) == "s.cps:7:39" and "takes exactly one value (found 2)" in p.message


def test_a_list_flag_gets_every_value() -> None:
    s = parse_text(scenario('flag "--cuda-graph-bs" "1" "2" "4"'), "s.cps", base_dir="/nonexistent")
    argv = plan(s).main.nodes[0].argv
    i = argv.index("--cuda-graph-bs")
    assert argv[i + 1 : i + 4] == ["1", "2", "4"]


@pytest.mark.parametrize("release", list(KNOWN_RELEASES))
def test_every_denied_flag_of_a_table_exists_in_its_release(release: str) -> None:
    policy, flags = POLICIES[("sglang", release)], KNOWN_RELEASES[release].flags
    assert [f for f in policy.flag_deny if f not in flags] == []


@pytest.mark.parametrize("release", list(KNOWN_RELEASES))
def test_the_flags_the_issue_names_are_unsafe_in_every_release(release: str) -> None:
    policy = POLICIES[("sglang", release)]
    named = ("--config", "--custom-weight-loader", "--trust-remote-code", "--enable-custom-logit-processor")
    for flag in named:
        assert flag in KNOWN_RELEASES[release].flags and flag_verdict(policy, flag) is not None


def test_a_rerun_of_an_unsafe_archive_asks_for_the_same_permission(tmp_path: Path) -> None:
    # Whoever made the archive allowed it; the one rerunning it has to say so too. Refused before
    # anything is planned to run, written or launched.
    text = scenario('env "PYTHONPATH" "/x"', unsafe="why", engine="engine reference")
    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / "scenario.cps").write_text(text)
    (archive / "plan.json").write_text(plan(parse_text(text, "scenario.cps", base_dir=str(archive)))
                                       .model_dump_json(indent=2))
    argv = [sys.executable, "-m", "cptest", "rerun", str(archive), "--results", str(tmp_path / "r")]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "declared unsafe (why)" in done.stderr and "--allow-unsafe" in done.stderr
    assert not (tmp_path / "r").exists()
