"""Specification of cptest/run/interpreter.py and its use: SGLang's interpreter is named (option,
environment variable, PATH), asked in one subprocess whether it imports `sglang` and which version,
refused before launch as `unknown` (exit 3) when it cannot say or says another release, launched by
the path that was asked, and recorded in the manifest.

Every interpreter here is real: a virtual environment made for the test (links kept, as a venv's
`bin/python3` is one), without sglang, or with a package named `sglang` on its path whose
`__version__` plays a release. Importing it is a real import; its `launch_server` module says which
interpreter and environment ran it, and exits."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from cptest import pipeline
from cptest.outline import Logger, TerminalSink
from cptest.plan.model import Placement, Plan
from cptest.run import interpreter
from cptest.run.interpreter import ENV_VAR, inspect, locate, same_release
from cptest.run.preflight import InfrastructureError, engine_python_causes
from cptest.run.process import ProcessLauncher

from conftest import free_port  # isort: skip

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "tp1_llama_kv1.cps"
"""An SGLang scenario of the suite (release 0.5.17), planned as on a GPU machine."""

LAUNCH_SERVER = """\
import sys
print("fake sglang.launch_server on", sys.executable, "prefix", sys.prefix, flush=True)
sys.exit(1)
"""


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment without sglang; its python3, a link to the base interpreter."""
    d = tmp_path_factory.mktemp("venv") / "bare"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(d)
    return d / "bin" / "python3"


def fake_sglang(where: Path, version: str | None, *, init: str = "") -> Path:
    """A package `sglang` under `where` (a PYTHONPATH entry, or a venv's site-packages)."""
    pkg = where / "sglang"
    pkg.mkdir(parents=True)
    head = f"__version__ = {version!r}\n" if version is not None else ""
    (pkg / "__init__.py").write_text(head + init)
    (pkg / "launch_server.py").write_text(LAUNCH_SERVER)
    return where


