"""Which commits ran a side run: the commits whose cptest/ and tools/ files match its manifest's `code`.

    python tools/side_run_commit.py DIR [DIR ...] [--depth 400]

A side run's manifest (tools/side_run_manifest.py) names a `commit`, read on the machine that made
it, and pins the code by content (`code.sha256`). On the GPU machine the copy of `.git` may be
stale, so the named commit can be older than the tree that ran; this searches the newest `--depth`
commits of every branch here for the ones whose files hash to `code.sha256`. Prints a line per DIR:
the matching commits (newest first), `none` (the tree had changes never committed, or older than
the depth), or `no code pin` (a manifest from before the pin). Exit 0 when every DIR matched.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_run_manifest import _code_digest, code_files_at  # noqa: E402


def commits(root: Path, depth: int) -> list[str]:
    out = subprocess.run(["git", "-C", str(root), "rev-list", "--all", f"--max-count={depth}"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return out.split()


def matching(root: Path, digest: str, candidates: list[str], memo: dict[str, str | None]) -> list[str]:
    found = []
    for c in candidates:
        if c not in memo:
            files = code_files_at(c, root)
            memo[c] = None if files is None else _code_digest(files)
        if memo[c] == digest:
            found.append(c)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--depth", type=int, default=400)
    ap.add_argument("--repo", type=Path, default=Path.cwd())
    a = ap.parse_args()
    candidates = commits(a.repo, a.depth)
    memo: dict[str, str | None] = {}
    ok = True
    for d in a.dirs:
        code = json.loads((d / "manifest.json").read_text()).get("code")
        if not code:
            print(f"{d}: no code pin")
            ok = False
            continue
        found = matching(a.repo, code["sha256"], candidates, memo)
        ok &= bool(found)
        print(f"{d}: {' '.join(c[:12] for c in found) if found else 'none'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
