"""Code says why in the present tense: no decision ids, issue numbers or run numbers in cptest/
(docs/decisions.md D87). A reader is pointed to the user docs instead."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIARY = re.compile(r"\b(D\d{1,3}|issue \d+|session \d+|run ?\d+)\b")


def diary_lines(text: str) -> list[tuple[int, str]]:
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if DIARY.search(line)]


def test_no_module_of_cptest_names_a_decision_an_issue_or_a_run() -> None:
    found = {str(p.relative_to(ROOT)): hits for p in sorted((ROOT / "cptest").rglob("*.py"))
             if (hits := diary_lines(p.read_text(encoding="utf-8")))}
    assert not found, f"say why instead of naming a decision, issue or run: {found}"


def test_the_pattern_catches_each_kind_and_spares_ordinary_words() -> None:
    caught = ["# as D58 says", "(issue 14)", "results/_measure run16", "run12's figures", "session 18"]
    assert all(diary_lines(c) for c in caught)
    assert not diary_lines("# a dcp2 run on TP2; D-type; issue the request; 3D tensor; running 4 ranks")
