"""SGLang source citations as data: one registry per release, and the `path:line` text that cites it.

Docs and code keep their citations readable, as `path:line` text (a path ending in `.py`, a colon,
then a line, a range `a-b`, or several after commas); each such range must be an entry of a release's
registry (`citations_<release>.toml` beside this module), which names the file, the lines and an
anchor: a symbol or short excerpt that must occur within those lines. `cptest sources check` reads
the release's wheel and says which anchors moved; `tests/engines/sglang/test_citations.py` fails when
a doc or module cites a range no registry holds. This module is pure: it reads its own data and the
texts it is given, never a wheel.

A registry file holds the release's pinned wheel (`[wheel]`: requirement, file, sha256) and one
`[citations.<key>]` table per citation (`file`, `lines` as "a-b" or "a", `anchor`). `file` is
relative to `sglang/srt/` in the wheel unless it starts with `sglang/` (then the wheel's root).
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cptest.engines.sglang.releases import KNOWN_RELEASES, PINNED_RELEASE, get_release

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]

RELEASES = tuple(KNOWN_RELEASES)
"""Every release with a table has a citation registry."""
PINNED = PINNED_RELEASE.name
"""The release the GPU machine runs: what `cptest sources check` reads unless told."""

CITING = ("README.md", "docs/*.md", "scenarios/**/*.cps", "scenarios/**/*.md", "cptest/**/*.py",
          "tests/**/*.py", "tools/**/*.py", "tools/**/*.md", "tools/**/*.sh", "benchmarks/*.py")
"""The docs, scenarios and code (globs relative to the checkout) whose `path:line` text must be
registered: every place a reader meets a claim about SGLang's source, a scenario's comment included."""
NOT_CITING = ("tests/engines/sglang/test_citations.py", "tests/probe/test_plugin.py",
              "tests/report/test_support.py")
"""Tests whose `path:line` texts are made-up inputs of the reader and the checker, not claims."""

_CITE = re.compile(
    r"(?P<path>(?:[A-Za-z_][\w.]*/)*[A-Za-z_]\w*\.py):[ \t]*\n?[ \t]*"
    r"(?P<ranges>\d+(?:-\d+)?(?:,[ \t]*\n?[ \t]*\d+(?:-\d+)?(?![\w.]))*)")
"""A path ending in `.py`, a colon, then a line, a range, or several after commas (a doc may wrap
after the colon or a comma).
A range list ends at a number followed by a word or dot, which is prose, not a line."""

_NOT_SGLANG = ("cptest/", "tests/", "tools/", "benchmarks/", "scenarios/")


@dataclass(frozen=True)
class WheelPin:
    """The wheel a release's citations are read against."""

    requirement: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class Citation:
    key: str
    release: str
    file: str
    """Relative to `sglang/srt/` unless it starts with `sglang/`."""
    start: int
    end: int
    anchor: str
    """Text that must occur on one of the lines `start`..`end` (inclusive)."""
    also: tuple[str, ...] = ()
    """Other texts, any of which anchors the citation as well (a flag declared either way)."""

    @property
    def anchors(self) -> tuple[str, ...]:
        return (self.anchor, *self.also)

    @property
    def wheel_path(self) -> str:
        """The file's path inside the wheel."""
        return self.file if self.file.startswith("sglang/") else f"sglang/srt/{self.file}"

    @property
    def where(self) -> str:
        return f"{self.file}:{self.start}" + (f"-{self.end}" if self.end != self.start else "")


@dataclass(frozen=True)
class Registry:
    release: str
    wheel: WheelPin
    citations: tuple[Citation, ...]

    def get(self, key: str) -> Citation:
        found = [c for c in self.citations if c.key == key]
        if not found:
            raise KeyError(f"no citation {key!r} in release {self.release}")
        return found[0]


@dataclass(frozen=True)
class Reference:
    """One range cited in a doc or module: `path` as written, the lines, and where it is written."""

    path: str
    start: int
    end: int
    source: str
    """`file:line` of the text that cites it, relative to the checkout."""


def registry_file(release: str) -> Path:
    return HERE / f"citations_{release.replace('.', '_')}.toml"


@lru_cache(maxsize=4)
def load(release: str = PINNED) -> Registry:
    """The release's registry; raises KeyError naming the known releases for one that has none."""
    if release not in RELEASES:
        raise KeyError(f"no citation registry for SGLang {release} (known: {', '.join(RELEASES)})")
    return parse(registry_file(release).read_text(encoding="utf-8"), release)


