"""tools/device/parts.sh: folders cut into pieces that fit beside the working tree in a GPU call,
put together again on the machine, in any order of arrival, and refused when damaged."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "device" / "parts.sh"


def parts(cwd: Path, there: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DEVICE_PARTS_DIR": str(there)})


@pytest.fixture
def sent(tmp_path: Path) -> Path:
    here = tmp_path / "here"
    (here / "bundle" / "c1").mkdir(parents=True)
    (here / "bundle" / "c1" / "big.whl").write_bytes(os.urandom(3 << 20))
    (here / "bundle" / "c1" / "install-bundle").write_text("echo installing\n")
    done = parts(here, tmp_path / "there", "make", "--mib", "1", "bundle")
    assert done.returncode == 0, done.stderr
    assert "in 4 piece(s) of at most 1 MiB" in done.stdout
    return here


def test_pieces_arriving_in_any_order_give_back_the_folders_byte_for_byte(sent: Path, tmp_path: Path) -> None:
    there = tmp_path / "there"
    for n, missing in (("02", "00 01 03"), ("00", "01 03"), ("03", "01")):
        got = parts(sent, there, "receive", f".device-parts/{n}")
        assert got.returncode == 2 and got.stdout.endswith(f"still missing: {missing}\n"), got.stdout
    last = parts(sent, there, "receive", ".device-parts/01")
    assert last.returncode == 0 and last.stdout.startswith("complete: bundle"), last.stdout + last.stderr
    assert (there / "tree" / "bundle" / "c1" / "big.whl").read_bytes() == \
        (sent / "bundle" / "c1" / "big.whl").read_bytes()


def test_a_damaged_piece_is_refused(sent: Path, tmp_path: Path) -> None:
    piece = sent / ".device-parts" / "01" / "piece"
    data = bytearray(piece.read_bytes())
    data[100] ^= 1
    piece.write_bytes(bytes(data))
    got = parts(sent, tmp_path / "there", "receive", ".device-parts/01")
    assert got.returncode == 1 and "piece 01 is damaged" in got.stderr


def test_a_tracked_file_missing_from_the_tree_does_not_count_or_stop_the_sizing(tmp_path: Path) -> None:
    # A sparse checkout leaves tracked files out of the tree; what travels is what is there.
    here = tmp_path / "here"
    (here / "results").mkdir(parents=True)
    (here / "results" / "archive.bin").write_bytes(os.urandom(2 << 20))
    (here / "bundle").mkdir()
    (here / "bundle" / "chunk").write_bytes(os.urandom(1 << 20))
    git = ["git", "-C", str(here), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "results"], check=True)
    subprocess.run([*git, "commit", "-qm", "archive"], check=True)
    (here / "results" / "archive.bin").unlink()
    done = parts(here, tmp_path / "there", "make", "bundle")
    assert done.returncode == 0, done.stderr
    # 62 MiB less the 1 MiB bundle (untracked, so it travels too); the missing 2 MiB do not count.
    assert "in 1 piece(s) of at most 61 MiB" in done.stdout


def _installer(folder: Path, status: int, log: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "install-kernel-extras").write_text(
        f"import sys\nopen({str(log)!r}, 'a').write({folder.name!r} + '\\n')\nsys.exit({status})\n")


@pytest.mark.parametrize("last, want", [(0, 0), (1, 1)])
def test_install_extras_runs_every_chunk_installer_and_answers_with_the_last(
        tmp_path: Path, last: int, want: int) -> None:
    there = tmp_path / "there"
    extras = there / "tree" / ".kernel-extras"
    log = tmp_path / "calls"
    # Every installer but the last finds parts still missing (exit 2): that must not stop the loop.
    _installer(extras / "k1", 2, log)
    _installer(extras / "k2", 2, log)
    _installer(extras / "k3", last, log)
    got = parts(tmp_path, there, "install-extras")
    assert got.returncode == want, got.stdout + got.stderr
    assert log.read_text().split() == ["k1", "k2", "k3"]


def test_install_extras_without_extras_in_the_set_says_so(tmp_path: Path) -> None:
    got = parts(tmp_path, tmp_path / "there", "install-extras")
    assert got.returncode == 1 and "no kernel extras" in got.stderr


def test_a_folders_work_scratch_does_not_travel(tmp_path: Path) -> None:
    here = tmp_path / "here"
    (here / "extras" / "k1").mkdir(parents=True)
    (here / "extras" / "k1" / "part").write_bytes(os.urandom(1 << 20))
    (here / "extras" / ".work").mkdir()
    (here / "extras" / ".work" / "unpacked.so").write_bytes(os.urandom(3 << 20))
    made = parts(here, tmp_path / "there", "make", "--mib", "1", "extras")
    assert made.returncode == 0 and "in 2 piece(s)" in made.stdout, made.stdout + made.stderr
    for n in ("00", "01"):
        got = parts(here, tmp_path / "there", "receive", f".device-parts/{n}")
    assert got.returncode == 0, got.stdout + got.stderr
    assert (tmp_path / "there" / "tree" / "extras" / "k1" / "part").exists()
    assert not (tmp_path / "there" / "tree" / "extras" / ".work").exists()
