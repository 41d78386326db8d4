"""What a hub model's id, a revision and a pinned sha256 may look like.

A hub id becomes a folder of the model store (`<models>/hub/ORG/NAME/REVISION`, `hub_store_name`)
and SGLang's `--model-path`: an id that is a path (`/root/.ssh`, `../x`, `~/.ssh`) would name a
directory of the machine instead, so only Hugging Face's own shape passes, `org/name` with each
part of letters, digits, `-`, `_` and `.`, not starting with `.` or `-`.
"""

from __future__ import annotations

import re

_PART = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,95}"
HUB_ID = re.compile(rf"{_PART}/{_PART}")
REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
SHA256 = re.compile(r"[0-9a-f]{64}")


def hub_id_problem(text: str) -> str | None:
    """Why `text` is not a hub id, or None."""
    if not HUB_ID.fullmatch(text) or ".." in text:
        return f"{text!r} is not a hub id"
    return None


def revision_problem(text: str) -> str | None:
    """Why `text` is not a revision (a commit hash, a branch or tag name without folders), or None."""
    if not REVISION.fullmatch(text) or ".." in text:
        return f"{text!r} is not a revision"
    return None


def sha256_problem(text: str) -> str | None:
    """Why `text` is not a sha256 in lower-case hex, or None."""
    return None if SHA256.fullmatch(text) else f"{text!r} is not a sha256 (64 lower-case hex digits)"


HUB = "hub"
"""The model store's folder of hub snapshots (`cptest.run.model_roots`)."""


def hub_store_name(hub_id: str, revision: str) -> str:
    """A hub snapshot's folder inside the model store, `hub/ORG/NAME/REVISION`: names only, as
    `hub_id_problem` and `revision_problem` let through, so it never climbs out of the store."""
    return f"{HUB}/{hub_id}/{revision}"