def parse(text: str, release: str) -> Registry:
    """A registry from its TOML text; raises ValueError for a malformed entry, naming its key."""
    data = tomllib.loads(text)
    wheel = data["wheel"]
    pin = WheelPin(wheel["requirement"], wheel["file"], wheel["sha256"])
    citations = []
    for key, entry in data.get("citations", {}).items():
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", str(entry.get("lines", "")))
        anchor = entry.get("anchor", "")
        if not m or not entry.get("file") or not anchor.strip() or "\n" in anchor:
            raise ValueError(f"citation {key!r}: needs file, lines \"a-b\" and a one-line anchor")
        start, end = int(m[1]), int(m[2] or m[1])
        if end < start:
            raise ValueError(f"citation {key!r}: lines {entry['lines']} run backwards")
        citations.append(Citation(key, release, entry["file"], start, end, anchor))
    return Registry(release, pin, tuple(citations))


def references(text: str, source: str) -> list[Reference]:
    """Every SGLang `path:line` range in `text`; `source` names the file, each reference gets its line."""
    found = []
    for m in _CITE.finditer(text):
        path = m["path"]
        if path.startswith(_NOT_SGLANG):
            continue
        line = text.count("\n", 0, m.start()) + 1
        for part in re.split(r",\s*", m["ranges"]):
            a, _, b = part.partition("-")
            found.append(Reference(path, int(a), int(b or a), f"{source}:{line}"))
    return found


def cites(ref: Reference, citation: Citation) -> bool:
    """Whether `ref` names `citation`: the same lines of a file whose path ends with what is written."""
    written = ref.path.removeprefix("sglang/").removeprefix("srt/")
    full = citation.file.removeprefix("sglang/srt/")
    return (ref.start, ref.end) == (citation.start, citation.end) and (
        full == written or full.endswith("/" + written) or citation.wheel_path == ref.path)


def citing_files(root: Path = ROOT) -> list[Path]:
    skip = {root / name for name in NOT_CITING}
    return sorted({p for pattern in CITING for p in root.glob(pattern) if p.is_file() and p not in skip})


def scan(root: Path = ROOT) -> list[Reference]:
    """Every SGLang range cited by the docs and code of the checkout at `root`."""
    return [ref for path in citing_files(root)
            for ref in references(path.read_text(encoding="utf-8"), path.relative_to(root).as_posix())]


def cited_by(citation: Citation, refs: list[Reference]) -> list[str]:
    """Where `citation` is cited (`file:line`), in the order of `refs`."""
    return [r.source for r in refs if cites(r, citation)]


def unregistered(refs: list[Reference], registries: list[Registry]) -> list[Reference]:
    """The references no registry entry matches."""
    every = [c for reg in registries for c in reg.citations]
    return [r for r in refs if not any(cites(r, c) for c in every)]


def flags_file(release: str) -> Path:
    return HERE / get_release(release).flags_file


@lru_cache(maxsize=4)
def flag_declarations(release: str = PINNED) -> tuple[Citation, ...]:
    """Where the release's flag table (`flags-<release>.json`) says each CLI flag is declared, as
    citations: `tools/extract_sglang_flags.py` located each one at its `ServerArgs` field
    (`<dest>: A[`) or at a `"--flag"` literal in an `add_argument` call, so either anchors it.
    Keys are `flag:<name>`; a flag without a located source is not a citation."""
    found = []
    for name, entry in json.loads(flags_file(release).read_text(encoding="utf-8"))["flags"].items():
        path, _, line = (entry.get("source") or "").rpartition(":")
        if not path or not line.isdigit():
            continue
        literals = tuple(f'"{option}"' for option in (name, *entry["aliases"]))
        found.append(Citation(f"flag:{name}", release, path, int(line), int(line),
                              f"{entry['dest']}: A[", literals))
    return tuple(found)


def flag_entry_line(release: str, key: str) -> str:
    """`file:line` of a flag declaration's entry in the release's flag table (what cites it)."""
    name = key.removeprefix("flag:")
    text = flags_file(release).read_text(encoding="utf-8")
    at = text.find(f'"{name}": {{')
    line = text.count("\n", 0, at) + 1 if at >= 0 else 1
    return f"{flags_file(release).relative_to(ROOT).as_posix()}:{line}"
