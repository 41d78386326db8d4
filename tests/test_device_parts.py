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
