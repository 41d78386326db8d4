"""The `cptest` command: parses arguments, calls `cptest.pipeline` (or one stage), prints.

Exit codes: 0 ok/pass, 1 lint findings/fail/would reformat, 2 bad input, 3 unknown verdict or
infrastructure failure; each command's are in README.md's command table (tests/test_cli_interface.py
runs every one). `--json` prints one JSON object on stdout, the command's output model or an error
(`cptest/interface.py`, served by `cptest schema --command NAME`)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from cptest import __version__
from cptest.cli import archives, authoring, running, stores
from cptest.cli.archives import matrix_judge
from cptest.cli.authoring import LWS_CLAIMS
from cptest.cli.common import RESULTS, RUNS, parse_placement, verdict_text
from cptest.cli.running import run
from cptest.sources_cli import sources_group  # its own module: the command is self-contained


class _Cli(click.Group):
    """The command group: a usage error (missing argument, no such directory, bad option) is exit 2
    as click makes it, and under `--json` also an ErrorOut on stdout, like every other error."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        argv = [str(a) for a in (sys.argv[1:] if args is None else args)]
        try:
            return super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as e:
            words = argv[: argv.index("--")] if "--" in argv else argv
            if "--json" in words:
                click.echo(json.dumps({"error": "UsageError", "exit_code": e.exit_code, "problems": [
                    {"where": None, "file": None, "line": None, "col": None, "message": e.format_message(),
                     "hint": "cptest --help"}]}, indent=2))  # fmt: skip
            e.show()
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cptest")
def main() -> None:
    """Qualify SGLang prefill/decode context parallelism with rank-local evidence."""


for command in (*authoring.COMMANDS, *running.COMMANDS, *archives.COMMANDS, *stores.COMMANDS, sources_group):
    main.add_command(command)

# What callers outside the package name through `cptest.cli` (tests, benchmarks).
__all__ = ["LWS_CLAIMS", "RESULTS", "RUNS", "main", "matrix_judge", "parse_placement", "run", "verdict_text"]
