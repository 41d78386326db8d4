"""The results store: an archive's layout, its name, its phases, its manifest and their verification.

This is the only module that knows where an archive's files are. The runner, the fault injector,
the checks, the report and the pipeline all ask a `Layout` for a path; the probe and the reference
engine, which run inside the engine's processes, ask `rank_file_name` for the name of the file they
write into the directory they are given.

```
results/<scenario>/<UTC YYYYmmddTHHMMSSZ>-<first 8 hex of the scenario sha256>/
  scenario.cps               the scenario as written
  includes/...               its `extends` files, by their path relative to the scenario (`..` as `@up`)
  plan.json                  the effective configuration (cptest.plan.Plan)
  manifest.json              phase, pins, environment, sha256 of every other file
  evidence/<role>/rank<w>.jsonl   probe records of world rank w (role: one of ROLES); from a
                             launcher that names nodes, evidence/<role>/<node name>/rank<w>.jsonl
  evidence/<role>/runner.jsonl    runner records: requests, processes, GPU memory, lifecycle
  evidence/cptest.jsonl      cptest's own outline log of the run
  logs/<role>-node<k>.log    the engine's stdout and stderr, per node
                             (`<role>-node<k>-<name>.log` from a launcher that names nodes: Slurm)
  logs/cptest-crash.txt      only when cptest itself crashed during the run: its traceback
  verdict.json, report.md, report.html, junit.xml   written last
  analyses/<UTC YYYYmmddTHHMMSSZ>/   re-analyses written later beside the seal (`cptest.analyses`):
                             verdict.json, report.md, report.html, junit.xml and a manifest.json
                             naming the sha256 of the seal they judged (docs/architecture.md)
```
At `finish`, every evidence file (`*.jsonl`) and engine log of `PACK_FROM_BYTES` or more is stored
xz-compressed as `<name>.xz`: cptest reads either form through
`existing_file` and `read_bytes`, and the manifest hashes the files as stored. How a file is read
(never through a link, never more of it than `cptest.bounds` allows) is `cptest.archive_io`'s,
whose names this module re-exports.

Phases (Jepsen's store): `begin` writes the scenario, the plan and a first manifest before anything
runs; evidence is appended as it arrives; `finish` writes the verdict, the report and the final
manifest with the sha256 of every other file: the seal. A crash in between keeps the evidence, and
`cptest check --write DIR` redoes only the last phase. A finished manifest is never written again
(`finish` refuses): a later judgment of the same evidence goes beside it, under `analyses/`, which
the seal does not cover and which is verified by its own manifests.

Depends on nothing of cptest above `errors`, `bounds` and `archive_io`: it stores the texts and
JSON values it is given (the pipeline renders them), so it can never judge or render anything itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cptest.archive_io import PACK_FROM_BYTES as PACK_FROM_BYTES
from cptest.archive_io import PACKED as PACKED
from cptest.archive_io import Budget as Budget
from cptest.archive_io import IntegrityError as IntegrityError
from cptest.archive_io import OverBound as OverBound
from cptest.archive_io import entries_problem as entries_problem
from cptest.archive_io import existing_file as existing_file
from cptest.archive_io import foreign_entries as foreign_entries
from cptest.archive_io import integrity_error as _at
from cptest.archive_io import kind_of as _kind
from cptest.archive_io import pack_large_files as pack_large_files
from cptest.archive_io import packable as packable
from cptest.archive_io import packed as packed
from cptest.archive_io import read_bytes as read_bytes
from cptest.archive_io import read_file as read_file
from cptest.archive_io import read_lines as read_lines
from cptest.archive_io import regular_file as _regular
from cptest.archive_io import require_plain as require_plain
from cptest.archive_io import sha256_file as sha256_file
from cptest.archive_io import size_problems as size_problems
from cptest.archive_io import write_file as write_file
from cptest.bounds import bound_for
from cptest.errors import Problem, Span

MANIFEST_VERSION = 1
ROLES = ("main", "baseline", "control", "eager")

SCENARIO = "scenario.cps"
PLAN = "plan.json"
MANIFEST = "manifest.json"
VERDICT = "verdict.json"
REPORT = "report.md"
REPORT_HTML = "report.html"
JUNIT = "junit.xml"
RUNNER_FILE = "runner.jsonl"

_RANK_FILE = re.compile(r"^rank(\d+)\.jsonl(?:\.xz)?$")
_SHA256 = re.compile(r"[0-9a-f]{64}")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
"""What a scenario name must look like to become a folder of the results: one path component,
never `.`, `..`, a separator or a hidden name."""

ANALYSES = "analyses"
"""The folder of an archive that holds its re-analyses (`cptest.analyses`): outside the seal."""

INCLUDES = "includes"
"""The folder of an archive that holds its scenario's `extends` files."""