def sglang_venv(root: Path, version: str) -> Path:
    """A virtual environment with a fake sglang `version` in its own site-packages."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    site = root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    fake_sglang(site, version)
    return root / "bin" / "python3"


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "PYTHONPATH")}
    return env | extra


# ---------------------------------------------------------------------------------------- naming
def test_an_option_beats_the_variable_which_beats_path_and_links_are_kept(bare_venv: Path,
                                                                          tmp_path: Path) -> None:
    assert bare_venv.is_symlink()
    env = env_with(**{ENV_VAR: str(bare_venv)})
    other = sglang_venv(tmp_path / "other", "0.5.17")
    assert locate(other, environ=env) == (str(other), "--engine-python", str(other))
    assert locate(None, environ=env) == (str(bare_venv), ENV_VAR, str(bare_venv))
    # Links kept: resolving the venv's python3 would land on the base interpreter, without its sglang.
    assert Path(locate(None, environ=env)[0] or "").resolve() != bare_venv
    on_path = env_with(PATH=f"{bare_venv.parent}:/usr/bin:/bin")
    assert locate(None, environ=on_path) == (str(bare_venv), "PATH", "python3")
    assert locate("bin/python3", environ=env, cwd=bare_venv.parent.parent)[0] == str(bare_venv)
    assert locate(tmp_path / "nope" / "python3", environ=env)[0] is None


# ---------------------------------------------------------------------------------------- asking
def test_an_environment_without_sglang_is_unknown_with_the_import_error(bare_venv: Path) -> None:
    found = inspect(bare_venv, environ=env_with())
    assert not found.ok and found.version is None
    assert "cannot import sglang: ModuleNotFoundError: No module named 'sglang'" in (found.error or "")
    (cause,) = engine_python_causes(plan(), found)
    assert cause.code == "engine_python" and "--engine-python PATH" in cause.remedy


def test_a_missing_interpreter_and_a_file_that_is_no_python_are_unknown(tmp_path: Path) -> None:
    missing = inspect(tmp_path / "nope" / "python3", environ=env_with())
    assert missing.path is None and "no such file" in (missing.error or "")
    script = tmp_path / "python3"
    script.write_text("#!/bin/sh\necho hello\nexit 0\n")
    script.chmod(0o755)
    found = inspect(script, environ=env_with())
    assert not found.ok and "is not a Python that answered (exit 0" in (found.error or "")
    assert "not on PATH" in (inspect(None, environ=env_with(PATH=str(tmp_path / "empty"))).error or "")


MISMATCH = "sglang_mismatch"


@pytest.mark.parametrize(("installed", "cause"), [("0.5.17", None), ("0.5.17.post1", None),
                                                  ("0.5.23", MISMATCH), ("0.5.17rc1", MISMATCH)])
def test_the_version_imported_must_be_the_plans_release(installed: str, cause: str | None, bare_venv: Path,
                                                        tmp_path: Path) -> None:
    path = fake_sglang(tmp_path / "pp", installed)
    found = inspect(bare_venv, environ=env_with(PYTHONPATH=str(path)))
    assert found.ok and found.version == installed and found.path == str(bare_venv)
    causes = engine_python_causes(plan(), found)
    assert [c.code for c in causes] == ([cause] if cause else [])
    if cause:
        assert f"imports SGLang {installed}; the plan pins 0.5.17" in causes[0].message


def test_a_package_with_no_version_and_a_hung_import_are_unknown(bare_venv: Path, tmp_path: Path) -> None:
    found = inspect(bare_venv, environ=env_with(PYTHONPATH=str(fake_sglang(tmp_path / "a", None))))
    assert not found.ok and "no version can be read" in (found.error or "")
    hung = fake_sglang(tmp_path / "b", "0.5.17", init="import time\ntime.sleep(60)\n")
    t0 = time.monotonic()
    found = inspect(bare_venv, environ=env_with(PYTHONPATH=str(hung)), timeout_s=1.0)
    assert time.monotonic() - t0 < 10
    assert not found.ok and "did not answer `import sglang` within 1 s" in (found.error or "")


def test_an_interpreter_is_asked_once_per_process(bare_venv: Path, tmp_path: Path) -> None:
    env = env_with(PYTHONPATH=str(fake_sglang(tmp_path / "pp", "0.5.17")))
    interpreter._CACHE.clear()
    t0 = time.monotonic()
    first = inspect(bare_venv, environ=env)
    asked = time.monotonic() - t0
    t0 = time.monotonic()
    assert inspect(bare_venv, environ=env) is first and time.monotonic() - t0 < asked / 5


def test_release_matching() -> None:
    assert same_release("0.5.17", "0.5.17") and same_release("0.5.17+cu128", "0.5.17")
    assert same_release("0.5.17.post2", "0.5.17")
    assert not same_release("0.5.17.dev0", "0.5.17") and not same_release("0.5.1", "0.5.17")
    assert not same_release("0.5.170", "0.5.17") and not same_release("garbage", "0.5.17")


# ---------------------------------------------------------------------------------------- using
def plan(main_port: int = 30000, baseline_port: int = 30100) -> Plan:
    return pipeline.prepare(SCENARIO, engine="sglang", gpu_present=True,
                            placement=Placement(main_port=main_port, baseline_port=baseline_port)).plan


def test_the_launcher_runs_sglang_on_the_named_interpreter(tmp_path: Path) -> None:
    python = sglang_venv(tmp_path / "sgl", "0.5.17")
    node = plan().main.nodes[0]
    assert node.argv[:3] == ["python3", "-m", "sglang.launch_server"]  # the plan stays machine-independent
    launcher = ProcessLauncher(engine_python=str(python))
    handle = launcher.start(node, tmp_path / "node0.log", {"run": "interp"})
    try:
        for _ in range(200):
            if handle.poll() is not None:
                break
            time.sleep(0.05)
    finally:
        launcher.teardown(handle, 2.0)
    assert handle.argv[0] == str(python)
    log = (tmp_path / "node0.log").read_text()
    assert f"fake sglang.launch_server on {python} prefix {python.parent.parent}" in log


def run(plan_: Plan, out: Path, launcher: ProcessLauncher, models: Path) -> pipeline.Outcome:
    log = Logger([TerminalSink(io.StringIO())])
    return pipeline.run_scenario(plan_, out, launcher, scenario_text=SCENARIO.read_text(), log=log,
                                 preflight={"gpus": lambda: None}, models=models,
                                 scenario_dir=SCENARIO.parent)


def test_a_mismatched_release_stops_the_run_before_anything_is_archived(tmp_path: Path) -> None:
    python = sglang_venv(tmp_path / "sgl", "0.5.23")
    out = tmp_path / "results" / "tp1" / "run"
    with pytest.raises(InfrastructureError) as err:
        run(plan(free_port(), free_port()), out, ProcessLauncher(engine_python=str(python)),
            tmp_path / "models")
    assert err.value.exit_code == 3 and [c.code for c in err.value.causes] == ["sglang_mismatch"]
    assert "imports SGLang 0.5.23; the plan pins 0.5.17" in err.value.render()
    assert not out.exists()


def test_the_manifest_records_the_interpreter_and_its_sglang(tmp_path: Path) -> None:
    # The fake engine exits at once: the run's verdict is not the point, its manifest is.
    python = sglang_venv(tmp_path / "sgl", "0.5.17")
    out = tmp_path / "results" / "tp1" / "run"
    launcher = ProcessLauncher(engine_python=str(python))
    run(plan(free_port(), free_port()), out, launcher, tmp_path / "models")
    env = json.loads((out / "manifest.json").read_text())["environment"]
    assert env["engine_python"] == str(python) and env["engine_python_named_by"] == "--engine-python"
    assert env["sglang"] == "0.5.17" and env["sglang_record_sha256"] is None
    assert "not installed by pip" in env["reasons"]["sglang_record_sha256"]
    assert "fake sglang.launch_server on " + str(python) in (out / "logs" / "main-node0.log").read_text()


def test_cli_run_without_sglang_is_unknown_and_docker_with_an_interpreter_is_bad_input(
        bare_venv: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # `nvidia-smi` on PATH: cptest plans for SGLang, as on a GPU machine
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**env_with(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "NO_COLOR": "1"}
    args = [sys.executable, "-m", "cptest", "run", SCENARIO, "--results", tmp_path / "runs", "--models",
            tmp_path / "models", "--ports", f"{free_port()},{free_port()}", "--no-baseline-cache", "--json"]
    done = subprocess.run([*map(str, args), "--engine-python", str(bare_venv)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 3, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["status"] == "unknown" and [c["code"] for c in out["causes"]] == ["engine_python"]
    assert "No module named 'sglang'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("manifest.json"))
    # The variable names it as the option does.
    done = subprocess.run(list(map(str, args)), capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**env, ENV_VAR: str(bare_venv)})
    assert done.returncode == 3 and f"named by {ENV_VAR}" in done.stderr, done.stderr[-2000:]
    docker = subprocess.run([*map(str, args), "--engine-python", str(bare_venv), "--launcher", "docker"],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert docker.returncode == 2 and "under --launcher docker" in docker.stderr
