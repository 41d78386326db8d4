"""Every archive the README or docs/ cite exists: in results/, or, for one since replaced, in the git
commit the same sentence names ("kept in git at <commit>")."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ARCHIVE = re.compile(r"results/([a-z0-9_]+)/(\d{8}T\d{6}Z-[0-9a-z-]+)")
KEPT_IN_GIT = re.compile(r"kept in git at ([0-9a-f]{7,40})")


def citations(text: str) -> list[tuple[str, str | None]]:
    """(archive path, the commit that keeps it or None) for each archive cited; a commit named in
    the same paragraph keeps the archives cited there."""
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        kept = KEPT_IN_GIT.search(paragraph)
        for m in ARCHIVE.finditer(paragraph):
            found.append((f"results/{m[1]}/{m[2]}", kept[1] if kept else None))
    return found


def in_git(commit: str, path: str) -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}:{path}/verdict.json"],
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_cited_archive_exists_in_results_or_in_the_commit_named(doc: Path) -> None:
    missing = [path for path, commit in citations(doc.read_text())
               if not (ROOT / path).is_dir() and not (commit and in_git(commit, path))]
    assert not missing, f"{doc.name} cites archives that are not there: {missing}"


def test_the_citation_reader_ties_a_commit_to_its_paragraph_only() -> None:
    text = ("seen in `results/a_b/20261130T053204Z-60d4da03`, kept in git at 31b7ff4.\n\n"
            "and `results/c/20261203T082951Z-84d8db29`.")
    assert citations(text) == [("results/a_b/20261130T053204Z-60d4da03", "31b7ff4"),
                               ("results/c/20261203T082951Z-84d8db29", None)]
