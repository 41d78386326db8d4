"""Re-analyses beside a sealed archive: a later judgment of the same evidence never replaces the seal.

An archive's seal is its finished manifest.json (`cptest.store.finish`): the sha256 of every file
the run wrote. A re-analysis (`cptest check --write` of a sealed archive, after the checkers
changed) goes into a folder of its own beside the seal, and the seal, the evidence and the
original verdict.json stay as they were:

```
analyses/<UTC YYYYmmddTHHMMSSZ>[-n]/
  verdict.json, report.md, report.html, junit.xml
  manifest.json    analysis_version, created, cptest_version,
                   seal: {file: manifest.json, sha256 of it as it was judged},
                   previous: {analysis, sha256 of its manifest.json} or null (the chain),
                   files: sha256 of every other file of this folder
```

`verify_archive` checks the seal (`store.verify`) and then every analysis: its files against its
own manifest, the seal it names against the archive's manifest.json as it is now, and the chain
(each names the one before it; the first names none). Hashes say only that nothing changed since
it was written: whether an analysis's verdict is what the evidence gives is for the caller that
recomputes it (`cptest.sealed`).

Depends on `store` and `errors` only, like the store: it writes the texts it is given.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cptest import store
from cptest.errors import Problem, Span

ANALYSIS_VERSION = 1
NAME = re.compile(r"^(\d{8}T\d{6}Z)(?:-(\d{1,3}))?$")
"""What an analysis folder is called: the UTC time it was written, `-2`, `-3`... when taken."""
VERDICT_NAME = store.VERDICT


def folder(root: Path) -> Path:
    return root / store.ANALYSES


def _order(path: Path) -> tuple[str, int]:
    m = NAME.fullmatch(path.name)
    return (m.group(1), int(m.group(2) or 1)) if m else (path.name, 0)


def listed(root: Path) -> list[Path]:
    """The analysis folders of the archive at `root`, oldest first (by name: the time they were
    written); folders that are not named like one are left out (`problems` names them)."""
    where = folder(root)
    if not where.is_dir() or where.is_symlink():
        return []
    found = [p for p in where.iterdir() if NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink()]
    return sorted(found, key=_order)


def newest(root: Path) -> Path | None:
    """The newest analysis folder, or None when the archive has none."""
    found = listed(root)
    return found[-1] if found else None


def current_verdict_file(root: Path) -> Path:
    """The verdict.json that says what the archive's evidence gives now: the newest analysis's, or
    the seal's own when there is no analysis."""
    last = newest(root)
    return (last if last is not None else root) / VERDICT_NAME


def _sha(path: Path) -> str:
    return hashlib.sha256(store.read_bytes(path)).hexdigest()


def write(root: Path, files: Mapping[str, str], *, now: datetime, cptest_version: str) -> Path:
    """Write a new analysis of the sealed archive at `root` and return its folder: the `files` (name
    -> text; plain names, no folders) and last its manifest, naming the seal's sha256 and the
    previous analysis. The caller has judged the archive (`sealed.judge`); nothing of the seal is
    touched. Raises IntegrityError when the archive is not sealed, ValueError for a name that is
    not one plain file name or is `manifest.json`, and when `now` has no time zone."""
    if now.tzinfo is None:
        raise ValueError("an analysis is named by a timezone-aware time (datetime.now(UTC))")
    for name in files:
        if not store.valid_name(name) or name == store.MANIFEST:
            raise ValueError(f"{name!r} cannot name a file of an analysis")
    layout = store.Layout(root)
    if not store.is_finished(layout):
        raise store.IntegrityError(Problem(Span(str(layout.manifest), 1, 1), "the archive is not sealed (its "
                                           "manifest is not finished): there is no seal to analyse beside"))
    seal = store.seal_sha256(layout)
    previous = newest(root)
    parent = folder(root)
    parent.mkdir(exist_ok=True)
    if parent.is_symlink() or not parent.is_dir():
        raise store.IntegrityError(Problem(Span(str(parent), 1, 1), f"{store.ANALYSES} is not a folder of "
                                           "the archive (a link?); nothing written"))
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    for n in range(1, 1000):
        target = parent / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            target.mkdir()
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free analysis name under {parent} for {stamp}")
    for name, text in files.items():
        store.write_file(root, target / name, text)
    manifest: dict[str, Any] = {
        "analysis_version": ANALYSIS_VERSION,
        "created": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cptest_version": cptest_version,
        "seal": {"file": store.MANIFEST, "sha256": seal},
        "previous": None if previous is None else {
            "analysis": previous.relative_to(root).as_posix(), "sha256": _sha(previous / store.MANIFEST)},
        "files": store.file_hashes(target, beside_seal=False),
    }
    store.write_file(root, target / store.MANIFEST, json.dumps(manifest, sort_keys=True, indent=2) + "\n")
    return target


