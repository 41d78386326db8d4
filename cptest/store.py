"""The results store: an archive's layout, its name, its phases, its manifest and their verification.

This is the only module that knows where an archive's files are. The runner, the fault injector,
the checks, the report and the pipeline all ask a `Layout` for a path; the probe and the reference
engine, which run inside the engine's processes, ask `rank_file_name` for the name of the file they
write into the directory they are given.

```
results/<scenario>/<UTC YYYYmmddTHHMMSSZ>-<first 8 hex of the scenario sha256>/
  scenario.cps               the scenario as written (its `extends` files beside it, or under includes/)
  plan.json                  the effective configuration (cptest.plan.Plan)
  manifest.json              phase, pins, environment, sha256 of every other file
  evidence/<role>/rank<w>.jsonl   probe records of world rank w (role: main or baseline)
  evidence/<role>/runner.jsonl    runner records: requests, processes, GPU memory, lifecycle
  evidence/cptest.jsonl      cptest's own outline log of the run
  logs/<role>-node<k>.log    the engine's stdout and stderr, per node
  logs/cptest-crash.txt      only when cptest itself crashed during the run: its traceback
  verdict.json, report.md, junit.xml   written last
```

Phases (Jepsen's store): `begin` writes the scenario, the plan and a first manifest before anything
runs; evidence is appended as it arrives; `finish` writes the verdict, the report and the final
manifest with the sha256 of every other file. A crash in between keeps the evidence, and
`cptest check DIR` redoes only the last phase.

Depends on nothing of cptest above `errors`: it stores the texts and JSON values it is given (the
pipeline renders them), so it can never judge or render anything itself.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cptest.errors import Problem, Span

MANIFEST_VERSION = 1
ROLES = ("main", "baseline", "control")

SCENARIO = "scenario.cps"
PLAN = "plan.json"
MANIFEST = "manifest.json"
VERDICT = "verdict.json"
REPORT = "report.md"
JUNIT = "junit.xml"
RUNNER_FILE = "runner.jsonl"

_RANK_FILE = re.compile(r"^rank(\d+)\.jsonl$")


def rank_file_name(world: int) -> str:
    """The name of world rank `world`'s probe file in its role's evidence directory."""
    return f"rank{world}.jsonl"


@dataclass(frozen=True)
class Layout:
    """The paths of one archive. Pure: asking for a path never touches the disk."""

    root: Path

    @property
    def scenario(self) -> Path:
        return self.root / SCENARIO

    @property
    def plan(self) -> Path:
        return self.root / PLAN

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def verdict(self) -> Path:
        return self.root / VERDICT

    @property
    def report(self) -> Path:
        return self.root / REPORT

    @property
    def junit(self) -> Path:
        return self.root / JUNIT

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def evidence_dir(self) -> Path:
        return self.root / "evidence"

    @property
    def cptest_log(self) -> Path:
        """cptest's own outline log of the run (JSON lines)."""
        return self.evidence_dir / "cptest.jsonl"

    def role_dir(self, role: str) -> Path:
        """Where a server's evidence goes: the probe of each of its ranks writes here too."""
        return self.evidence_dir / role

    def rank_file(self, role: str, world: int) -> Path:
        return self.role_dir(role) / rank_file_name(world)

    def runner_file(self, role: str) -> Path:
        return self.role_dir(role) / RUNNER_FILE

    def log(self, role: str, node: int) -> Path:
        return self.logs_dir / f"{role}-node{node}.log"

    def relative(self, path: Path) -> str:
        """`path` as the archive names it (`evidence/main/rank0.jsonl`), for messages and manifests."""
        return path.relative_to(self.root).as_posix()

    def rank_files(self, role: str) -> dict[int, Path]:
        """The probe files present for `role`, by world rank (reads the directory)."""
        d = self.role_dir(role)
        out = {}
        if d.is_dir():
            for p in sorted(d.iterdir()):
                m = _RANK_FILE.match(p.name)
                if m:
                    out[int(m.group(1))] = p
        return dict(sorted(out.items()))

    def make_dirs(self, roles: Iterable[str]) -> None:
        """Create `logs/` and the evidence directory of each role (idempotent)."""
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        for role in roles:
            self.role_dir(role).mkdir(parents=True, exist_ok=True)


def archives_under(root: Path, *, side_runs: bool = False) -> list[Path]:
    """Every archive (a folder with verdict.json) under `root`, sorted, leaving out side runs unless
    `side_runs`: a folder whose name starts with `_` below `root` holds raw runs kept as evidence,
    not published archives (docs/decisions.md D14). `root` itself may be such a folder."""
    out = []
    for verdict in root.rglob(VERDICT):
        archive = verdict.parent
        if side_runs or not any(part.startswith("_") for part in archive.relative_to(root).parts):
            out.append(archive)
    return sorted(set(out))


