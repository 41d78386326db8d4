"""An archive's scenario as the run read it: its `extends` files come from the archive's own
`includes/` folder, never from wherever the checkout is now. Where the run
stores them (`include_name`) and how a check, a rerun or a report reads them back (`parse_archived`)
are one module, so the two cannot drift."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from cptest import store
from cptest.lang.files import read_path
from cptest.scenario import Scenario

UP = "@up"
"""How a `..` of an include's path relative to the scenario is spelled under `includes/`."""


def include_name(include: Path, scenario_file: Path) -> str:
    """Where an extended file is stored in the archive: under `includes/`, by its path relative to
    the scenario's folder with each `..` spelled `@up` (`defaults/tiny.cps` ->
    `includes/defaults/tiny.cps`, `../common/x.cps` -> `includes/@up/common/x.cps`). An include can
    therefore never alias one of cptest's own files (`logs/main-node0.log`, `scenario.cps`), and
    `archived_reader` finds it again by the path the archived scenario names."""
    rel = os.path.relpath(os.path.abspath(include), os.path.dirname(os.path.abspath(scenario_file)))
    return _stored_include(rel)


ABS = "@abs"
"""Under `includes/`, the folder of the extends files a scenario named by an absolute path."""


def _absolute_include(path: str) -> str:
    parts = [p for p in Path(os.path.normpath(os.path.abspath(path))).parts[1:] if p not in ("..", ".")]
    return "/".join([store.INCLUDES, ABS, *parts])


def _stored_include(rel: str) -> str:
    parts = [UP if p == ".." else p for p in Path(os.path.normpath(rel)).parts if p not in ("", ".")]
    return "/".join([store.INCLUDES, *parts])


OWN_NAMES = frozenset({store.SCENARIO, store.PLAN, store.MANIFEST, store.VERDICT, store.REPORT,
                       store.REPORT_HTML, store.JUNIT, "evidence", "logs", store.INCLUDES})
"""cptest's own names at the top of an archive: never an include, whatever a scenario says."""


def archived_reader(archive: Path) -> Callable[[str], str]:
    """The file reader the archived scenario.cps is parsed with: a path inside the archive is read
    from `includes/` (`include_name`); an archive made before includes had their own folder kept
    them beside the scenario, which is read only when the name is none of cptest's own
    (`OWN_NAMES`); a path outside the archive is read from `includes/@abs/<the path>` when the run
    stored it there (an extends named by an absolute path), else only a local model's config.json
    is read, where it is.
    Nothing is read through a link inside the archive, and nothing but a regular file anywhere
    (a FIFO would block): those raise IntegrityError (exit 3)."""
    root = os.path.abspath(archive)

    def read(path: str) -> str:
        rel = os.path.relpath(os.path.abspath(path), root)
        stored = archive / _stored_include(rel)
        if store.existing_file(stored):
            return store.read_file(stored)
        parts = Path(rel).parts
        if parts and parts[0] == ".." and store.existing_file(archive / _absolute_include(path)):
            return store.read_file(archive / _absolute_include(path))
        if parts and parts[0] != "..":
            if parts[0] in OWN_NAMES:
                raise FileNotFoundError(f"{rel} is one of cptest's own files, never an include")
            if store.existing_file(archive / rel):  # an archive made before includes had their own folder
                return store.read_file(archive / rel)
            raise FileNotFoundError(f"not in the archive: {rel}")
        if os.path.basename(path) != "config.json":  # the only file outside an archive it may name
            raise FileNotFoundError(f"outside the archive: {path}")
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise IsADirectoryError(f"{path} is not a regular file")
        return read_path(path)

    return read


def parse_archived(archive: Path) -> Scenario:
    """The archived scenario.cps, its includes read by `archived_reader`. Raises ScenarioError for
    a scenario that does not parse, IntegrityError for one that is not a regular file."""
    from cptest.lang.syntax import read_doc
    from cptest.lang.validate import resolve

    path = store.Layout(archive).scenario
    text = store.read_file(path)
    # The archive is the tree: `archived_reader` serves an extends above the scenario's folder from
    # the archive's own `includes/`, and reads nothing of the machine but a local model's config.json.
    return resolve(read_doc(text, str(path)), os.path.abspath(archive), read=archived_reader(archive),
                   tree=(os.sep,))