def valid_name(name: str) -> bool:
    """Whether `name` may be a scenario's folder under the results (see `NAME`)."""
    return isinstance(name, str) and NAME.fullmatch(name) is not None and name not in (".", "..")


def node_named(path: Path, node_name: str) -> Path:
    """A node's file named after the node too: `logs/main-node1.log` -> `logs/main-node1-n2.log`,
    `evidence/main` -> `evidence/main/n2` (a folder). Raises ValueError for a name that is not one
    plain path component (`NAME`): names come from the cluster, never trusted as paths."""
    if not valid_name(node_name):
        raise ValueError(f"node name {node_name!r} cannot name a file of the archive")
    if path.suffix:
        return path.with_name(f"{path.stem}-{node_name}{path.suffix}")
    return path / node_name


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
    def report_html(self) -> Path:
        return self.root / REPORT_HTML

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

    def node_log(self, role: str, node: int) -> Path:
        """The log of node `node` as the archive holds it: `logs/<role>-node<k>.log`, or, from a
        launcher that names its nodes (Slurm), the one `logs/<role>-node<k>-<name>.log` (reads the
        directory; the plain name when neither is there)."""
        plain = self.log(role, node)
        if plain.exists() or packed(plain).exists() or not self.logs_dir.is_dir():
            return plain
        named = sorted({p.with_name(p.name.removesuffix(PACKED))
                        for pattern in ("*.log", "*.log" + PACKED)
                        for p in self.logs_dir.glob(f"{role}-node{node}-{pattern}")})
        named = [p for p in named if valid_name(p.name[len(f"{role}-node{node}-"):-len(".log")])]
        return named[0] if len(named) == 1 else plain

    def relative(self, path: Path) -> str:
        """`path` as the archive names it (`evidence/main/rank0.jsonl`), for messages and manifests."""
        return path.relative_to(self.root).as_posix()

    def rank_files(self, role: str) -> dict[int, Path]:
        """The probe files present for `role`, by world rank (reads the directory): in the role's
        folder, or in one folder per node below it (`evidence/<role>/<node name>/rank<w>.jsonl`, a
        launcher that names its nodes). A world rank found twice is an IntegrityError."""
        d = self.role_dir(role)
        out: dict[int, Path] = {}
        if not d.is_dir():
            return out
        for p in sorted(d.iterdir()):
            if p.is_dir() and not p.is_symlink() and not _RANK_FILE.match(p.name):
                found = sorted(p.iterdir()) if valid_name(p.name) else []
            else:
                found = [p]
            for f in found:
                m = _RANK_FILE.match(f.name)
                if not m:
                    continue
                world = int(m.group(1))
                f = f.with_name(rank_file_name(world))  # the file as cptest names it, packed or not
                if world in out:
                    raise _at(f, f"rank {world} has two probe files: {self.relative(out[world])} and "
                              f"{self.relative(f)}", hint="an archive holds one file per rank")
                out[world] = f
        return dict(sorted(out.items()))

    def make_dirs(self, roles: Iterable[str]) -> None:
        """Create `logs/` and the evidence directory of each role (idempotent)."""
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        for role in roles:
            self.role_dir(role).mkdir(parents=True, exist_ok=True)


