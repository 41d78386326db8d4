"""The commands that read and write scenario files: validate, fmt, lint, compile, schema."""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path
from typing import Any

import click

from cptest.cli.common import (
    emit,
    finding_json,
    guard,
    ids_option,
    json_option,
    parse_placement,
)


def _scenario_paths(paths: tuple[Path, ...]) -> list[Path]:
    """The files named, and the .cps files directly in each folder named (as `cptest suite` reads a
    folder: its `defaults/` and other subfolders are not scenarios). A path that does not exist stays,
    so that its command says so beside the others' results."""
    from cptest.errors import Problem, ScenarioError
    from cptest.suite.runner import scenarios_in

    out: list[Path] = []
    for p in paths:
        if not p.is_dir():
            out.append(p)
            continue
        found = scenarios_in(p)
        if not found:
            raise ScenarioError(Problem(None, f"{p}: no .cps file directly in this folder",
                                        hint="name the scenario files, or the folder that holds them"))
        out.extend(found)
    return out


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@json_option
@guard
def validate(files: tuple[Path, ...], as_json: bool) -> int:
    """Parse and check scenario files (or the .cps files of folders); report every problem with
    file:line:col."""
    from cptest.errors import ScenarioError
    from cptest.interface import problem_json
    from cptest.lang import parse_file
    from cptest.plan.flags import flag_problems

    results, code = [], 0
    for f in _scenario_paths(files):
        try:
            # The release's flag table judges each pass-through flag's values; the language stage
            # knows no release.
            bad_flags = flag_problems(parse_file(f))
            if bad_flags:
                raise ScenarioError(bad_flags, sources={str(f): _read(f)})
            results.append({"file": str(f), "ok": True, "problems": []})
            if not as_json:
                click.echo(f"ok  {f}")
        except ScenarioError as e:
            code = 2
            results.append({"file": str(f), "ok": False, "problems": [problem_json(p) for p in e.problems]})
            click.echo(e.render(), err=True)
    if as_json:
        emit({"ok": code == 0, "files": results}, True, "")
    return code


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--check", is_flag=True, help="exit 1 with a diff if a file is not canonical; write nothing")
@json_option
@guard
def fmt(files: tuple[Path, ...], check: bool, as_json: bool) -> int:
    """Rewrite scenario files (or the .cps files of folders) in canonical form (comments kept)."""
    from cptest.lang import format_text

    code, done = 0, []
    for f in _scenario_paths(files):
        text = _read(f)
        out = format_text(text, str(f))
        entry: dict[str, Any] = {"file": str(f), "canonical": out == text, "written": False, "diff": None}
        done.append(entry)
        if out == text:
            continue
        if check:
            code = 1
            entry["diff"] = "".join(difflib.unified_diff(text.splitlines(True), out.splitlines(True),
                                                         str(f), f"{f} (formatted)"))  # fmt: skip
            if not as_json:
                sys.stdout.write(entry["diff"])
        else:
            f.write_text(out, encoding="utf-8")
            entry["written"] = True
            if not as_json:
                click.echo(f"formatted {f}")
    if as_json:
        emit({"check": check, "files": done}, True, "")
    return code


@click.command()
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option("--evidence", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="test every release rule against the archives under this folder instead")
@json_option
@guard
def lint(files: tuple[Path, ...], evidence: Path | None, as_json: bool) -> int:
    """Compare what each scenario (or each .cps file of a folder) expects with what its pinned SGLang
    release is known to do; with --evidence DIR, mark each release rule confirmed, refuted or
    untested by the archives in DIR."""
    from cptest.errors import Problem, ScenarioError
    from cptest.lang import parse_file
    from cptest.plan.lint import lint as lint_scenario

    if evidence is not None:
        if files:
            raise ScenarioError("cptest lint: give scenario files or --evidence DIR, not both")
        return _lint_evidence(evidence, as_json)
    if not files:
        raise ScenarioError(Problem(None, "cptest lint: no scenario file given",
                                    hint="cptest lint FILE... | cptest lint --evidence DIR"))

    files = tuple(_scenario_paths(files))
    found = []
    for f in files:
        for finding in lint_scenario(parse_file(f)):
            found.append(finding_json(f, finding))
            if not as_json:
                click.echo(finding.render())
    if as_json:
        emit({"files": [str(f) for f in files], "findings": found,
               "blocking": sum(x["blocks"] for x in found)}, True, "")
    elif not found:
        click.echo(f"lint: {len(files)} file(s), no findings")
    return 1 if any(x["blocks"] for x in found) else 0


