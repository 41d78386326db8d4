"""A `flag` statement sets one flag: its values are values of that flag, never options of their own.

Issue 32's reproduction: `flag "--cuda-graph-bs" "1" "--trust-remote-code" "--host" "0.0.0.0"`
passed every table (they judge the statement's first word) and launched SGLang with
`--trust-remote-code`; `--forward-hooks` and `--config` went through the same way, past the `unsafe`
gate. A value SGLang's parser would read as an option is refused at that value by `cptest
validate`, `run` and `suite` (before anything is planned to launch), declared unsafe or not; a
value of the wrong count or type is refused at that value too, by the release's flag table.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cptest.cli import main
from cptest.engines.sglang.argv import build_argv
from cptest.engines.sglang.releases import KNOWN_RELEASES
from cptest.errors import PlanError
from cptest.lang import parse_text
from cptest.lang.safety import option_like
from cptest.plan import plan
from tests.engines.sglang.configs import serve_config
from tests.lang.test_safety import problems
from tests.lang.test_safety import scenario as safety_scenario

ROOT = Path(__file__).resolve().parents[2]
PREFIX = '    flag "--cuda-graph-bs" "1" '
"""The statement's text up to the smuggled value: that value starts at column len(PREFIX) + 1."""


def scenario(serve: str, *, unsafe: str | None = None) -> str:
    # `serve` comes with its own indentation, so that PREFIX's columns are the file's.
    return safety_scenario(serve.removeprefix("    "), unsafe=unsafe)


SMUGGLED = [
    "--trust-remote-code", "--forward-hooks", "--config", "--host", "--custom-weight-loader",
    "--enable-custom-logit-processor", "--trust-remote-code=1", "--config=x.yaml", "--trust-remote",
    "-c", "-h", "-tp", "-1e5", "-_x", "--",
]  # fmt: skip


@pytest.mark.parametrize("value", SMUGGLED)
@pytest.mark.parametrize("unsafe", [None, "tests a custom model"])
def test_a_value_that_is_an_option_is_refused_at_the_value(value: str, unsafe: str | None) -> None:
    found = problems(scenario(f'{PREFIX}"{value}"', unsafe=unsafe))
    col = len(PREFIX) + 1
    assert f"s.cps:7:{col}: flag --cuda-graph-bs: the value {value!r} would be read as an option" in \
        "\n".join(found), found


def test_the_issues_reproduction_names_each_smuggled_option() -> None:
    text = scenario('    flag "--cuda-graph-bs" "1" "--trust-remote-code" "--host" "0.0.0.0"')
    found = problems(text)
    assert [f.split(": ")[0] for f in found if "read as an option" in f] == ["s.cps:7:32", "s.cps:7:54"]


@pytest.mark.parametrize("value", ["-1", "-0.5", "-.5", "-", "1", "x-y", "a--b"])
def test_negative_numbers_and_plain_words_are_values(value: str) -> None:
    # argparse's own rule: these are read as values, whatever flag they follow.
    assert not option_like(value)


@pytest.mark.parametrize("value", SMUGGLED)
def test_option_like_says_what_argparse_would_read_as_an_option(value: str) -> None:
    assert option_like(value)


@pytest.mark.parametrize("command", ["validate", "lint", "compile"])
@pytest.mark.parametrize(("serve", "where", "message"), [
    ('flag "--cuda-graph-bs" "1" "x"', "7:32", "--cuda-graph-bs: 'x' is not an integer"),
    ('flag "--max-running-requests" "four"', "7:35", "--max-running-requests: 'four' is not an integer"),
    ('flag "--max-running-requests" "4" "5"', "7:39", "takes exactly one value (found 2)"),
    ('flag "--max-running-requests"', "7:10", "--max-running-requests: takes a value"),
    ('flag "--disable-radix-cache" "true"', "7:34", "is a switch and takes no value"),
    ('flag "--watchdog-timeout" "soon"', "7:31", "--watchdog-timeout: 'soon' is not a number"),
    ('flag "--schedule-policy" "random-ish"', "7:30", "--schedule-policy random-ish: expected"),
    ('flag "--preferred-sampling-params" "{bad"', "7:40", "'{bad' is not JSON"),
    ('flag "--max-prefill-tokens" "8 k"', "7:33", "'8 k' is not an integer, optionally with a suffix"),
])  # fmt: skip
def test_a_value_of_the_wrong_count_or_type_is_exit_2_at_the_value(
        tmp_path: Path, command: str, serve: str, where: str, message: str) -> None:
    f = tmp_path / "s.cps"
    f.write_text(scenario("    " + serve))
    result = CliRunner().invoke(main, [command, str(f)])
    assert result.exit_code == 2, (result.output, result.exception)
    assert f"s.cps:{where}: " in result.output and message in result.output, result.output


@pytest.mark.parametrize("serve", ['flag "--max-prefill-tokens" "8k"', 'flag "--max-prefill-tokens" "1Ki"',
                                   'flag "--watchdog-timeout" "-1.5"', 'flag "--cuda-graph-bs" "1" "2" "4"',
                                   'flag "--preferred-sampling-params" "{\\"top_k\\": 1}"',
                                   'flag "--schedule-policy" "lpm"', 'flag "--log-level" "info"'])
