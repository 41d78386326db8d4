"""tools/side_run_manifest.py: the pins of a raw side run under results/_*/ (decisions D14)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "side_run_manifest.py"


def _run(*argv: str) -> None:
    subprocess.run([sys.executable, str(TOOL), *argv], check=True, cwd=ROOT, timeout=120)


def test_a_run_whose_machine_is_gone_gets_nulls_with_the_reason_and_every_file_hashed(tmp_path: Path) -> None:
    (tmp_path / "overhead.json").write_text('{"overhead": 0.01}\n')
    (tmp_path / "overhead.log").write_text("round 0\n")
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                          check=True).stdout.strip()
    _run(str(tmp_path), "--commit", head, "--script", "tools/device/probe-overhead.sh",
         "--not-recorded", "machine gone")
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["environment"]["driver"] is None and m["environment"]["reasons"]["driver"] == "machine gone"
    names = ("overhead.json", "overhead.log")
    want = {n: hashlib.sha256((tmp_path / n).read_bytes()).hexdigest() for n in names}
    assert m["files"] == want
    shown = subprocess.run(["git", "show", f"{head}:tools/device/probe-overhead.sh"], capture_output=True,
                           cwd=ROOT, check=True).stdout
    assert m["script_sha256"] == hashlib.sha256(shown).hexdigest()  # the script as the commit had it
    sums = dict(reversed(line.split("  ")) for line in (tmp_path / "SHA256SUMS").read_text().splitlines())
    assert sums["overhead.json"] == want["overhead.json"]
    assert sums["manifest.json"] == hashlib.sha256((tmp_path / "manifest.json").read_bytes()).hexdigest()


def test_a_commit_without_the_script_gives_no_script_hash(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x\n")
    first = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], capture_output=True, text=True,
                           cwd=ROOT, check=True).stdout.split()[0]
    _run(str(tmp_path), "--commit", first, "--script", "tools/device/probe-overhead.sh",
         "--not-recorded", "x")
    assert json.loads((tmp_path / "manifest.json").read_text())["script_sha256"] is None


def _git(repo: Path, *argv: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *argv], capture_output=True, text=True, check=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}).stdout.strip()


def test_the_code_pin_names_the_commit_whose_files_ran(tmp_path: Path) -> None:
    """A stale commit name is caught: the pin matches the tree, and the finder names its commit."""
    repo = tmp_path / "repo"
    (repo / "cptest").mkdir(parents=True)
    (repo / "tools").mkdir()
    (repo / "cptest" / "a.py").write_text("A = 1\n")
    (repo / "tools" / "t.sh").write_text("echo 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "one")
    old = _git(repo, "rev-parse", "HEAD")
    (repo / "cptest" / "a.py").write_text("A = 2\n")
    (repo / "cptest" / "__pycache__").mkdir()
    (repo / "cptest" / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\0")  # a cache: not code
    _git(repo, "commit", "-q", "-am", "two")
    new = _git(repo, "rev-parse", "HEAD")
    run = tmp_path / "run"
    run.mkdir()
    (run / "x.log").write_text("x\n")
    # the machine's stale .git named the old commit, while the tree was the new one
    subprocess.run([sys.executable, str(TOOL), str(run), "--commit", old, "--script", "tools/t.sh",
                    "--not-recorded", "test"], check=True, cwd=repo, timeout=120)
    code = json.loads((run / "manifest.json").read_text())["code"]
    assert code["files"] == 2 and code["commit_matches"] is False
    found = subprocess.run([sys.executable, str(ROOT / "tools" / "side_run_commit.py"), str(run), "--repo",
                            str(repo)], capture_output=True, text=True, cwd=repo, timeout=120)
    assert found.returncode == 0 and found.stdout.split(": ")[1].strip() == new[:12]
    (repo / "cptest" / "b.py").write_text("uncommitted\n")  # a tree no commit had
    subprocess.run([sys.executable, str(TOOL), str(run), "--commit", new, "--script", "tools/t.sh",
                    "--not-recorded", "test"], check=True, cwd=repo, timeout=120)
    assert json.loads((run / "manifest.json").read_text())["code"]["commit_matches"] is False
    found = subprocess.run([sys.executable, str(ROOT / "tools" / "side_run_commit.py"), str(run), "--repo",
                            str(repo)], capture_output=True, text=True, cwd=repo, timeout=120)
    assert found.returncode == 1 and found.stdout.strip().endswith(": none")
