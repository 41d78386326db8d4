"""Write manifest.json and SHA256SUMS for a raw side run under results/_*/ (decisions D14).

A side run is not a cptest archive, but it carries the same pins: the environment as
`cptest.run.environment.collect_environment` reads it (run this on the machine that made the run), the
commit of the code it ran, the script that made it and the sha256 of every file beside it.

    python tools/side_run_manifest.py DIR --commit SHA --script PATH [--what TEXT]
    python tools/side_run_manifest.py DIR --commit SHA --script PATH --not-recorded REASON

`--not-recorded` is for a run whose machine is gone: the environment is then null, field by
field, with REASON under `reasons` (cptest's convention for an absent fact), never guessed.

`code` pins the code by content: a sha256 over every file under cptest/ and tools/ as the run saw
them (path and sha256 of each; caches left out), and whether that equals `commit`'s files where git
here knows the commit. The GPU machine's copy of `.git` can be stale, so a `commit` read from it
there named an older commit than the tree that ran (results/_measure runs 1-3, 19-20);
`tools/side_run_commit.py DIR` finds the commits whose files match `code.sha256`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from cptest.run.environment import collect_environment
from cptest.store import file_hashes, sha256_file

ENVIRONMENT_FIELDS = ("python", "platform", "cptest", "torch", "cuda", "gpus", "driver", "sglang",
                      "sglang_wheel_sha256", "sglang_record_sha256", "flake_lock_sha256")


def script_sha256(script: Path, commit: str) -> str | None:
    """The script as it was at `commit` where git knows the commit (None if it had no such file),
    else (no git, as on the GPU machine, where the commit is the checkout) as it is now."""
    def git(*argv: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["git", *argv], capture_output=True, timeout=30, check=False)

    try:
        known = git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0
    except (OSError, subprocess.SubprocessError):
        known = False
    if not known:
        return sha256_file(script) if script.is_file() else None
    shown = git("show", f"{commit}:{script.as_posix()}")
    return hashlib.sha256(shown.stdout).hexdigest() if shown.returncode == 0 else None


CODE_DIRS = ("cptest", "tools")
"""What `code` hashes: the package and the scripts that drive the side runs."""


def _code_digest(entries: list[tuple[str, str]]) -> str:
    text = "".join(f"{path}\0{digest}\n" for path, digest in sorted(entries))
    return hashlib.sha256(text.encode()).hexdigest()


def code_files(root: Path) -> list[tuple[str, str]]:
    """(path, sha256) of every file under CODE_DIRS in the working tree, caches left out."""
    out = []
    for d in CODE_DIRS:
        for f in (root / d).rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc":
                out.append((f.relative_to(root).as_posix(), sha256_file(f)))
    return out


def code_files_at(commit: str, root: Path) -> list[tuple[str, str]] | None:
    """(path, sha256) of every file under CODE_DIRS at `commit`, or None where git here lacks it."""
    def git(*argv: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["git", "-C", str(root), *argv], input=data, capture_output=True, timeout=120,
                              check=False)

    try:
        listed = git("ls-tree", "-r", "-z", commit, "--", *CODE_DIRS)
    except (OSError, subprocess.SubprocessError):
        return None
    if listed.returncode != 0:
        return None
    items = []
    for rec in listed.stdout.split(b"\0"):
        if not rec:
            continue
        meta, path = rec.split(b"\t", 1)
        mode, kind, oid = meta.split()
        if kind == b"blob" and mode != b"120000":  # links are not followed on disk either
            items.append((path.decode(), oid.decode()))
    blobs = git("cat-file", "--batch", data="".join(f"{oid}\n" for _, oid in items).encode())
    if blobs.returncode != 0:
        return None
    out, buf = [], blobs.stdout
    for path, _ in items:
        header, buf = buf.split(b"\n", 1)
        size = int(header.split()[2])
        out.append((path, hashlib.sha256(buf[:size]).hexdigest()))
        buf = buf[size + 1:]
    return out


def code_pin(root: Path, commit: str) -> dict[str, Any]:
    here = code_files(root)
    at = code_files_at(commit, root)
    digest = _code_digest(here)
    return {"dirs": list(CODE_DIRS), "files": len(here), "sha256": digest,
            "commit_matches": None if at is None else _code_digest(at) == digest}


def manifest(dir: Path, *, commit: str, script: Path, what: str, not_recorded: str | None) -> dict[str, Any]:
    if not_recorded is None:
        environment = collect_environment()
    else:
        environment = {k: None for k in ENVIRONMENT_FIELDS}
        environment["reasons"] = {k: not_recorded for k in ENVIRONMENT_FIELDS}
    files = {k: v for k, v in file_hashes(dir).items() if k not in ("manifest.json", "SHA256SUMS")}
    return {"manifest_version": 1, "kind": "side-run", "what": what, "commit": commit,
            "code": code_pin(Path.cwd(), commit),
            "script": str(script), "script_sha256": script_sha256(script, commit),
            "environment": environment, "files": files}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--script", type=Path, required=True)
    ap.add_argument("--what", default="")
    ap.add_argument("--not-recorded", default=None)
    a = ap.parse_args()
    m = manifest(a.dir, commit=a.commit, script=a.script, what=a.what, not_recorded=a.not_recorded)
    (a.dir / "manifest.json").write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
    sums = {f.name: sha256_file(f) for f in a.dir.iterdir() if f.is_file() and f.name != "SHA256SUMS"}
    (a.dir / "SHA256SUMS").write_text("".join(f"{h}  {name}\n" for name, h in sorted(sums.items())))


if __name__ == "__main__":
    main()
