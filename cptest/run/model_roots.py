"""Where a run may load a model from, and a hub model's place in the model store.

A scenario names its model; it must not make a server load (or cptest hash) an arbitrary directory
of the machine. So the checkpoint a run launches lies, symlinks followed, inside one of the run's
model roots: the model store (`--models DIR`, $CPTEST_MODELS: the root the person running cptest
names on the command line) or the folder of the scenario file. A hub model is never downloaded by
the run: it is the snapshot at `<models>/hub/ORG/NAME/REVISION` of the store, put there by whoever
runs cptest (`huggingface-cli download ORG/NAME --revision REVISION --local-dir ...`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

HF_METADATA = Path(".cache") / "huggingface" / "download"
"""Where `huggingface-cli download --local-dir` records, per file, the commit it came from (first
line of each `*.metadata`)."""


def outside_roots(model_dir: Path, roots: list[Path]) -> bool:
    """True when `model_dir`'s real path lies in none of `roots` (their real paths)."""
    real = os.path.realpath(model_dir)
    for root in roots:
        r = os.path.realpath(root)
        if real == r or real.startswith(r.rstrip(os.sep) + os.sep):
            return False
    return True


def recorded_revisions(model_dir: Path) -> set[str]:
    """The commits a hub download into `model_dir` recorded for its files; empty when it recorded none."""
    folder = model_dir / HF_METADATA
    if not folder.is_dir():
        return set()
    found = set()
    for f in folder.rglob("*.metadata"):
        try:
            first = f.read_text(errors="replace").splitlines()[:1]
        except OSError:
            continue
        if first:
            found.add(first[0].strip())
    return found


def is_commit(revision: str) -> bool:
    """True for a full git commit hash, what a download records for each file."""
    return re.fullmatch(r"[0-9a-f]{40}", revision) is not None
