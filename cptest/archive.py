"""The results archive: naming, phased writing, the manifest, verification and diffs.

Layout (the contract between run, checks and archive):
`results/<scenario>/<UTC YYYYmmddTHHMMSSZ>-<first 8 hex of scenario sha256>/` holding `scenario.cps`,
`plan.json`, `manifest.json`, `verdict.json`, `report.md`, `junit.xml`, `logs/<role>-node<k>.log`,
`evidence/<role>/rank<world>.jsonl`, `evidence/<role>/runner.jsonl`, `evidence/cptest.jsonl`.

Phases (Jepsen's store, style.md rule 10): `begin` writes the scenario, the plan and a first
manifest before anything runs; the runner appends evidence as it arrives; `finish` writes the
verdict, the report and the final manifest with the sha256 of every other file. A crash in between
keeps the evidence, and `cptest check DIR` redoes only the last phase.

`archive_dir`, `verify` and `diff` are pure (paths and contents in, values out);
`collect_environment` is the only function here that runs programs (argv only, short timeouts).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cptest import __version__
from cptest.checks.verdict import ScenarioVerdict
from cptest.errors import Problem, Span
from cptest.plan_model import Plan

MANIFEST_VERSION = 1
MANIFEST = "manifest.json"
TOOL_TIMEOUT_S = 20.0
"""nvidia-smi and the torch probe get this long; a hung driver must not hang `cptest run`."""


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


def file_hashes(dir: Path) -> dict[str, str]:
    """sha256 of every regular file under `dir` except the manifest, by POSIX relative path, sorted."""
    out = {}
    for p in sorted(dir.rglob("*")):
        if p.is_file() and not (p.parent == dir and p.name == MANIFEST):
            out[p.relative_to(dir).as_posix()] = sha256_file(p)
    return dict(sorted(out.items()))


def _write_manifest(dir: Path, phase: str, plan: Plan, environment: dict[str, Any]) -> dict[str, Any]:
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "phase": phase,
        "scenario": plan.scenario,
        "pins": plan.pins.model_dump(mode="json"),
        "environment": environment,
        "files": file_hashes(dir),
    }
    (dir / MANIFEST).write_text(json.dumps(manifest, sort_keys=True, indent=2) + "\n", encoding="utf-8")
    return manifest


def begin(
    dir: Path,
    scenario_text: str,
    plan: Plan,
    *,
    environment: dict[str, Any] | None = None,
    includes: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Phase 0: create `dir` (must not exist), write scenario.cps, plan.json, included files beside
    (`includes` maps a relative name to its text) and a first manifest. Returns the manifest.
    `environment` defaults to `collect_environment()`."""
    dir.mkdir(parents=True, exist_ok=False)
    (dir / "logs").mkdir()
    (dir / "evidence").mkdir()
    (dir / "scenario.cps").write_text(scenario_text, encoding="utf-8")
    for name, text in (includes or {}).items():
        target = dir / name
        if not target.resolve().is_relative_to(dir.resolve()):
            raise ValueError(f"include {name!r} would be written outside the archive")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    (dir / "plan.json").write_text(plan.model_dump_json(indent=2) + "\n", encoding="utf-8")
    env = collect_environment() if environment is None else environment
    return _write_manifest(dir, "begun", plan, env)


def finish(dir: Path, verdict: ScenarioVerdict, plan: Plan | None = None) -> dict[str, Any]:
    """Last phase: verdict.json (deterministic), report.md, junit.xml, then the final manifest with the
    sha256 of every other file (the environment is carried over from the first manifest)."""
    from cptest import report  # report imports checks; imported here to keep archive importable alone

    if plan is None:
        plan = Plan.model_validate_json((dir / "plan.json").read_text(encoding="utf-8"))
    (dir / "verdict.json").write_text(verdict.to_json(), encoding="utf-8")
    (dir / "report.md").write_text(report.render(verdict, plan), encoding="utf-8")
    (dir / "junit.xml").write_text(report.render_junit(verdict), encoding="utf-8")
    env: dict[str, Any] = {}
    if (dir / MANIFEST).is_file():
        env = json.loads((dir / MANIFEST).read_text(encoding="utf-8")).get("environment", {})
    return _write_manifest(dir, "finished", plan, env)