def archives_under(root: Path, *, side_runs: bool = False) -> list[Path]:
    """Every archive (a folder with verdict.json) under `root`, sorted, leaving out side runs unless
    `side_runs`: a folder whose name starts with `_` below `root` holds raw runs kept as evidence,
    not published archives. `root` itself may be such a folder. A hidden
    folder below `root` is never an archive: `.claims`, and the copy `publish` is still writing;
    nor is a re-analysis (`<archive>/analyses/<time>/`), which belongs to the archive beside it."""
    out = []
    for verdict in root.rglob(VERDICT):
        archive = verdict.parent
        parts = archive.relative_to(root).parts
        if any(part.startswith(".") for part in parts):
            continue
        if len(parts) >= 2 and parts[-2] == ANALYSES and (archive.parent.parent / PLAN).exists():
            continue
        if side_runs or not any(part.startswith("_") for part in parts):
            out.append(archive)
    return sorted(set(out))


def archive_dir(results_root: Path | str, scenario: str, scenario_sha256: str, now: datetime) -> Path:
    """`<results_root>/<scenario>/<UTC time>-<sha[:8]>`. Pure; `now` must be timezone-aware. Raises
    ValueError for a scenario name that is not one plain path component (`NAME`) or a hash that is
    not hex: an archive's path is built only from validated names."""
    if now.tzinfo is None:
        raise ValueError("archive_dir needs a timezone-aware time (datetime.now(UTC))")
    if not valid_name(scenario):
        raise ValueError(f"scenario name {scenario!r} cannot name a folder of the results "
                         "(letters, digits, `_`, `-`, `.`; not starting with `.`)")
    if not re.fullmatch(r"[0-9a-f]{8,64}", scenario_sha256 or ""):
        raise ValueError(f"scenario hash {scenario_sha256!r} is not hexadecimal")
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path(results_root) / scenario / f"{stamp}-{scenario_sha256[:8]}"


_EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def claim_path(root: Path) -> Path:
    """The file that reserves the archive name `root` (`<results>/<scenario>/<name>`) until `begin`
    creates the folder: `<results>/.claims/<scenario>.<name>`, outside every scenario's folder, so
    that nothing but archives ever appears there."""
    return root.parent.parent / CLAIMS / f"{root.parent.name}.{root.name}"


CLAIMS = ".claims"


def create_archive(results_root: Path | str, scenario: str, scenario_sha256: str, now: datetime) -> Path:
    """A free archive path `archive_dir(...)`, reserved exclusively: when another run took or
    reserved that name in the same second, the next free `-2`, `-3`... suffix. The reservation is a
    `claim_path` file (O_EXCL), so that the archive folder itself appears only when `begin` writes
    it (a run stopped before has archived nothing); `begin` removes the claim. The scenario's
    folder must be a real folder inside `results_root` (not a link). Raises ValueError as
    `archive_dir` does."""
    base = archive_dir(results_root, scenario, scenario_sha256, now)
    parent = base.parent
    parent.mkdir(parents=True, exist_ok=True)
    if parent.is_symlink() or not parent.resolve().is_relative_to(Path(results_root).resolve()):
        raise ValueError(f"{parent} is a link out of {results_root}: no archive is written through it")
    claims = Path(results_root) / CLAIMS
    claims.mkdir(exist_ok=True)
    if claims.is_symlink():
        raise ValueError(f"{claims} is a link: no archive name is reserved through it")
    for n in range(1, 1000):
        candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            os.close(os.open(claim_path(candidate), _EXCLUSIVE, 0o644))
        except FileExistsError:
            continue
        if os.path.lexists(candidate):  # begun by a run that has already dropped its claim
            claim_path(candidate).unlink(missing_ok=True)
            continue
        return candidate
    raise FileExistsError(f"no free archive name under {parent} for {base.name}")