def archive_dir(results_root: Path | str, scenario: str, scenario_sha256: str, now: datetime) -> Path:
    """`<results_root>/<scenario>/<UTC time>-<sha[:8]>`. Pure; `now` must be timezone-aware."""
    if now.tzinfo is None:
        raise ValueError("archive_dir needs a timezone-aware time (datetime.now(UTC))")
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path(results_root) / scenario / f"{stamp}-{scenario_sha256[:8]}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every regular file under `root` except the manifest, by POSIX relative path, sorted."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not (p.parent == root and p.name == MANIFEST):
            out[p.relative_to(root).as_posix()] = sha256_file(p)
    return dict(sorted(out.items()))


def read_manifest(layout: Layout) -> dict[str, Any] | None:
    """The manifest as written, or None when there is none or it is not JSON."""
    try:
        data = json.loads(layout.manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_finished(layout: Layout) -> bool:
    """Whether the archive reached its last phase (its manifest says `finished`)."""
    manifest = read_manifest(layout)
    return manifest is not None and manifest.get("phase") == "finished"


def _write_manifest(layout: Layout, phase: str, scenario: str, pins: Mapping[str, Any],
                    environment: Mapping[str, Any]) -> dict[str, Any]:
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "phase": phase,
        "scenario": scenario,
        "pins": dict(pins),
        "environment": dict(environment),
        "files": file_hashes(layout.root),
    }
    layout.manifest.write_text(json.dumps(manifest, sort_keys=True, indent=2) + "\n", encoding="utf-8")
    return manifest


def begin(
    layout: Layout,
    *,
    scenario: str,
    scenario_text: str,
    plan_json: str,
    pins: Mapping[str, Any],
    environment: Mapping[str, Any],
    roles: Iterable[str] = ("main",),
    includes: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Phase 0: create the archive (it must not exist), write scenario.cps, its included files
    (`includes` maps a name relative to the archive to its text), plan.json and a first manifest.
    Returns the manifest. Raises FileExistsError when the directory exists, ValueError when an
    include would land outside the archive."""
    layout.root.mkdir(parents=True, exist_ok=False)
    layout.make_dirs(roles)
    layout.scenario.write_text(scenario_text, encoding="utf-8")
    root = layout.root.resolve()
    for name, text in (includes or {}).items():
        target = layout.root / name
        if not target.resolve().is_relative_to(root):
            raise ValueError(f"include {name!r} would be written outside the archive")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    layout.plan.write_text(plan_json if plan_json.endswith("\n") else plan_json + "\n", encoding="utf-8")
    return _write_manifest(layout, "begun", scenario, pins, environment)


def finish(
    layout: Layout,
    *,
    verdict_json: str,
    report_md: str,
    junit_xml: str,
    scenario: str,
    pins: Mapping[str, Any],
) -> dict[str, Any]:
    """Last phase: verdict.json, report.md, junit.xml, then the final manifest with the sha256 of
    every other file. The environment is carried over from the first manifest (it describes the
    machine that gathered the evidence, not the one that finishes the archive), and so are the pins
    when the first manifest has them (the run adds what it measured, such as the model's tree hash)."""
    layout.verdict.write_text(verdict_json, encoding="utf-8")
    layout.report.write_text(report_md, encoding="utf-8")
    layout.junit.write_text(junit_xml, encoding="utf-8")
    begun = read_manifest(layout) or {}
    environment = begun.get("environment") if isinstance(begun.get("environment"), dict) else {}
    if isinstance(begun.get("pins"), dict):
        pins = begun["pins"]  # what the run pinned (the model's tree hash it measured), not only the plan's
    return _write_manifest(layout, "finished", scenario, pins, environment or {})


def verify(root: Path) -> list[Problem]:
    """Problems with the archive at `root` against its manifest: a missing, changed or extra file."""
    layout = Layout(root)
    mpath = layout.manifest
    if not mpath.is_file():
        return [Problem(Span(str(mpath), 1, 1), "archive has no manifest.json",
                        hint="was the run interrupted before `begin`?")]
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
        listed: dict[str, str] = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        return [Problem(Span(str(mpath), 1, 1), f"unreadable manifest: {e}")]
    problems = []
    if manifest.get("phase") != "finished":
        problems.append(Problem(
            Span(str(mpath), 1, 1),
            f"manifest is from the start of the run (phase {manifest.get('phase')!r}); evidence written "
            "later is not covered",
            hint="run `cptest check DIR` to finish the archive",
        ))  # fmt: skip
    actual = file_hashes(root)
    for name in sorted(set(listed) | set(actual)):
        where = Span(str(root / name), 1, 1)
        if name not in actual:
            problems.append(Problem(where, f"{name} is listed in the manifest but missing"))
        elif name not in listed:
            problems.append(Problem(where, f"{name} is not in the manifest (added after the run?)"))
        elif listed[name] != actual[name]:
            problems.append(Problem(where, f"{name} changed since the run", expected=listed[name][:16],
                                    found=actual[name][:16]))
    return problems
