"""crosscheck.py: the co-located qualification run again with one rank per GPU, verdict by verdict.

    python tools/device/crosscheck.py list [--results DIR] [--scenarios DIR] [--out FILE]
    python tools/device/crosscheck.py compare PHYSICAL_RESULTS [--against DIR] [--json]

`list` prints the scenario files to run physically: every scenario whose newest published archive
(`<results>/<scenario>/<run>/`) is co-located with a DCP or attention-CP degree of 2 on its main
server, DCP2 first, then PCP2 (a scenario with both is a DCP2 one). A scenario's file is the one
under `--scenarios` that declares `scenario <name> {`; the paths are relative to that folder's
parent (the checkout, for the default). The list is also written to `--out` (default
tools/device/crosscheck.txt, `-` for none) under a `#` header, so that
`$(grep -v '^#' tools/device/crosscheck.txt)` gives the suite its scenarios. A listed file that is
no longer, by value, the scenario its co-located archive ran is warned of: `compare` would find no
twin for it until it is rerun co-located. Exit 1 when a scenario's file is missing or ambiguous.

`compare` finds, for the newest physical archive of each scenario under PHYSICAL_RESULTS (a results
folder as `cptest suite --results` writes it), its co-located twin: the newest co-located archive of
the same scenario under `--against` (default: the checkout's results/). Per scenario it sets each
checker's standing status (the newest re-analysis's verdict, else the seal's) of the twin beside
the physical one, and lists the evidence differences `cptest diff` counts (its verdict rows are left
out: they compare the seals' verdicts, which a re-analysis may have replaced). Speed and memory
figures are not comparable across placements; the diff says so and never counts them.

Exit 0 when every compared scenario agrees, 1 on any difference, 2 on bad input (the message names
the path), 3 when nothing could be compared (no physical archive, or none with a twin).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cptest.analyses import current_verdict_file
from cptest.checks.diff import DiffEntry, DiffRefused, checker_statuses, diff
from cptest.checks.load import load_plan
from cptest.errors import CptestError
from cptest.lang.parse import parse_file
from cptest.plan.build import canonical_sha256
from cptest.plan.model import Plan
from cptest.store import archives_under
from cptest.verdict import read_verdict

REPO = Path(__file__).resolve().parents[2]
LIST_FILE = REPO / "tools" / "device" / "crosscheck.txt"
GROUPS = ("DCP2", "PCP2")
"""The groups of the list, in its order."""


class BadInput(Exception):
    """Exit 2: a path that is not what the command needs; the message names it."""


# ---------------------------------------------------------------- archives
def scenario_archives(results: Path) -> dict[str, list[Path]]:
    """Scenario name -> its archives (`<results>/<scenario>/<run>/`), oldest first: archive names
    start with the UTC time they were made. Side runs (`_*`) and re-analyses are not archives."""
    if not results.is_dir():
        raise BadInput(f"{results} is not a folder (a results folder holds <scenario>/<run>/ archives)")
    found: dict[str, list[Path]] = defaultdict(list)
    for archive in archives_under(results):
        if len(archive.relative_to(results).parts) == 2:
            found[archive.parent.name].append(archive)
    if not found:
        raise BadInput(f"{results} is not a results folder: no <scenario>/<run>/verdict.json below it")
    return {name: sorted(runs, key=lambda p: p.name) for name, runs in sorted(found.items())}


def plan_of(archive: Path) -> Plan:
    try:
        return load_plan(archive)
    except CptestError as e:
        raise BadInput(f"{archive}: {str(e).strip().splitlines()[0]}") from None


def cp_group(plan: Plan) -> str | None:
    """`DCP2` or `PCP2` for a co-located plan whose main server has that degree 2; None otherwise."""
    if plan.placement != "colocated":
        return None
    degrees = plan.main.topology
    if degrees.dcp == 2:
        return "DCP2"
    if degrees.attn_cp == 2:
        return "PCP2"
    return None


# ---------------------------------------------------------------- list
SCENARIO_LINE = re.compile(r'^\s*scenario\s+"?([A-Za-z0-9_.\-]+)"?\s*\{', re.MULTILINE)


def scenario_files(scenarios: Path) -> dict[str, list[Path]]:
    """Scenario name -> the .cps files under `scenarios` that declare it."""
    out: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(scenarios.rglob("*.cps")):
        for name in SCENARIO_LINE.findall(path.read_text(encoding="utf-8", errors="replace")):
            out[name].append(path)
    return out


@dataclass
class CrossList:
    files: list[tuple[str, Path]] = field(default_factory=list)
    """(group, scenario file) in the list's order."""
    problems: list[str] = field(default_factory=list)
    """Scenarios to run whose file is missing or declared twice."""
    stale: list[str] = field(default_factory=list)
    """Listed files that are no longer the text their co-located archive ran: `compare` finds no
    twin for them (the diff refuses two texts of one scenario) until they are rerun co-located."""


