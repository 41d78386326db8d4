"""The shape of cptest's knowledge of an SGLang release: admission rules, log patterns, support
entries. The tables themselves are `releases.py` and its per-release modules."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal

Stage = Literal["parse", "worker_start", "runtime", "silent"]
"""Where a rule fires: `parse` (launcher exits before any GPU work), `worker_start` (every scheduler
raises in `initialize_model_parallel`), `runtime` (first forward), `silent` (no error; wrong or
degraded behaviour that only evidence can show)."""

Support = Literal["supported", "untested", "rejected", "silently-wrong", "runtime-error"]
Provenance = Literal["observed", "inferred"]
"""How a rule is known: `observed` (an archive or a test that ran this release showed it: `evidence`
names it) or `inferred` (read in the release's source, `citation`; a hypothesis until a run shows
it). Lint blocks a run only on an observed rule."""
PARSER_TEST = ("tests/engines/sglang/test_sglang_parser.py::test_parse_stage_predictions_match_sglang "
               "(the release's own ServerArgs.from_cli_args, in CI)")
DIFFERENTIAL_TEST = ("tests/sglang_src/test_rules_differential.py (the release's own parser, ServerArgs and "
                     "initialize_model_parallel on generated launches, in CI)")


@dataclass(frozen=True)
class Rule:
    """One admission rule: when it fires, SGLang's exact message, and where it is in the release.

    `message` is a `str.format` template over `LaunchConfig` fields (`{tp}`, `{dcp}`, ...); the
    rendered text is what SGLang prints (after the exception type). `None` means the release has no
    message for it (a `silent` rule).
    """

    code: str
    stage: Stage
    exception: str | None
    message: str | None
    citation: str
    note: str = ""
    provenance: Provenance = "inferred"
    evidence: str = ""
    """For an observed rule: the archive (`results/<scenario>/<run>`) or test that showed it."""


@dataclass(frozen=True)
class LogPattern:
    """A log line cptest parses. `regex` is searched (not matched) in one line, named groups are figures."""

    regex: str
    citation: str
    present: bool = True
    """False: the line does not exist in this release; parsers must not wait for it."""

    @functools.cached_property
    def compiled(self) -> re.Pattern[str]:
        return re.compile(self.regex)


@dataclass(frozen=True)
class SupportEntry:
    status: Support
    citation: str
    note: str = ""
