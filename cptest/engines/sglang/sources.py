"""Reading SGLang's source and checking a registry's citations against it (`cptest sources check`).

The source is the release's pinned wheel, fetched once into a user cache and verified by sha256
before any use; or a wheel or unpacked tree given by path; or the importable `sglang` package. A
source that cannot be had raises `SourceUnavailable` (exit 3); a citation that does not hold is a
`Finding` (exit 1), never an exception.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cptest.archive_io import sha256_file
from cptest.engines.sglang.citations import Citation, WheelPin
from cptest.errors import CptestError, Problem

WHEEL_ENV = "CPTEST_SGLANG_WHEEL"
"""A local wheel (or unpacked tree) to read instead of fetching the pinned one."""


class SourceUnavailable(CptestError):
    """The SGLang source to check against cannot be had (no wheel, a wrong sha256, no network). Exit 3."""

    exit_code = 3


@dataclass(frozen=True)
class Source:
    """Where the files come from, and how to read one by its path inside the wheel (None: absent)."""

    label: str
    read: Callable[[str], str | None] = field(repr=False)


@dataclass(frozen=True)
class Finding:
    """A citation that does not hold: `moved` (the anchor is elsewhere in the file: `found_at`),
    `not_found` (nowhere in the file), `no_file`, or `out_of_range` (the file is shorter)."""

    citation: Citation
    status: str
    found_at: tuple[int, ...] = ()
    file_lines: int = 0


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/cptest/sglang-wheels`, else `~/.cache/cptest/sglang-wheels`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cptest" / "sglang-wheels"


def verified(path: Path, pin: WheelPin) -> Path:
    """`path` if it holds the pinned wheel; raises SourceUnavailable otherwise."""
    if not path.is_file():
        hint = f"give the path of {pin.filename}, or leave --wheel out to fetch it"
        raise SourceUnavailable(Problem(None, f"sources: no wheel at {path}", hint=hint))
    digest = sha256_file(path)
    if digest != pin.sha256:
        raise SourceUnavailable(Problem(None, f"sources: {path} is not the pinned {pin.requirement} wheel",
                                        expected=f"sha256 {pin.sha256}", found=f"sha256 {digest}",
                                        hint=f"delete it, or give {pin.filename}"))
    return path


def fetch(pin: WheelPin, cache: Path | None = None) -> Path:
    """The pinned wheel from the cache, downloaded there first with pip when absent (argv, no shell)."""
    cache = cache or cache_dir()
    wheel = cache / pin.filename
    if wheel.is_file():
        return verified(wheel, pin)
    cache.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_34_x86_64",
            "--disable-pip-version-check", "-d", str(cache), pin.requirement]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SourceUnavailable(f"sources: cannot run pip to fetch {pin.requirement}: {e}") from None
    if done.returncode != 0 or not wheel.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        hint = f"download it yourself and pass --wheel PATH, or set {WHEEL_ENV}"
        said = " ".join(tail)
        message = f"sources: pip could not fetch {pin.filename}: {said}"
        raise SourceUnavailable(Problem(None, message, hint=hint))
    return verified(wheel, pin)


def from_wheel(path: Path) -> Source:
    """A wheel file (read in place, never unpacked) or an unpacked tree holding `sglang/`."""
    if path.is_dir():
        if not (path / "sglang").is_dir():
            raise SourceUnavailable(Problem(None, f"sources: {path} holds no sglang/ folder",
                                            hint="give the folder an unpacked wheel's sglang/ is in"))
        return Source(str(path), lambda name: _read_file(path / name))
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise SourceUnavailable(f"sources: {path} is not a readable wheel: {e}") from None
    names = set(archive.namelist())
    return Source(path.name,
                  lambda name: archive.read(name).decode("utf-8", "replace") if name in names else None)


def installed() -> Source:
    """The `sglang` package this interpreter imports (located without importing it: SGLang's import
    needs a GPU stack)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SourceUnavailable(Problem(None, "sources: no importable sglang package here",
                                        hint="run where SGLang is installed, or leave --installed out"))
    root = Path(next(iter(spec.submodule_search_locations))).parent
    return Source(f"installed sglang at {root / 'sglang'}", lambda name: _read_file(root / name))


def _read_file(path: Path) -> str | None:
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None


def check(citations: tuple[Citation, ...] | list[Citation], source: Source) -> list[Finding]:
    """Each citation that does not hold in `source`, in the order given."""
    texts: dict[str, list[str] | None] = {}
    findings = []
    for c in citations:
        if c.wheel_path not in texts:
            text = source.read(c.wheel_path)
            texts[c.wheel_path] = None if text is None else text.splitlines()
        lines = texts[c.wheel_path]
        if lines is None:
            findings.append(Finding(c, "no_file"))
            continue
        at = tuple(i for i, line in enumerate(lines, 1) if any(a in line for a in c.anchors))
        if c.end > len(lines):
            status = "out_of_range"
        elif any(c.start <= i <= c.end for i in at):
            continue
        else:
            status = "moved" if at else "not_found"
        findings.append(Finding(c, status, at, len(lines)))
    return findings