def test_values_sglang_parses_pass(serve: str) -> None:
    plan(parse_text(scenario("    " + serve), "s.cps", base_dir="/nonexistent"))  # nothing raised


@pytest.mark.parametrize("command", ["run", "suite"])
@pytest.mark.parametrize(("serve", "where"), [
    ('flag "--cuda-graph-bs" "1" "--trust-remote-code"', "7:32"),
    ('flag "--cuda-graph-bs" "1" "x"', "7:32"),
])
def test_run_and_suite_refuse_before_anything_is_written(tmp_path: Path, command: str, serve: str,
                                                         where: str) -> None:
    # On a machine without a GPU the reference engine stands in for SGLang and passes no flag:
    # the file is refused all the same, so that it is refused on every machine.
    f = tmp_path / "s.cps"
    f.write_text(scenario("    " + serve))
    argv = [sys.executable, "-m", "cptest", command, str(f), "--results", str(tmp_path / "r")]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"s.cps:{where}:" in done.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("release", list(KNOWN_RELEASES))
def test_argv_refuses_a_smuggled_option_of_a_scenario_built_in_code(release: str) -> None:
    # The language stage is not the only gate: argv is built from a Scenario, which code can make.
    cfg = serve_config("/m", extra=(("--cuda-graph-bs-decode", ("1", "--trust-remote-code")),))
    with pytest.raises(PlanError, match="'--trust-remote-code' would be read as an option"):
        build_argv(KNOWN_RELEASES[release], cfg)


# ------------------------------------------------------------------------------------ environment
# Each reproduced in issue 32: allowed by a prefix (SGLANG_*, TRITON_*, TORCH_*, FLASHINFER_*), each
# loads code, writes outside the archive or weakens deserialisation; then variants of each class.
UNSAFE_ENV = [
    ("SGLANG_EXTERNAL_MODEL_PACKAGE", "mypkg", "names a package the engine imports"),
    ("SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE", "mypkg", "names a package the engine imports"),
    ("TRITON_CACHE_MANAGER", "evil:Manager", "names a class the engine imports"),
    ("TRITON_REMOTE_CACHE_BACKEND", "evil:Backend", "cache backend"),
    ("TRITON_CACHE_BACKEND", "redis", "cache backend"),
    ("FLASHINFER_WORKSPACE_BASE", "/tmp/ws", "names a directory the engine writes"),
    ("FLASHINFER_WORKSPACE_BASE", "ws", "names a directory the engine writes"),
    ("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1", "unpickles checkpoints"),
    ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0", "unpickles checkpoints"),
    ("SGLANG_USE_PICKLE_IPC", "1", "unpickle what it receives"),
    ("TORCH_LOGS_OUT", "/tmp/torch.log", "names a file the engine writes"),
    ("TORCH_LOGS_OUT", "torch.log", "names a file the engine writes"),
    ("SGLANG_REGISTER_FFI_REFERENCE_CLASS", "x", "names a class the engine imports"),
    ("SGLANG_S3_ENDPOINT_URL", "http://x", "another host"),
    ("SGLANG_GRPC_ENDPOINT", "x:1", "another host"),
    ("SGLANG_TEST_SCRIPTED_RUNTIME_SYS_PATH_ENTRY", "x", "import path"),
    # Names the deny patterns miss: the value gives them away.
    ("SGLANG_SOME_NEW_SETTING", "/etc/passwd", "names a file or directory"),
    ("TORCH_TRACE", "trace/out", "names a file or directory"),
    ("NCCL_DEBUG", "~root", "names a file or directory"),
    ("SGLANG_X", "..\\\\x", "names a file or directory"),
    ("TORCH_COMPILE_BACKEND", "evil.backends:compile", "names a module or class the engine would import"),
    ("SGLANG_FORCE_FUSED_OP_BACKEND", "evil.mod", "names a module or class the engine would import"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value", "why"), UNSAFE_ENV)
def test_an_env_that_loads_code_writes_files_or_unpickles_is_unsafe(name: str, value: str, why: str) -> None:
    (found,) = problems(scenario(f'    env "{name}" "{value}"'))
    assert found.startswith("s.cps:7:5: unsafe: ") and why in found, found


@pytest.mark.parametrize(("name", "value", "why"), UNSAFE_ENV)
def test_a_plan_of_a_scenario_built_in_code_refuses_the_same_env(name: str, value: str, why: str) -> None:
    s = parse_text(scenario('    env "SGLANG_ENABLE_CP_V2" "1"'), "s.cps", base_dir="/nonexistent")
    s = s.model_copy(update={"serve": s.serve.model_copy(update={"env": {name: value}})})
    with pytest.raises(PlanError, match="unsafe: "):
        plan(s)


@pytest.mark.parametrize(("name", "value"), [
    ("SGLANG_ENABLE_CP_V2", "1"), ("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT,COLL"),
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"), ("TORCH_COMPILE_BACKEND", "inductor"),
    ("SGLANG_BACKUP_PORT_BASE", "40000"), ("TORCH_LOGS", "+dynamo,recompiles"),
    ("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "1"), ("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "0"),
])  # fmt: skip
def test_an_env_of_words_and_numbers_passes(name: str, value: str) -> None:
    s = parse_text(scenario(f'    env "{name}" "{value}"'), "s.cps", base_dir="/nonexistent")
    assert s.unsafe is None and plan(s).unsafe is None