def copy_archive(source: Path, results_root: Path | str, scenario: str, run: str,
                 check: Callable[[Path], None]) -> tuple[Path, bool]:
    """Publish: copy the archive `source` to `<results_root>/<scenario>/<run>` and return it, with
    whether it was there already. The name is reserved like a run's (`claim_path`, O_EXCL, so a run
    writing into the same results cannot take it meanwhile); the files are copied into a hidden
    folder beside the target (only regular files and folders: anything else is an IntegrityError),
    `check` judges *the copy* (it raises to refuse it), and only then is the copy renamed into
    place, so the results never hold half an archive or one that was changed after it was checked.
    An archive already at the target is never overwritten: the same archive (a byte-identical
    manifest that still verifies) is `(target, True)`; anything else is FileExistsError, as is a
    name a run has reserved. ValueError for a name that cannot be a folder (`valid_name`)."""
    for what, name in (("scenario", scenario), ("run", run)):
        if not valid_name(name):
            raise ValueError(f"{what} name {name!r} cannot name a folder of the results")
    results = Path(results_root)
    target = results / scenario / run
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    if parent.is_symlink() or not parent.resolve().is_relative_to(results.resolve()):
        raise ValueError(f"{parent} is a link out of {results}: nothing is published through it")
    if os.path.lexists(target):
        same = (target.is_dir() and not target.is_symlink() and existing_file(target / MANIFEST)
                and read_bytes(target / MANIFEST) == read_bytes(source / MANIFEST)
                and not verify(target))
        if same:
            return target, True
        raise FileExistsError(f"{target} holds another archive; an archive is never overwritten")
    claims = results / CLAIMS
    claims.mkdir(exist_ok=True)
    if claims.is_symlink():
        raise ValueError(f"{claims} is a link: no archive name is reserved through it")
    try:
        os.close(os.open(claim_path(target), _EXCLUSIVE, 0o644))
    except FileExistsError:
        raise FileExistsError(f"a run is writing an archive named {target} now") from None
    tmp = Path(tempfile.mkdtemp(prefix=f".publish-{run}-", dir=parent))
    try:
        for dirpath, dirnames, filenames in os.walk(source, followlinks=False):
            here = Path(dirpath)
            for name in sorted(dirnames + filenames):
                path = here / name
                mode = path.lstat().st_mode
                dest = tmp / path.relative_to(source)
                if stat.S_ISDIR(mode):
                    dest.mkdir()
                elif stat.S_ISREG(mode):
                    shutil.copy2(path, dest, follow_symlinks=False)
                else:
                    raise _at(path, f"{path.relative_to(source).as_posix()} is {_kind(mode)}, not a "
                              "regular file; nothing published")
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would make the published archive private
        check(tmp)
        if os.path.lexists(target):
            raise FileExistsError(f"{target} appeared while publishing; an archive is never overwritten")
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        release_claim(target)
    return target, False


def release_claim(root: Path) -> None:
    """Drop the reservation of `root` (`create_archive`), if any, and the claims folder once empty."""
    claim = claim_path(root)
    claim.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # another run's claim is in it, or there is none
        claim.parent.rmdir()


