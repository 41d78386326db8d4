"""flake.nix, without nixpkgs: its outputs evaluated against a stand-in (.ci/check-flake.nix).

No machine of this project reaches GitHub, so `nix develop` itself cannot run here. What can:
the flake's own logic, evaluated by Nix with builders that return their arguments, and the dev
shell's `cptest` wrapper script, run with this Python in place of the shell's (the checkout on
PYTHONPATH, as the shellHook puts it). Skipped where nix-instantiate is absent (CI installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / ".ci" / "check-flake.nix"

pytestmark = pytest.mark.skipif(shutil.which("nix-instantiate") is None,
                                reason="nix-instantiate (Debian's nix-bin) not installed")


def _eval(flake_dir: Path = ROOT, python: str | None = None, attr: str = "") -> subprocess.CompletedProcess:
    argv = ["nix-instantiate", "--eval", "--strict", "--json", str(CHECK),
            "--arg", "flakeDir", str(flake_dir)]
    if python is not None:
        argv += ["--argstr", "python", python]
    if attr:
        argv += ["-A", attr]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _copy(tmp_path: Path, old: str, new: str) -> Path:
    text = (ROOT / "flake.nix").read_text()
    assert old in text, old
    (tmp_path / "flake.nix").write_text(text.replace(old, new))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_check_script_passes() -> None:
    r = subprocess.run(["bash", str(ROOT / ".ci" / "check-flake.sh")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "ac62194c3917d5f474c1a844b6fd6da2db95077d" in r.stdout


def test_every_system_has_the_package_and_a_cptest_command() -> None:
    r = _eval(attr="")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["systems"]) == {"x86_64-linux", "aarch64-linux"}
    assert set(out["wrappers"]) == set(out["systems"])
    assert set(out["packages"].values()) == {"cptest"}


def test_dev_shell_cptest_command_runs(tmp_path: Path) -> None:
    # The wrapper as the flake writes it, with this interpreter's prefix as the shell's Python.
    if not (Path(sys.prefix) / "bin" / "python").exists():
        pytest.skip(f"no {sys.prefix}/bin/python to stand in for the shell's Python")
    system = "aarch64-linux" if os.uname().machine == "aarch64" else "x86_64-linux"
    r = _eval(python=sys.prefix, attr=f"wrappers.{system}")
    assert r.returncode == 0, r.stderr
    script = tmp_path / "bin" / "cptest"
    script.parent.mkdir()
    script.write_text("#!/usr/bin/env bash\n" + json.loads(r.stdout))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{script.parent}:{os.environ['PATH']}"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = subprocess.run(["cptest", "--help"], cwd=elsewhere, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert "validate" in run.stdout and "run" in run.stdout


@pytest.mark.parametrize(("old", "new", "message"), [
    ("github:NixOS/nixpkgs/ac62194c3917d5f474c1a844b6fd6da2db95077d", "github:NixOS/nixpkgs/nixos-25.05",
     "not a branch"),
    ("github:NixOS/nixpkgs/ac62194c3917d5f474c1a844b6fd6da2db95077d", "github:NixOS/nixpkgs/ac62194",
     "not a branch"),
    ("(cptestIn pkgs)", "", "no `cptest` command"),
    ('-m cptest "$@"', '-m cptest.cli "$@"', "does not exec the shell's python -m cptest"),
    ("export PYTHONPATH=", "export CPTEST_SRC=", "PYTHONPATH"),
    ("        orjson\n", "", "are not pyproject.toml's"),
    ('meta.mainProgram = "cptest";', "", "mainProgram"),
    ("        transformers ", "        tensorflow ", "undefined variable 'tensorflow'"),
])
def test_check_refuses(tmp_path: Path, old: str, new: str, message: str) -> None:
    r = _eval(_copy(tmp_path, old, new))
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
