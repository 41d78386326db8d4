"""Where a scenario may read other files from: the scenario tree.

A scenario someone else wrote must not make cptest read, and then quote in an error message, a file
of the machine that runs it (`extends "/proc/self/environ"`, `extends "/etc/passwd"`). So an
`extends` target is a `.cps` file whose real path (symlinks followed) lies inside the scenario
tree: the folder of the scenario file cptest was given, or the committed `scenarios/` folder of the
checkout cptest runs from (its shared defaults are trusted as cptest's own code is). A target
elsewhere is refused before it is opened, and the refusal names the path, never its content. For
the same reason a local model's `config.json` is read only inside the tree (`outside_tree`).
"""

from __future__ import annotations

import os

from cptest.paths import checkout

SUFFIX = ".cps"


def scenario_roots(base_dir: str) -> tuple[str, ...]:
    """The folders an `extends` chain that starts in `base_dir` may read from, real paths."""
    roots = [os.path.realpath(base_dir or os.getcwd())]
    root = checkout()
    if root is not None and (root / "scenarios").is_dir():
        roots.append(os.path.realpath(root / "scenarios"))
    return tuple(roots)


def within(path: str, root: str) -> bool:
    """True when the real path `path` is `root` or lies below it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def outside_tree(path: str, roots: tuple[str, ...]) -> bool:
    """True when `path`'s real path lies in none of the scenario tree's `roots`."""
    real = os.path.realpath(path)
    return not any(within(real, r) for r in roots)


def include_problem(written: str, path: str, roots: tuple[str, ...]) -> tuple[str, str] | None:
    """Why `extends "<written>"` (resolved to `path`) may not be read, as (message, hint), or None."""
    if written.startswith("~"):
        return (f"extends {written!r}: '~' is not expanded; name a file of the scenario tree",
                "write the path relative to the scenario's folder")
    if not path.endswith(SUFFIX):
        return (f"extends {written!r}: not a scenario file (a {SUFFIX} file is expected)",
                "extends names a defaults file of the scenario tree")
    real = os.path.realpath(path)
    if outside_tree(path, roots):
        where = f" (it resolves to {real})" if real != os.path.normpath(path) else ""
        return (f"extends {written!r} lies outside the scenario tree{where}; it was not read",
                f"copy the file into {roots[0]} and extend it from there")
    return None