def _lint_evidence(root: Path, as_json: bool) -> int:
    """`cptest lint --evidence DIR`: exit 1 when an archive refutes a rule, else 0."""
    from cptest.checks.hypotheses import judge

    judged = judge(root)
    rows = [{"release": t.release, "rule": t.code, "stage": t.stage, "provenance": t.provenance,
             "evidence": t.evidence, "status": t.status,
             "archives": [{"archive": a, "outcome": o, "why": w} for a, o, w in t.seen]}
            for t in judged.rules]
    if as_json:
        click.echo(json.dumps({"archives": judged.archives, "rules": rows,
                               "skipped": [{"archive": a, "why": w} for a, w in judged.skipped]}, indent=2))
    else:
        click.echo(f"{judged.archives} SGLang archive(s) under {root}")
        click.echo(f"{'release':<8} {'rule':<30} {'stage':<13} {'known as':<9} {'archives say':<12} "
                   "confirm/refute/untested")
        for t in judged.rules:
            n = {o: sum(1 for _, x, _ in t.seen if x == o) for o in ("confirmed", "refuted", "untested")}
            click.echo(f"{t.release:<8} {t.code:<30} {t.stage:<13} {t.provenance:<9} {t.status:<12} "
                       f"{n['confirmed']}/{n['refuted']}/{n['untested']}")
        for t in judged.rules:
            for a, o, w in t.seen:
                if o == "refuted":
                    click.echo(f"refuted: {t.release} {t.code} by {a}: {w}")
        for a, w in judged.skipped:
            click.echo(f"skipped: {a}: {w}")
    return 1 if any(t.status == "refuted" for t in judged.rules) else 0


LWS_CLAIMS = ("cptest-models", "cptest-evidence", "cptest-source")
"""`compile --target lws`'s default volume claims: the model store, the probe's evidence, cptest's
source (the reference engine's pods run cptest from it)."""


@click.command(name="compile")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--target", type=click.Choice(["plan", "lws"]), default="plan", show_default=True,
              help="plan: the plan; lws: Kubernetes LeaderWorkerSet and Service YAML per server "
                   "(docs/kubernetes.md)")
@click.option("--image", default=None, help="lws: the image the pods run (default: the plan's, else the "
                                            "lock's image for the engine); name it by digest")
@click.option("--models-claim", default=LWS_CLAIMS[0], show_default=True,
              help="lws: the PersistentVolumeClaim holding the model store")
@click.option("--evidence-claim", default=LWS_CLAIMS[1], show_default=True,
              help="lws: the PersistentVolumeClaim the probe writes rank files to")
@click.option("--source-claim", default=LWS_CLAIMS[2], show_default=True,
              help="lws: the PersistentVolumeClaim holding cptest's source (cptest/ at its root), which the "
                   "reference engine's pods run")
@click.option("--placement", "placement_mode", type=click.Choice(["physical", "colocated"]),
              default="physical", show_default=True,
              help="colocated: the plan of every rank as its own local node process, ranks sharing GPUs "
                   "(docs/placement.md)")
@ids_option("--gpus", "physical GPUs for the servers, e.g. 2,3")
@json_option
@guard
def compile_(file: Path, target: str, image: str | None, models_claim: str, evidence_claim: str,
             source_claim: str, placement_mode: str, gpus: str | None, as_json: bool) -> int:
    """Print the plan of a scenario (argv, GPUs, environment, requests, faults, expectations, pins),
    or with --target lws its Kubernetes manifests."""
    from cptest.lang import parse_file
    from cptest.plan import plan

    claims = (models_claim, evidence_claim, source_claim)
    if target != "lws" and (image is not None or claims != LWS_CLAIMS):
        raise click.UsageError("--image, --models-claim, --evidence-claim and --source-claim go with "
                               "--target lws")
    if target == "lws" and placement_mode == "colocated":
        raise click.UsageError("--placement colocated is a plan for one machine; a LeaderWorkerSet places "
                               "one rank per GPU")
    place = parse_placement(gpus, None, None).model_copy(update={"mode": placement_mode})
    p = plan(parse_file(file), placement=place)
    if target == "lws":
        return _compile_lws(p, image, claims, as_json)
    if as_json:
        click.echo(p.model_dump_json(indent=2))
        return 0
    for server in p.servers():
        colo = server.colocation
        where = (f", co-located: ranks on GPUs {colo.rank_gpus}, mem fraction {colo.mem_fraction} "
                 f"({colo.mem_fraction_basis})" if colo else "")
        click.echo(f"{server.role}: {server.engine} {server.release}, world {server.world_size}, "
                   f"eager {server.eager}{where}")
        for node in server.nodes:
            click.echo(f"  node {node.node_rank} gpus {node.gpu_ids}: {' '.join(node.argv)}")
    w = p.workload
    click.echo(f"workload: {len(w.requests)} requests, concurrency {w.concurrency}, rate {w.rate_per_s}")
    for f in p.faults:
        click.echo(_fault_text(f))
    for e in p.expectations:
        fields = e.model_dump(exclude={"kind", "role", "expect_violation", "source"})
        click.echo(f"expect {e.kind}{' (violation expected)' if e.expect_violation else ''}: {fields}")
    return 0


