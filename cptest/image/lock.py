"""The image lock, `images/lock.json`: image reference -> pinned digest, with how each was made.

This module is the lock's one owner: it reads and validates it (`ImageLock.load`), and rewrites an
engine's entry after `cptest image build --update-lock` (`write_engine_entry`). The docker launcher
asks it which digest an image must have, the image builder which inputs to build from, and the
Kubernetes renderer what it pins; none of them reads the file itself.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cptest
from cptest.errors import Problem, RunError, did_you_mean, one_of

LOCK_VERSION = 1
"""Version of the `images/lock.json` format this module reads."""

DEFAULT_LOCK_PATH = Path(__file__).resolve().parents[2] / "images" / "lock.json"
"""The committed lock of the repository (images/lock.json)."""
LOCK_ENV = "CPTEST_IMAGE_LOCK"
"""Names another lock file in place of the committed one (tests; a site's own images)."""


def lock_path() -> Path:
    """The lock the launcher and `cptest image build` use: $CPTEST_IMAGE_LOCK, else images/lock.json."""
    return Path(os.environ.get(LOCK_ENV) or DEFAULT_LOCK_PATH)


LOCK_STATUSES = ("pinned", "unbuilt")
LOCK_ENTRY_KEYS = ("digest", "status", "build", "dockerfile", "sglang", "note", "engine", "cptest_mount",
                   "layer", "inputs", "driver_mounts")
"""Keys of one lock entry. The launcher reads digest, status, build, engine, cptest_mount and
driver_mounts; `cptest image build` reads layer and inputs; the rest documents the image."""
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
BUILD_HINT = "build it and pin it as images/README.md describes"

@dataclass(frozen=True)
class LockEntry:
    """One image reference of the lock. `digest` is None exactly when `status` is "unbuilt"."""

    reference: str
    digest: str | None
    status: str
    build: str | None = None
    """How to build the image (a human instruction; shown when the entry is unbuilt)."""
    engine: str | None = None
    """The engine whose nodes run this image when their plan names none (at most one per engine)."""
    cptest_mount: str | None = None
    """Where the image expects the cptest package (mounted read-only from the running checkout)."""
    driver_mounts: tuple[str, ...] = ()
    """Host paths bound read-only at the same path when GPUs go in as device nodes (Podman): the
    driver's user-space libraries, which the image cannot carry (they must match the host's driver)."""
    layer: str | None = None
    """The diff id of the image's one layer, for an image cptest builds (`cptest.image.build`)."""
    inputs: Mapping[str, Any] | None = field(default=None, hash=False)
    """What cptest built the image from, as the lock holds it (`cptest.image.build.Inputs`)."""


@dataclass(frozen=True)
class ImageLock:
    """`images/lock.json`: image reference -> pinned digest. Read with `ImageLock.load`."""

    path: Path
    entries: dict[str, LockEntry] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | str = DEFAULT_LOCK_PATH) -> ImageLock:
        """Read and validate a lock file; every problem of the file is reported at once (RunError)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise RunError(
                Problem(None, f"image lock {path} does not exist", hint="see images/README.md")
            ) from None
        except (OSError, json.JSONDecodeError) as e:
            raise RunError(Problem(None, f"image lock {path} is unreadable: {e}")) from None
        return cls.from_data(data, path)

    @classmethod
    def from_data(cls, data: Any, path: Path | str = "<lock>") -> ImageLock:
        path = Path(path)
        problems: list[Problem] = []
        if not isinstance(data, dict) or not isinstance(data.get("images"), dict):
            raise RunError(Problem(None, f"{path}: expected an object with an \"images\" object"))
        if data.get("lock_version") != LOCK_VERSION:
            problems.append(
                Problem(None, f"{path}: unsupported lock_version",
                        expected=str(LOCK_VERSION), found=repr(data.get("lock_version")))
            )
        entries: dict[str, LockEntry] = {}
        for ref, raw in data["images"].items():
            where = f"{path}: images[{ref!r}]"
            if not isinstance(raw, dict):
                problems.append(Problem(None, f"{where} is not an object"))
                continue
            for key in sorted(set(raw) - set(LOCK_ENTRY_KEYS)):
                close = did_you_mean(key, LOCK_ENTRY_KEYS)
                problems.append(Problem(None, f"{where} has an unknown key {key!r}",
                                        expected=one_of(LOCK_ENTRY_KEYS),
                                        hint=f"did you mean {close!r}?" if close else None))
            status = raw.get("status", "pinned")
            digest = raw.get("digest")
            if status not in LOCK_STATUSES:
                problems.append(Problem(None, f"{where}.status is not known",
                                        expected=one_of(LOCK_STATUSES), found=repr(status)))
                continue
            if status == "pinned" and not (isinstance(digest, str) and _DIGEST_RE.match(digest)):
                problems.append(Problem(None, f"{where}.digest must be a sha256 digest when pinned",
                                        expected="sha256:<64 hex digits>", found=repr(digest)))
                continue
            if status == "unbuilt" and digest is not None:
                problems.append(Problem(None, f"{where} is unbuilt but has a digest",
                                        expected="null", found=repr(digest),
                                        hint='set "status": "pinned" once the digest is real'))
                continue
            engine = raw.get("engine")
            if engine is not None and any(e.engine == engine for e in entries.values()):
                problems.append(Problem(None, f"{where}: a second image for engine {engine!r}",
                                        hint="one image per engine; remove the older entry"))
                continue
            mounts = raw.get("driver_mounts", [])
            if not isinstance(mounts, list) or not all(
                    isinstance(m, str) and os.path.isabs(m) for m in mounts):
                problems.append(Problem(None, f"{where}.driver_mounts must be a list of absolute host paths",
                                        expected='["/usr/local/nvidia", ...]', found=repr(mounts)))
                continue
            entries[ref] = LockEntry(ref, digest, status, raw.get("build"), engine, raw.get("cptest_mount"),
                                     tuple(mounts), raw.get("layer"), raw.get("inputs"))
        if problems:
            raise RunError(problems)
        return cls(path, entries)

    def for_engine(self, engine: str) -> LockEntry | None:
        """The entry marked `"engine": engine` (the image of nodes that name none), or None."""
        return next((e for e in self.entries.values() if e.engine == engine), None)

    def entry(self, reference: str) -> LockEntry:
        """The pinned entry of `reference`; RunError if it is absent or unbuilt."""
        found = self.entries.get(reference)
        if found is None:
            close = did_you_mean(reference, self.entries)
            raise RunError(Problem(
                None, f"image {reference!r} is not pinned in {self.path}",
                expected=one_of(sorted(self.entries)) or "an entry for it",
                hint=(f"did you mean {close!r}?" if close else f"{BUILD_HINT}, then add it to the lock"),
            ))
        if found.status == "unbuilt":
            raise RunError(Problem(
                None, f"image {reference!r} is unbuilt: {self.path} has no digest for it",
                hint=f"{found.build or BUILD_HINT}; then set its digest and \"status\": \"pinned\"",
            ))
        return found


def cptest_volume(mount: str) -> dict[str, dict[str, str]]:
    """The running cptest package, read-only at `<mount>/cptest` (docs/containers.md, section 3): what
    an entry's `cptest_mount` asks of every container of its image, the launcher's and the image
    builder's smoke test alike."""
    package = Path(cptest.__file__).resolve().parent
    return {str(package): {"bind": f"{mount.rstrip('/')}/cptest", "mode": "ro"}}


def write_engine_entry(path: Path, engine: str, reference: str, entry: Mapping[str, Any]) -> None:
    """Replace the lock's entry for `engine` with `reference` -> `entry`, every other entry and key
    kept as the file holds it; the file is replaced whole, never left half written. The result must
    read back as a valid lock (RunError otherwise, and the file is left as it was)."""
    lock = json.loads(path.read_text())
    images = {ref: raw for ref, raw in lock["images"].items()
              if not (isinstance(raw, dict) and raw.get("engine") == engine)}
    images[reference] = dict(entry)
    lock["images"] = images
    ImageLock.from_data(lock, path)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(lock, indent=2) + "\n")
    tmp.replace(path)
