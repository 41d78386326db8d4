"""Public entry of the language stage: `.cps` text or file -> checked `Scenario`.

`parse_text` and `parse_file` are pure apart from reading the files a scenario names (its `extends`
chain and a local model's `config.json`).  They raise `ScenarioError` and nothing else: syntax errors
carry the position and what was expected there; semantic errors are all collected and reported
together, sorted by position.
"""

from __future__ import annotations

import os

from cptest.errors import Problem, ScenarioError, Span
from cptest.lang.files import read_path
from cptest.lang.syntax import read_doc
from cptest.lang.validate import resolve
from cptest.scenario import Scenario


def parse_text(text: str, filename: str = "<input>", *, base_dir: str | None = None) -> Scenario:
    """Parse and check one scenario given as text.

    `base_dir` is where relative paths (extends, model local, dataset) resolve; by default the
    directory of `filename` if it names one, else the current directory.
    """
    if base_dir is None:
        base_dir = os.path.dirname(filename) if not filename.startswith("<") else os.getcwd()
    doc = read_doc(text, filename)
    return resolve(doc, base_dir or os.getcwd())


def parse_file(path: str | os.PathLike[str]) -> Scenario:
    """Parse and check the scenario in `path` (relative paths resolve against its directory)."""
    path = os.fspath(path)
    try:
        text = read_path(path)
    except (OSError, UnicodeDecodeError) as err:
        raise ScenarioError(Problem(Span(path, 1, 1), f"cannot read scenario file: {err}")) from None
    return parse_text(text, path, base_dir=os.path.dirname(os.path.abspath(path)))