def verify(dir: Path) -> list[Problem]:
    """Problems with `dir` against its manifest: a missing, changed or extra file, each named."""
    mpath = dir / MANIFEST
    if not mpath.is_file():
        return [
            Problem(
                Span(str(mpath), 1, 1),
                "archive has no manifest.json",
                hint="was the run interrupted before `begin`?",
            )
        ]
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
        listed: dict[str, str] = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        return [Problem(Span(str(mpath), 1, 1), f"unreadable manifest: {e}")]
    problems = []
    if manifest.get("phase") != "finished":
        problems.append(
            Problem(
                Span(str(mpath), 1, 1),
                "manifest is from the start of the run (phase "
                f"{manifest.get('phase')!r}); evidence written later is not covered",
                hint="run `cptest check DIR` to finish the archive",
            )
        )
    actual = file_hashes(dir)
    for name in sorted(set(listed) | set(actual)):
        where = Span(str(dir / name), 1, 1)
        if name not in actual:
            problems.append(Problem(where, f"{name} is listed in the manifest but missing"))
        elif name not in listed:
            problems.append(Problem(where, f"{name} is not in the manifest (added after the run?)"))
        elif listed[name] != actual[name]:
            problems.append(
                Problem(
                    where,
                    f"{name} changed since the run",
                    expected=listed[name][:16],
                    found=actual[name][:16],
                )
            )
    return problems


# ---------------------------------------------------------------- environment
def _run_tool(argv: list[str]) -> tuple[str | None, str]:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except FileNotFoundError:
        return None, f"{argv[0]} not found"
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer in {TOOL_TIMEOUT_S:g} s"
    if out.returncode != 0:
        return None, f"{argv[0]} exited {out.returncode}: {out.stderr.strip()[:200]}"
    return out.stdout.strip(), ""


def _dist(name: str) -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _wheel_sha256(dist: importlib.metadata.Distribution) -> tuple[str | None, str]:
    """pip records the wheel's hash in direct_url.json when installed from a file or URL."""
    text = dist.read_text("direct_url.json")
    if text:
        try:
            info = json.loads(text).get("archive_info", {})
        except json.JSONDecodeError:
            info = {}
        h = (info.get("hashes") or {}).get("sha256") or str(info.get("hash", "")).removeprefix("sha256=")
        if h:
            return h, ""
    return None, "installed from an index: no wheel hash recorded (direct_url.json has none)"