def cross_list(results: Path, scenarios: Path) -> CrossList:
    """The scenario files to run physically (module docstring), DCP2 first, then PCP2, by name."""
    if not scenarios.is_dir():
        raise BadInput(f"{scenarios} is not a folder of scenario files")
    wanted: list[tuple[int, str, str, Plan]] = []
    for name, runs in scenario_archives(results).items():
        plan = plan_of(runs[-1])
        group = cp_group(plan)
        if group is not None:
            wanted.append((GROUPS.index(group), name, group, plan))
    files = scenario_files(scenarios)
    out = CrossList()
    for _, name, group, plan in sorted(wanted, key=lambda w: w[:2]):
        found = files.get(name, [])
        if len(found) == 1:
            out.files.append((group, found[0]))
            if not same_text(found[0], plan):
                out.stale.append(f"{name}: {found[0]} is not the scenario its archive in {results} ran "
                                 "(canonical sha256 differs, or it does not parse)")
        else:
            where = ", ".join(str(p) for p in found) or "none"
            out.problems.append(f"{name}: {len(found)} files under {scenarios} declare it ({where})")
    return out


def same_text(path: Path, plan: Plan) -> bool:
    """Whether the scenario file is, by value, the scenario the archive's plan was made from."""
    try:
        return canonical_sha256(parse_file(path)) == plan.pins.scenario_sha256
    except CptestError:
        return False


def list_text(listed: CrossList, base: Path, results: Path) -> str:
    """The list file: a `#` header, then one scenario path (relative to `base`) per line, each group
    under a `# DCP2` / `# PCP2` line."""
    lines = ["# The physical cross-check's scenarios: each one's newest published archive in",
             f"# {_shown(results, base)}/ is co-located with DCP 2 or attention-CP 2 (main server).",
             "# Generated by `python tools/device/crosscheck.py list`; DCP2 first, then PCP2."]
    group = None
    for g, path in listed.files:
        if g != group:
            lines.append(f"# {g}")
            group = g
        lines.append(_shown(path, base))
    return "\n".join(lines) + "\n"


def _shown(path: Path, base: Path) -> str:
    resolved, root = path.resolve(), base.resolve()
    return resolved.relative_to(root).as_posix() if resolved.is_relative_to(root) else str(path)


# ---------------------------------------------------------------- compare
@dataclass(frozen=True)
class CheckerRow:
    checker: str
    colocated: str | None
    physical: str | None

    @property
    def agree(self) -> bool:
        return self.colocated == self.physical


@dataclass
class Comparison:
    scenario: str
    physical: Path
    colocated: Path
    checkers: list[CheckerRow]
    evidence: list[DiffEntry]
    """The evidence differences `cptest diff` counts (a: co-located, b: physical)."""

    @property
    def agree(self) -> bool:
        return all(r.agree for r in self.checkers) and not self.evidence


@dataclass
class CrossReport:
    compared: list[Comparison] = field(default_factory=list)
    no_twin: list[tuple[str, Path, str]] = field(default_factory=list)
    """(scenario, physical archive, why)."""

    @property
    def contracts(self) -> list[CheckerRow]:
        return [r for c in self.compared for r in c.checkers if r.checker != "scenario"]

    def differences(self) -> list[dict[str, Any]]:
        """Every difference, named: scenario, checker (or evidence item), co-located / physical."""
        out: list[dict[str, Any]] = []
        for c in self.compared:
            out += [{"scenario": c.scenario, "checker": r.checker, "colocated": r.colocated,
                     "physical": r.physical} for r in c.checkers if not r.agree]  # fmt: skip
            out += [{"scenario": c.scenario, "evidence": e.what, "colocated": _cell(e.a),
                     "physical": _cell(e.b), "why": e.why} for e in c.evidence]  # fmt: skip
        return out

    @property
    def exit_code(self) -> int:
        if not self.compared:
            return 3
        return 0 if all(c.agree for c in self.compared) else 1


def standing_statuses(archive: Path) -> dict[str, str]:
    """Each checker's status in the verdict that stands: the newest re-analysis's, else the seal's."""
    try:
        return checker_statuses(read_verdict(current_verdict_file(archive)))
    except CptestError as e:
        raise BadInput(f"{archive}: {str(e).strip().splitlines()[0]}") from None


def newest_colocated(runs: Sequence[Path]) -> Path | None:
    return next((a for a in reversed(runs) if plan_of(a).placement == "colocated"), None)


def compare_one(scenario: str, physical: Path, twin: Path) -> Comparison:
    """The twin's standing statuses beside the physical archive's, and the evidence differences
    that count. Raises DiffRefused when the twin ran another text of the scenario."""
    report = diff(twin, physical)
    a, b = standing_statuses(twin), standing_statuses(physical)
    names = sorted(set(a) | set(b), key=lambda n: (n != "scenario", n))
    rows = [CheckerRow(n, a.get(n), b.get(n)) for n in names]
    evidence = [e for e in report.differences if e.subject != "verdict"]
    return Comparison(scenario, physical, twin, rows, evidence)


