"""`cptest sources check`: every SGLang source line that docs and code cite, read in the release.

It checks the release's citation registry and the declaration line its flag table gives each CLI
flag. Exit 0 when every one holds (its anchor on its lines), 1 when any moved or never matched (each
named with the doc, module or flag-table line that cites it), 3 when the source cannot be had.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from cptest.engines.sglang import citations, sources
from cptest.errors import CptestError


@click.group(name="sources")
def sources_group() -> None:
    """The SGLang source lines that cptest's docs and code cite."""


@sources_group.command(name="check")
@click.option("--wheel", "wheel", type=click.Path(path_type=Path), default=None,
              help="a local wheel (verified against the pin) or an unpacked tree holding sglang/ "
                   f"(default ${sources.WHEEL_ENV}, else the pinned wheel, fetched once into the cache)")
@click.option("--installed", is_flag=True, help="read the importable sglang package instead")
@click.option("--release", type=click.Choice(citations.RELEASES), default=citations.PINNED,
              show_default=True, help="the registry to check")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output on stdout")
def check(wheel: Path | None, installed: bool, release: str, as_json: bool) -> None:
    """Check each registered citation and flag declaration: the file exists, the lines are there,
    the anchor is on them."""
    try:
        code = _check(wheel, installed, release, as_json)
    except CptestError as e:
        if as_json:
            from cptest.interface import problem_json

            click.echo(json.dumps({"error": type(e).__name__, "exit_code": e.exit_code,
                                   "problems": [problem_json(p) for p in e.problems]}, indent=2))
        click.echo(e.render(), err=True)
        sys.exit(e.exit_code)
    sys.exit(code)


def _check(wheel: Path | None, installed: bool, release: str, as_json: bool) -> int:
    registry = citations.load(release)
    if installed:
        source = sources.installed()
    else:
        given = wheel or (Path(os.environ[sources.WHEEL_ENV]) if os.environ.get(sources.WHEEL_ENV) else None)
        if given is not None and given.is_dir():
            source = sources.from_wheel(given)
        else:
            path = sources.verified(given, registry.wheel) if given else sources.fetch(registry.wheel)
            source = sources.from_wheel(path)
    declarations = citations.flag_declarations(release)
    findings = sources.check(registry.citations, source) + sources.check(declarations, source)
    refs = citations.scan()
    out = {"release": release, "source": source.label, "citations": len(registry.citations),
           "flag_declarations": len(declarations),
           "ok": not findings, "problems": [_finding_json(f, refs) for f in findings]}
    if as_json:
        click.echo(json.dumps(out, indent=2, sort_keys=True))
    else:
        click.echo(_text(out))
    return 1 if findings else 0


def _finding_json(f: sources.Finding, refs: list[citations.Reference]) -> dict[str, Any]:
    c = f.citation
    cited_by = ([citations.flag_entry_line(c.release, c.key)] if c.key.startswith("flag:")
                else citations.cited_by(c, refs))
    return {"key": c.key, "file": c.file, "lines": [c.start, c.end], "anchor": c.anchor,
            "also": list(c.also), "status": f.status, "found_at": list(f.found_at), "cited_by": cited_by}


_SAYS = {"moved": "moved", "not_found": "never matched", "no_file": "no such file",
         "out_of_range": "past the end of the file"}


def _text(out: dict[str, Any]) -> str:
    problems = out["problems"]
    total = out["citations"] + out["flag_declarations"]
    head = (f"SGLang {out['release']} ({out['source']}): {out['citations']} citations and "
            f"{out['flag_declarations']} flag declarations, {total - len(problems)} hold, "
            f"{len(problems)} do not")
    lines = [head]
    for p in problems:
        a, b = p["lines"]
        where = f"{p['file']}:{a}" + (f"-{b}" if b != a else "")
        lines.append(f"{_SAYS[p['status']]}: {p['key']} {where}: `{p['anchor']}`")
        if p["found_at"]:
            lines.append(f"  found at line {', '.join(map(str, p['found_at'][:8]))}"
                         + (" ..." if len(p["found_at"]) > 8 else ""))
        lines.append(f"  cited by {', '.join(p['cited_by']) or '(nothing in the docs or code)'}")
    return "\n".join(lines)
