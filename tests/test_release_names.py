"""SGLang release knowledge lives in cptest/engines/sglang/ (SGLang knowledge is data, one table per
release): outside it, no module names a release. Code there asks the release table (`get_release`,
`KNOWN_RELEASES`, `PINNED_RELEASE`) and comments cite "the pinned release"; a name may appear only
where a user-facing default is printed, and each such place is listed in `ALLOWED` with its reason."""

from __future__ import annotations

import re
from pathlib import Path

from cptest.engines.sglang.releases import KNOWN_RELEASES

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cptest"
OWNER = PACKAGE / "engines" / "sglang"
SCANNED_SUFFIXES = {".py", ".j2", ".json", ".lark"}


def release_pattern(names: list[str]) -> re.Pattern[str]:
    """Each known release as written in text (`0.5.17`) or in an identifier (`RULES_0_5_17`), and
    any `sglang X.Y.Z`, so that a release the table does not know yet is caught too."""
    spelled = [re.escape(n).replace(r"\.", r"[._]") for n in names]
    return re.compile(r"(?<![\d.])(?:" + "|".join(spelled) + r")(?![\d])|(?i:\bsglang\W{0,3}v?\d+\.\d+\.\d+)")


PATTERN = release_pattern(list(KNOWN_RELEASES))

ALLOWED: dict[str, str] = {}
"""`path:stripped line` -> why that line may print a release name: only a user-facing default (a
help text or message that shows the user the release cptest uses when none is given). Every
default today comes from `PINNED_RELEASE` or `SUPPORT_RELEASE`, so nothing is listed."""


def release_lines(root: Path, owner: Path, pattern: re.Pattern[str] = PATTERN) -> dict[str, str]:
    """`path:line number` -> the stripped line, for every line outside `owner` that names a release."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.suffix not in SCANNED_SUFFIXES or path.is_relative_to(owner) or "__pycache__" in path.parts:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                found[f"{path.relative_to(root.parent)}:{n}"] = line.strip()
    return found


def test_no_module_outside_engines_sglang_names_a_release() -> None:
    lines = release_lines(PACKAGE, OWNER)
    keys = {where: f"{where.rsplit(':', 1)[0]}:{line}" for where, line in lines.items()}
    found = {where: line for where, line in lines.items() if keys[where] not in ALLOWED}
    assert not found, ("ask cptest.engines.sglang.releases (get_release, PINNED_RELEASE) or say "
                       f"\"the pinned release\" instead of naming one: {found}")
    assert set(ALLOWED) <= set(keys.values()), "an allowed line is gone: drop it from ALLOWED"


def test_the_scan_finds_each_spelling_and_spares_the_owner_and_other_numbers(tmp_path: Path) -> None:
    pkg, owner = tmp_path / "cptest", tmp_path / "cptest" / "engines" / "sglang"
    owner.mkdir(parents=True)
    (owner / "releases.py").write_text('NAME = "0.5.17"\n')
    (pkg / "a.py").write_text('# as 0.5.17 does\nTARGETS_0_5_17 = ()\nX = "0.5.170"\nHOST = "127.0.0.1"\n')
    (pkg / "b.j2").write_text("{{ x }} needs SGLang 0.6.1\ntorch 2.11.0, sglang_version\n")
    found = release_lines(pkg, owner, release_pattern(["0.5.17"]))
    assert found == {"cptest/a.py:1": "# as 0.5.17 does", "cptest/a.py:2": "TARGETS_0_5_17 = ()",
                     "cptest/b.j2:1": "{{ x }} needs SGLang 0.6.1"}