def collect_environment(repo_root: Path | None = None) -> dict[str, Any]:
    """Facts that pin a result: python, torch, CUDA, driver, GPU model, sglang version and wheel hash,
    cptest version, flake.lock sha256. An absent fact is null, with its reason under `reasons`."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cptest": __version__,
    }
    reasons: dict[str, str] = {}
    torch = _dist("torch")
    env["torch"] = torch.version if torch else None
    if torch is None:
        reasons["torch"] = reasons["cuda"] = "torch is not installed"
        env["cuda"] = None
    else:
        out, why = _run_tool([sys.executable, "-c", "import torch; print(torch.version.cuda or '')"])
        env["cuda"] = out or None
        if not out:
            reasons["cuda"] = why or "torch built without CUDA"
    smi, why = _run_tool(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if smi:
        rows = [[c.strip() for c in line.split(",")] for line in smi.splitlines() if line.strip()]
        env["gpus"] = [r[0] for r in rows]
        env["driver"] = rows[0][1] if rows and len(rows[0]) > 1 else None
    else:
        env["gpus"] = env["driver"] = None
        reasons["gpus"] = reasons["driver"] = why
    sgl = _dist("sglang")
    env["sglang"] = sgl.version if sgl else None
    env["sglang_wheel_sha256"] = None
    env["sglang_record_sha256"] = None
    if sgl is None:
        reasons["sglang"] = reasons["sglang_wheel_sha256"] = (
            "sglang is not installed here (container launcher?)"
        )
    else:
        env["sglang_wheel_sha256"], why = _wheel_sha256(sgl)
        if why:
            reasons["sglang_wheel_sha256"] = why
        record = sgl.read_text("RECORD")
        # The RECORD lists every installed file with its hash: its own hash fingerprints the install.
        env["sglang_record_sha256"] = hashlib.sha256(record.encode()).hexdigest() if record else None
    root = repo_root or Path(__file__).resolve().parent.parent
    lock = root / "flake.lock"
    env["flake_lock_sha256"] = sha256_file(lock) if lock.is_file() else None
    if not lock.is_file():
        reasons["flake_lock_sha256"] = f"no flake.lock in {root}"
    env["reasons"] = reasons
    return env


# ---------------------------------------------------------------- diff
@dataclass(frozen=True)
class DiffEntry:
    what: str
    """e.g. `request 3 output_ids`, `rank 1 kv_pool rows`, `verdict capacity`."""
    a: Any
    b: Any
    within: bool
    """True when the difference is inside the tolerance (reported, not counted)."""


@dataclass
class DiffReport:
    a: Path
    b: Path
    entries: list[DiffEntry] = field(default_factory=list)

    @property
    def differences(self) -> list[DiffEntry]:
        return [e for e in self.entries if not e.within]

    @property
    def same(self) -> bool:
        return not self.differences

    def render(self) -> str:
        if self.same:
            return f"{self.a} and {self.b} agree ({len(self.entries)} difference(s) within tolerances)"
        lines = [f"{len(self.differences)} difference(s) between {self.a} and {self.b}:"]
        lines += [f"  {e.what}: {e.a!r} != {e.b!r}" for e in self.differences]
        return "\n".join(lines)


DEFAULT_TOLERANCES: dict[str, float] = {"logprob": 0.0, "capacity": 0.0}
"""logprob: max abs difference per position; capacity: relative difference of token counts."""


def diff(a: Path, b: Path, tolerances: dict[str, float] | None = None) -> DiffReport:
    """Compare two archives' evidence: request outputs, capacity figures, geometry and verdicts.
    Raises EvidenceError when either archive is unreadable."""
    from cptest.checks.load import load_archive

    tol = {**DEFAULT_TOLERANCES, **(tolerances or {})}
    A, B = load_archive(a), load_archive(b)
    rep = DiffReport(a=Path(a), b=Path(b))
    for role in sorted(set(A.roles) | set(B.roles)):
        ra, rb = A.role(role), B.role(role)
        qa = {r.index: r for r in (ra.runner.requests if ra.runner else [])}
        qb = {r.index: r for r in (rb.runner.requests if rb.runner else [])}
        for i in sorted(set(qa) | set(qb)):
            x, y = qa.get(i), qb.get(i)
            if x is None or y is None:
                rep.entries.append(DiffEntry(f"{role} request {i}", x and x.status, y and y.status, False))
                continue
            if x.status != y.status:
                rep.entries.append(DiffEntry(f"{role} request {i} status", x.status, y.status, False))
            if x.output_ids != y.output_ids:
                rep.entries.append(
                    DiffEntry(f"{role} request {i} output_ids", x.output_ids, y.output_ids, False)
                )
            pairs = list(zip(x.output_logprobs, y.output_logprobs, strict=False))
            worst = max((abs(p - q) for p, q in pairs), default=0.0)
            if worst > 0:
                rep.entries.append(
                    DiffEntry(
                        f"{role} request {i} max logprob diff", 0.0, round(worst, 6), worst <= tol["logprob"]
                    )
                )
        for w in sorted(set(ra.ranks) | set(rb.ranks)):
            ka, kb = ra.ranks.get(w), rb.ranks.get(w)
            figs = []
            for name, get in (
                ("kv_pool rows", lambda r: r.kv_pools[-1].rows if r.kv_pools else None),
                ("allocator size", lambda r: r.kv_pools[-1].allocator_size if r.kv_pools else None),
                (
                    "max_total_num_tokens",
                    lambda r: r.capacities[-1].max_total_num_tokens if r.capacities else None,
                ),
            ):
                figs.append((name, get(ka) if ka else None, get(kb) if kb else None))
            for name, x, y in figs:
                if x != y:
                    within = (
                        x is not None and y is not None and abs(x - y) <= tol["capacity"] * max(abs(x), 1)
                    )
                    rep.entries.append(DiffEntry(f"{role} rank {w} {name}", x, y, within))
            ga = ka.geometry[-1].groups if ka and ka.geometry else None
            gb = kb.geometry[-1].groups if kb and kb.geometry else None
            if ga != gb:
                rep.entries.append(DiffEntry(f"{role} rank {w} geometry groups", ga, gb, False))
    va, vb = _verdicts(Path(a)), _verdicts(Path(b))
    for name in sorted(set(va) | set(vb)):
        if va.get(name) != vb.get(name):
            rep.entries.append(DiffEntry(f"verdict {name}", va.get(name), vb.get(name), False))
    return rep


def _verdicts(dir: Path) -> dict[str, str]:
    p = dir / "verdict.json"
    if not p.is_file():
        return {}
    sv = ScenarioVerdict.from_json(p.read_text(encoding="utf-8"))
    out = {"scenario": sv.status}
    for i, v in enumerate(sv.verdicts):
        out[f"{i}:{v.checker}"] = v.status
    return out
