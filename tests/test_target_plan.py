"""docs/target-plan.md says only what the evidence shows (docs/decisions.md D62).

Its claims are lines of two forms: `` `archive results/<scenario>/<run>: <contract> = <VERDICT>` ``
(the archive exists, `cptest check` reproduces its verdict.json from the evidence, and the contract
has that status) and `` `requires scenarios/qualification/<file>.cps: <contract>, ...` `` (the
requirement scenario exists, parses and declares those contracts). CPU only: `cptest check` reads
the archives, it runs nothing. When the archives are re-made, a claim they contradict fails here.
Beyond the claims: a proposal whose archives show a contract failing or unjudged is titled
conditional; what is ruled out by the source names a rule of the pinned release; what is not decided
has a scenario and no published archive.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cptest.analyses import current_verdict_file
from cptest.engines.sglang.cells import CELL_RULES
from cptest.engines.sglang.releases import PINNED_RELEASE
from cptest.lang import parse_file
from cptest.pipeline import check_archive
from cptest.verdict import merge

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "target-plan.md"

ARCHIVE = re.compile(r"`archive (results/[^:`\s]+): ([a-z_]+) = ([^`]+)`")
REQUIRES = re.compile(r"`requires (scenarios/qualification/[^:`\s]+\.cps): ([a-z_, ]+)`")
MARK = {"pass": "PASS", "fail": "FAIL", "unknown": "UNKNOWN"}


def _text() -> str:
    return DOC.read_text(encoding="utf-8")


def claims(text: str) -> list[tuple[str, str, str]]:
    return [(a, c, v.strip()) for a, c, v in ARCHIVE.findall(text)]


def requirements(text: str) -> list[tuple[str, list[str]]]:
    return [(p, [c.strip() for c in cs.split(",")]) for p, cs in REQUIRES.findall(text)]


def sections(text: str, heading: str) -> dict[str, str]:
    """`### ` subsections of the `## heading` section, by title."""
    part = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return {block.split("\n", 1)[0]: block for block in part.split("\n### ")[1:]}


def by_checker(verdicts: list[dict[str, object]]) -> dict[str, str]:
    """Each checker's status as `cptest matrix` shows it: the worst of its entries, `pass (no-go seen)`
    for a declared violation observed."""
    out: dict[str, str] = {}
    for v in verdicts:
        checker, status = str(v["checker"]), str(v["status"])
        out[checker] = status if checker not in out else merge([out[checker], status])
        if v.get("expect_violation") and status == "pass":
            out[checker] = "pass (no-go seen)"
    return {k: MARK.get(s, s) for k, s in out.items()}


def statuses(archive: Path) -> dict[str, str]:
    """The statuses `cptest check` recomputes from the archive's evidence (each checker's, and
    `verdict`, the scenario's), which must be those its current verdict holds (verdict.json, or the
    newest re-analysis `cptest check --write` put beside the seal): a re-judging that flips
    a status is caught here; figures a newer checker adds are not statuses. Raises IntegrityError for
    a plan the archived scenario does not compile to, as `cptest check` exits 3."""
    recheck = check_archive(archive)
    fresh = json.loads(recheck.verdict.to_json())
    stored = json.loads(current_verdict_file(archive).read_text(encoding="utf-8"))
    got = {**by_checker(fresh["verdicts"]), "verdict": MARK[fresh["status"]]}
    kept = {**by_checker(stored["verdicts"]), "verdict": MARK[stored["status"]]}
    assert got == kept, f"{archive}: cptest check gives {got}, verdict.json holds {kept}"
    return got


def test_the_plan_has_claims_of_both_kinds():
    text = _text()
    assert len(claims(text)) >= 10 and len(requirements(text)) >= 6


@pytest.mark.parametrize("archive", sorted({a for a, _, _ in claims(_text())}))
def test_every_cited_archive_exists_and_cptest_check_reproduces_what_the_plan_claims(archive: str):
    path = ROOT / archive
    assert (path / "verdict.json").is_file(), f"{archive} is cited by docs/target-plan.md and does not exist"
    got = statuses(path)
    claimed = {(c, v) for a, c, v in claims(_text()) if a == archive}
    wrong = [f"{c}: the plan says {v}, cptest check says {got.get(c, 'not judged')}"
             for c, v in sorted(claimed) if got.get(c) != v]
    assert wrong == [], f"{archive}: " + "; ".join(wrong)


@pytest.mark.parametrize("path,contracts", requirements(_text()),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_every_requirement_is_a_qualification_scenario_that_declares_its_contracts(path: str,
                                                                                   contracts: list[str]):
    scenario = parse_file(ROOT / path)
    declared = {name for name, _ in scenario.expect.entries()}
    assert set(contracts) <= declared, f"{path} does not declare {sorted(set(contracts) - declared)}"
    assert scenario.engine.kind == "sglang"


def test_every_no_go_names_an_archive_and_every_combination_that_proceeds_names_requirements():
    text = _text()
    no_go, proceeds = sections(text, "No-go"), sections(text, "Proceeds")
    assert no_go and proceeds
    for title, block in no_go.items():
        assert claims(block), f"no-go {title!r} cites no archive"
        blocker = r": blocked by (the model|the mode|the backend|the KV-head regime|SGLang's reporting)"
        assert re.search(blocker, title), title
    for title, block in proceeds.items():
        assert requirements(block), f"{title!r} proceeds without a requirement scenario"
        for kind in ("Attention topology", "FFN row contract", "Capacity-group contract",
                     "Generation contract"):
            assert f"**{kind}**" in block, f"{title!r} does not state its {kind}"


def test_a_wrong_claim_would_be_caught():
    # The check can fail: a claim the evidence contradicts differs from what check recomputes.
    archive = ROOT / "results/dcp2_llama_kv1_eager/20261203T081109Z-3938cb53"
    got = statuses(archive)
    assert got["capacity"] == "FAIL" and got["rows"] == "PASS"
    assert ARCHIVE.findall(f"`archive {archive.relative_to(ROOT)}: capacity = PASS`") == [
        (str(archive.relative_to(ROOT)), "capacity", "PASS")]


def test_a_proposal_with_an_unmet_contract_is_labelled_conditional():
    # A combination whose archives show a contract failing or not judged does not simply proceed:
    # it proceeds only once that condition is met, and its title says so.
    for title, block in sections(_text(), "Proceeds").items():
        unmet = sorted({f"{c} = {v}" for _, c, v in claims(block) if v in ("FAIL", "UNKNOWN")})
        if unmet:
            assert "conditional on" in title, f"{title!r} proceeds although its archives show {unmet}"


def test_every_combination_ruled_out_by_the_source_names_a_rule_of_the_release():
    part = _text().split("\n## Ruled out by the source, no archive\n", 1)[1].split("\n## ", 1)[0]
    bullets = [b for b in re.split(r"\n- ", part)[1:]]
    assert bullets
    known = {r.code for r in CELL_RULES[PINNED_RELEASE.name]} | set(PINNED_RELEASE.rules)
    for bullet in bullets:
        named = set(re.findall(r"`([a-z0-9_]+)`", bullet))
        assert named & known, f"ruled out without a rule of {PINNED_RELEASE.name}: {bullet[:80]!r}"


def test_what_is_not_decided_has_a_scenario_and_no_published_archive():
    # A candidate whose scenario has been run and published is decided: the plan must say how.
    part = _text().split("\n## Not decided: no evidence yet\n", 1)[1].split("\n## ", 1)[0]
    paths = re.findall(r"`(scenarios/[^`]+\.cps)`", part)
    assert paths
    for path in paths:
        name = parse_file(ROOT / path).name
        published = sorted((ROOT / "results" / name).glob("*/verdict.json"))
        assert not published, f"{path} is 'not decided' but {published[0].parent} is published"
