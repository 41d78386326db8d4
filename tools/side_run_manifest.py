"""Write manifest.json and SHA256SUMS for a raw side run under results/_*/ (decisions D14).

A side run is not a cptest archive, but it carries the same pins: the environment as
`cptest.run.environment.collect_environment` reads it (run this on the machine that made the run), the
commit of the code it ran, the script that made it and the sha256 of every file beside it.

    python tools/side_run_manifest.py DIR --commit SHA --script PATH [--what TEXT]
    python tools/side_run_manifest.py DIR --commit SHA --script PATH --not-recorded REASON

`--not-recorded` is for a run whose machine is gone: the environment is then null, field by
field, with REASON under `reasons` (cptest's convention for an absent fact), never guessed.
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


def manifest(dir: Path, *, commit: str, script: Path, what: str, not_recorded: str | None) -> dict[str, Any]:
    if not_recorded is None:
        environment = collect_environment()
    else:
        environment = {k: None for k in ENVIRONMENT_FIELDS}
        environment["reasons"] = {k: not_recorded for k in ENVIRONMENT_FIELDS}
    files = {k: v for k, v in file_hashes(dir).items() if k not in ("manifest.json", "SHA256SUMS")}
    return {"manifest_version": 1, "kind": "side-run", "what": what, "commit": commit,
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