def cross_compare(physical_results: Path, against: Path) -> CrossReport:
    physical = {name: [a for a in runs if plan_of(a).placement == "physical"]
                for name, runs in scenario_archives(physical_results).items()}
    colocated = scenario_archives(against)
    report = CrossReport()
    for name, runs in physical.items():
        if not runs:
            continue
        twin = newest_colocated(colocated.get(name, []))
        if twin is None:
            report.no_twin.append((name, runs[-1], f"no co-located archive of {name} under {against}"))
            continue
        try:
            report.compared.append(compare_one(name, runs[-1], twin))
        except DiffRefused as e:
            report.no_twin.append((name, runs[-1], str(e).strip().splitlines()[0]))
    return report


def _cell(v: Any) -> str:
    text = "-" if v is None else str(v)
    return text if len(text) <= 40 else text[:39] + "…"


def render_markdown(report: CrossReport) -> str:
    lines = ["# Physical cross-check", "", "| scenario | checker | co-located | physical | |",
             "| --- | --- | --- | --- | --- |"]
    for c in report.compared:
        lines += [f"| {c.scenario} | {r.checker} | {_cell(r.colocated)} | {_cell(r.physical)} | "
                  f"{'agree' if r.agree else '**differ**'} |" for r in c.checkers]
    evidence = [(c, e) for c in report.compared for e in c.evidence]
    if evidence:
        lines += ["", "## Evidence differences that count (`cptest diff`, a co-located, b physical)", "",
                  "| scenario | what | co-located | physical | why |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {c.scenario} | {e.what} | {_cell(e.a)} | {_cell(e.b)} | {e.why} |" for c, e in evidence]
    contracts = report.contracts
    lines += ["", "## Summary", "",
              f"- scenarios compared: {len(report.compared)}",
              f"- contracts agreeing: {sum(r.agree for r in contracts)} of {len(contracts)}",
              f"- differences: {len(report.differences())}"]
    for d in report.differences():
        what = d.get("checker") or d.get("evidence")
        lines.append(f"  - {d['scenario']}, {what}: co-located {_cell(d['colocated'])}, physical "
                     f"{_cell(d['physical'])}")
    lines.append(f"- no twin: {len(report.no_twin)}")
    lines += [f"  - {name} ({physical}): {why}" for name, physical, why in report.no_twin]
    return "\n".join(lines)


def report_json(report: CrossReport) -> dict[str, Any]:
    contracts = report.contracts
    return {
        "compared": [{"scenario": c.scenario, "physical": str(c.physical), "colocated": str(c.colocated),
                      "agree": c.agree,
                      "checkers": [{"checker": r.checker, "colocated": r.colocated, "physical": r.physical,
                                    "agree": r.agree} for r in c.checkers],
                      "evidence_differences": [e.as_json() for e in c.evidence]}
                     for c in report.compared],
        "no_twin": [{"scenario": n, "physical": str(p), "why": why} for n, p, why in report.no_twin],
        "summary": {"scenarios_compared": len(report.compared), "contracts": len(contracts),
                    "contracts_agreeing": sum(r.agree for r in contracts),
                    "differences": report.differences(), "no_twin": [n for n, _, _ in report.no_twin]},
        "exit": report.exit_code,
    }  # fmt: skip


# ---------------------------------------------------------------- command line
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="crosscheck.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="the scenario files to run physically")
    ls.add_argument("--results", type=Path, default=REPO / "results")
    ls.add_argument("--scenarios", type=Path, default=REPO / "scenarios")
    ls.add_argument("--out", default=str(LIST_FILE), help="where to write the list (`-`: nowhere)")
    cmp = sub.add_parser("compare", help="physical archives against their co-located twins")
    cmp.add_argument("physical", type=Path, metavar="PHYSICAL_RESULTS")
    cmp.add_argument("--against", type=Path, default=REPO / "results")
    cmp.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            return _list(args.results, args.scenarios, args.out)
        report = cross_compare(args.physical, args.against)
    except BadInput as e:
        print(f"crosscheck.py {args.command}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report_json(report), indent=2) if args.json else render_markdown(report))
    if report.exit_code == 3:
        print(f"crosscheck.py compare: nothing compared: no physical archive under {args.physical} has a "
              f"co-located twin under {args.against}", file=sys.stderr)
    return report.exit_code


def _list(results: Path, scenarios: Path, out: str) -> int:
    listed = cross_list(results, scenarios)
    text = list_text(listed, scenarios.parent, results)
    for line in text.splitlines():
        if not line.startswith("#"):
            print(line)
    for problem in listed.problems:
        print(f"crosscheck.py list: {problem}", file=sys.stderr)
    for stale in listed.stale:
        print(f"crosscheck.py list: warning: {stale}; rerun it co-located before comparing", file=sys.stderr)
    if out != "-":
        Path(out).write_text(text, encoding="utf-8")
    return 1 if listed.problems else 0


if __name__ == "__main__":
    sys.exit(main())