def file_hashes(root: Path, *, beside_seal: bool = True, within_bounds: bool = False) -> dict[str, str]:
    """sha256 of every regular file under `root` except the manifest, by POSIX relative path, sorted.
    With `beside_seal` (an archive's root) the `analyses/` folder is left out: re-analyses are
    written after the seal, and each is covered by its own manifest. Links are not followed
    (`foreign_entries` names them). With `within_bounds` (verifying), a file larger than cptest
    reads of its kind (`size_problems` names it) is listed with an empty hash, unread: a sparse
    file of a terabyte would take an hour to hash."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        if beside_seal and Path(dirpath) == root and ANALYSES in dirnames:
            dirnames.remove(ANALYSES)
        for name in filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            if stat.S_ISREG(st.st_mode) and not (p.parent == root and p.name == MANIFEST):
                over = within_bounds and st.st_size > bound_for(name).bytes
                out[p.relative_to(root).as_posix()] = "" if over else sha256_file(p)
    return dict(sorted(out.items()))


def seal_sha256(layout: Layout) -> str:
    """The sha256 of the archive's manifest.json as stored: what a re-analysis names as the seal it
    judged. IntegrityError when there is none or something other than a regular file stands there."""
    if not existing_file(layout.manifest):
        raise _at(layout.manifest, "archive has no manifest.json: there is no seal to name",
                  hint="was the run interrupted before `begin`?")
    return hashlib.sha256(read_bytes(layout.manifest)).hexdigest()


def read_manifest(layout: Layout) -> dict[str, Any] | None:
    """The manifest as written, or None when there is none or it is not JSON. Raises IntegrityError
    when something other than a regular file stands in its place, OverBound when it is larger than
    a manifest may be."""
    if not existing_file(layout.manifest):
        return None
    try:
        data = json.loads(read_file(layout.manifest))
    except OverBound:
        raise  # not a manifest cptest wrote, nor one it reads: named, never taken for an unfinished run
    except (IntegrityError, ValueError):
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
    write_file(layout.root, layout.manifest, json.dumps(manifest, sort_keys=True, indent=2) + "\n")
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
    """Phase 0: create the archive (it must not exist; a name `create_archive` reserved is released),
    write scenario.cps, its included files (`includes` maps a name under `includes/` to its text),
    plan.json and a first manifest. Returns the manifest. Raises FileExistsError when the directory
    exists, ValueError when an include is not named under `includes/` or would land outside it."""
    layout.root.mkdir(parents=True, exist_ok=False)
    release_claim(layout.root)
    layout.make_dirs(roles)
    write_file(layout.root, layout.scenario, scenario_text)
    folder = (layout.root / INCLUDES).resolve()
    for name, text in (includes or {}).items():
        target = layout.root / name
        parts = Path(name).parts
        if not parts or parts[0] != INCLUDES or ".." in parts or not target.resolve().is_relative_to(folder):
            raise ValueError(f"include {name!r} would be written outside the archive's {INCLUDES}/ folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        write_file(layout.root, target, text)
    write_file(layout.root, layout.plan, plan_json if plan_json.endswith("\n") else plan_json + "\n")
    return _write_manifest(layout, "begun", scenario, pins, environment)


def finish(
    layout: Layout,
    *,
    verdict_json: str,
    report_md: str,
    junit_xml: str,
    scenario: str,
    pins: Mapping[str, Any],
    report_html: str | None = None,
) -> dict[str, Any]:
    """Last phase: verdict.json, report.md, report.html (when given), junit.xml, then the final
    manifest with the sha256 of every other file. The environment is carried over from the first
    manifest (it describes the machine that gathered the evidence, not the one that finishes the
    archive), and so are the pins
    when the first manifest has them (the run adds what it measured, such as the model's tree hash).
    Every file is written atomically and never through a link; an archive holding a link, a FIFO or
    another special file is refused first (IntegrityError, exit 3).

    A sealed archive keeps its seal: one whose manifest is already `finished` is refused, as is one
    whose files listed by the first manifest (the scenario, its includes, the plan) changed since
    `begin` (IntegrityError naming each); nothing is written then. A later judgment of a sealed
    archive is a re-analysis beside it (`cptest.analyses`)."""
    require_plain(layout.root)
    _require_unsealed(layout)
    pack_large_files(layout.root)
    write_file(layout.root, layout.verdict, verdict_json)
    write_file(layout.root, layout.report, report_md)
    if report_html is not None:
        write_file(layout.root, layout.report_html, report_html)
    write_file(layout.root, layout.junit, junit_xml)
    begun = read_manifest(layout) or {}
    environment = begun.get("environment") if isinstance(begun.get("environment"), dict) else {}
    if isinstance(begun.get("pins"), dict):
        pins = begun["pins"]  # what the run pinned (the model's tree hash it measured), not only the plan's
    return _write_manifest(layout, "finished", scenario, pins, environment or {})


def _require_unsealed(layout: Layout) -> None:
    """Raise IntegrityError when the archive is sealed already, or when a file its first manifest
    lists is missing or changed: finishing must never cover an edit made after `begin`."""
    begun = read_manifest(layout)
    if begun is None:
        if existing_file(layout.manifest):
            raise _at(layout.manifest, "manifest.json is not a manifest cptest wrote; nothing written")
        return
    if begun.get("phase") == "finished":
        raise _at(layout.manifest, "the archive is sealed (manifest.json is finished): its seal is never "
                  "written again; nothing written",
                  hint="`cptest check --write DIR` writes a re-analysis beside the seal, under analyses/")
    listed = begun.get("files")
    if not isinstance(listed, dict):
        raise _at(layout.manifest, "malformed manifest: `files` must map each archived file to its sha256")
    problems = []
    for name, digest in sorted(listed.items()):
        path = layout.root / name
        if not isinstance(digest, str) or Path(name).is_absolute() or ".." in Path(name).parts:
            problems.append(Problem(Span(str(layout.manifest), 1, 1), f"manifest lists {name!r}, which is "
                                    "no file of the archive"))
        elif not _regular(path):
            problems.append(Problem(Span(str(path), 1, 1), f"{name} is listed in the first manifest but "
                                    "missing; nothing written"))
        elif sha256_file(path) != digest:
            problems.append(Problem(Span(str(path), 1, 1), f"{name} changed since the run began; nothing "
                                    "written", expected=digest[:16], found=sha256_file(path)[:16]))
    if problems:
        raise IntegrityError(problems)


def verify(root: Path) -> list[Problem]:
    """Problems with the archive at `root` against its seal (its manifest): a missing, changed or
    extra file, a link, FIFO or other special file anywhere in it, a manifest that is not a regular
    file of JSON with a `files` table of sha256 by relative path. The `analyses/` folder is not
    the seal's: `cptest.analyses.verify_archive` checks it too. A file larger than cptest reads of
    its kind (`cptest.bounds`) is a problem too, and an archive of more entries than an archive
    may hold is that one problem (nothing more is walked). Never raises for what the archive holds."""
    layout = Layout(root)
    mpath = layout.manifest
    if not root.is_dir():
        return [Problem(Span(str(root), 1, 1), "not an archive directory")]
    too_many = entries_problem(root)
    if too_many is not None:
        return [too_many]
    special = foreign_entries(root)
    try:
        if not existing_file(mpath):
            return special + [Problem(Span(str(mpath), 1, 1), "archive has no manifest.json",
                                      hint="was the run interrupted before `begin`?")]
        manifest = json.loads(read_file(mpath))
    except IntegrityError as e:
        return special + [p for p in e.problems if p not in special]
    except ValueError as e:
        return special + [Problem(Span(str(mpath), 1, 1), f"manifest.json is not JSON: {e}")]
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(listed, dict) or not all(isinstance(v, str) and _SHA256.fullmatch(v)
                                               for v in listed.values()):
        return special + [Problem(Span(str(mpath), 1, 1), "malformed manifest: `files` must map each "
                                  "archived file to its sha256 (64 hex digits)")]
    problems = list(special)
    if manifest.get("phase") != "finished":
        problems.append(Problem(
            Span(str(mpath), 1, 1),
            f"manifest is from the start of the run (phase {manifest.get('phase')!r}); evidence written "
            "later is not covered",
            hint="run `cptest check DIR` to finish the archive",
        ))  # fmt: skip
    outside = [n for n in listed if not Path(n).parts or Path(n).is_absolute() or ".." in Path(n).parts
               or n == MANIFEST]
    problems += [Problem(Span(str(mpath), 1, 1), f"manifest lists {n!r}, which is no file of the archive")
                 for n in outside]
    listed = {k: v for k, v in listed.items() if k not in outside}
    actual = file_hashes(root, within_bounds=True)
    for name in sorted(set(listed) | set(actual)):
        where = Span(str(root / name), 1, 1)
        if name not in actual:
            if any(p.span and p.span.file == str(root / name) for p in special):
                continue  # already named: a link or FIFO where the file should be
            problems.append(Problem(where, f"{name} is listed in the manifest but missing"))
        elif name not in listed:
            problems.append(Problem(where, f"{name} is not in the manifest (added after the run?)"))
        elif actual[name] and listed[name] != actual[name]:
            problems.append(Problem(where, f"{name} changed since the run", expected=listed[name][:16],
                                    found=actual[name][:16]))
    return problems + size_problems(root, actual)