def problems(root: Path) -> list[Problem]:
    """What is wrong with the archive's analyses (none when it has none): anything under
    `analyses/` that is not an analysis folder, an analysis without a readable manifest, one whose
    files changed, one that names another seal than the archive's manifest.json, and a broken
    chain. Never raises for what the archive holds."""
    where = folder(root)
    if not os.path.lexists(where):
        return []
    if where.is_symlink() or not where.is_dir():
        return []  # `store.foreign_entries` names a link; a file there is not in the seal: `verify` names it
    out: list[Problem] = []
    for entry in sorted(where.iterdir()):
        if not (NAME.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink()):
            rel = entry.relative_to(root).as_posix()
            out.append(Problem(Span(str(entry), 1, 1), f"{rel} is not a re-analysis cptest wrote",
                               hint="analyses/ holds only folders named by the UTC time they were written"))
    try:
        seal = store.seal_sha256(store.Layout(root))
    except store.IntegrityError:
        seal = None  # `store.verify` names the missing or unreadable seal
    previous: Path | None = None
    for analysis in listed(root):
        out += _analysis_problems(root, analysis, seal, previous)
        previous = analysis
    return out


def _analysis_problems(root: Path, analysis: Path, seal: str | None, previous: Path | None) -> list[Problem]:
    rel = analysis.relative_to(root).as_posix()
    mpath = analysis / store.MANIFEST

    def at(path: Path, message: str, **kw: Any) -> Problem:
        return Problem(Span(str(path), 1, 1), message, **kw)

    try:
        if not store.existing_file(mpath):
            return [at(mpath, f"{rel} has no manifest.json: not a re-analysis cptest finished")]
        manifest = json.loads(store.read_file(mpath))
    except store.IntegrityError as e:
        return list(e.problems)
    except ValueError as e:
        return [at(mpath, f"{rel}/manifest.json is not JSON: {e}")]
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if (not isinstance(manifest, dict) or manifest.get("analysis_version") != ANALYSIS_VERSION
            or not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values())):
        return [at(mpath, f"malformed manifest: {rel}/manifest.json is not a re-analysis manifest "
                   f"(analysis_version {ANALYSIS_VERSION}, a `files` table of sha256)")]
    out: list[Problem] = []
    named = (manifest.get("seal") or {}).get("sha256") if isinstance(manifest.get("seal"), dict) else None
    if seal is not None and named != seal:
        out.append(at(mpath, f"{rel} names another seal than this archive's manifest.json: it judged other "
                      "evidence, or the seal was replaced", expected=seal[:16], found=str(named)[:16]))
    link = manifest.get("previous")
    want = None if previous is None else {"analysis": previous.relative_to(root).as_posix(),
                                          "sha256": _previous_sha(previous)}
    if link != want:
        out.append(at(mpath, f"{rel} breaks the chain of analyses: it names "
                      f"{_short_link(link)} as the one before it, the archive holds {_short_link(want)}"))
    if VERDICT_NAME not in files:
        out.append(at(mpath, f"{rel} lists no verdict.json"))
    actual = store.file_hashes(analysis, beside_seal=False, within_bounds=True)
    for name in sorted(set(files) | set(actual)):
        path = analysis / name
        if name not in actual:
            out.append(at(path, f"{rel}/{name} is listed in its manifest but missing"))
        elif name not in files:
            out.append(at(path, f"{rel}/{name} is not in its manifest (added after the analysis?)"))
        elif actual[name] and files[name] != actual[name]:
            out.append(at(path, f"{rel}/{name} changed since the analysis", expected=files[name][:16],
                          found=actual[name][:16]))
    return out + store.size_problems(root, [f"{rel}/{name}" for name in actual])


def _previous_sha(previous: Path) -> str | None:
    try:
        return _sha(previous / store.MANIFEST)
    except store.IntegrityError:
        return None  # named as that analysis's own problem


def _short_link(link: Any) -> str:
    if not isinstance(link, dict):
        return "none" if link is None else repr(link)[:60]
    return f"{link.get('analysis')} ({str(link.get('sha256'))[:12]})"


def verify_archive(root: Path) -> list[Problem]:
    """Everything `cptest verify` checks: the seal (`store.verify`) and the analyses beside it
    (none are listed in an archive of more entries than an archive may hold)."""
    seal = store.verify(root)
    if root.is_dir() and store.entries_problem(root) is not None:
        return seal
    return seal + problems(root)