def _compile_lws(p: Any, image: str | None, claims: tuple[str, str, str], as_json: bool) -> int:
    """`compile --target lws`: the manifests on stdout (YAML, or CompileLwsOut under --json), what the
    user must still do (an image to pin, cptest's source to provide) on stderr."""
    from cptest.k8s import image as images
    from cptest.k8s.render import Volumes, render
    from cptest.k8s.yaml_text import dump

    out = render(p, images.resolve(p, image), Volumes(*claims))
    text = dump(out.objects, [f"cptest compile --target lws: scenario {p.scenario}, plan sha256 "
                              f"{out.plan_sha256}", "rendered offline, never applied by cptest "
                              "(docs/kubernetes.md)"])
    if as_json:
        kinds = [{"kind": o["kind"], "name": o["metadata"]["name"],
                  "role": o["metadata"]["labels"]["cptest/role"]} for o in out.objects]
        emit({"target": "lws", "scenario": p.scenario, "plan_sha256": out.plan_sha256,
               "objects": kinds, "manifests": out.objects, "yaml": text, "notes": out.notes}, True, "")
    else:
        click.echo(text, nl=False)
    for note in out.notes:
        click.echo(f"cptest: {note}", err=True)
    return 0


def _fault_text(f: Any) -> str:
    """Every field of a planned fault, its trigger included: `fault 0: kill rank 1 after 8 requests
    (process title sglang::scheduler_TP1)`; a field without a phrase of its own is shown as `name value`."""
    words = [f"fault {f.index}: {f.action} {f.target}" + (f" {f.rank}" if f.rank is not None else "")]
    phrases = {"at_s": "at {} s", "after_requests": "after {} requests",
               "after_decode_steps": "after {} decode steps", "heal_after_s": "healed (SIGCONT) after {} s",
               "process_title": "(process title {})"}  # fmt: skip
    shown = {"index", "action", "target", "rank"}
    for name, value in f.model_dump().items():
        if name in shown or value is None:
            continue
        words.append(phrases[name].format(value) if name in phrases else f"{name} {value}")
    return " ".join(words)


@click.command()
@click.option("--command", "command_name", metavar="NAME",
              help="the JSON Schema of this command's --json output instead (`cptest schema --list`)")
@click.option("--list", "list_", is_flag=True, help="the commands whose --json output has a schema")
@json_option
@guard
def schema(command_name: str | None, list_: bool, as_json: bool) -> int:
    """Print the JSON Schema of the scenario model; with --command NAME, the schema of that command's
    --json output (every command has one); --list names them."""
    from cptest import interface
    from cptest.errors import Problem, ScenarioError, did_you_mean, one_of
    from cptest.scenario import json_schema

    if list_:
        emit({"commands": list(interface.OUTPUTS)}, as_json, "\n".join(interface.OUTPUTS))
        return 0
    if command_name is None:
        click.echo(json.dumps(json_schema(), indent=2))
        return 0
    name = interface.command_name(command_name)
    if name is None:
        near = did_you_mean(command_name, interface.OUTPUTS)
        raise ScenarioError(Problem(None, f"cptest schema: no command {command_name!r}",
                                    expected=one_of(interface.OUTPUTS),
                                    hint=f"did you mean {near!r}?" if near else "cptest schema --list"))
    click.echo(json.dumps(interface.schema_of(name), indent=2))
    return 0


def _read(path: Path) -> str:
    from cptest.pipeline import read_text

    return read_text(path)


COMMANDS = (validate, fmt, lint, compile_, schema)
