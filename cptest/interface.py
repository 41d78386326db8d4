"""The machine interface of the `cptest` command: one output model per command (README.md, "Commands").

Every command prints, under `--json`, exactly one JSON object on stdout: its output model below, or
`ErrorOut` when it stops on an error (bad input, an unreadable archive, a cause on the machine). The
JSON Schema of each command's output is `schema_of(name)`, served by `cptest schema --command NAME`
(`cptest schema --list` names them). The models are pydantic so that the same classes give the
documents and validate the command's real output in the tests (tests/test_cli_interface.py): a field
added to a command without its model is caught there (`extra="forbid"`).

The exit codes of each command are written once, in README.md's command table; the same test runs
every command through each code the table documents.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, RootModel, TypeAdapter

from cptest.errors import Problem
from cptest.plan.model import Plan
from cptest.topology import PlacementMode
from cptest.verdict import ScenarioVerdict


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ------------------------------------------------------------------------------ shared parts
class ProblemOut(_Out):
    """One problem with its position: `where` is `file:line:col` as the text output prints it; `file`,
    `line` and `col` are the same, separated (None when the problem has no position)."""

    where: str | None
    file: str | None
    line: int | None
    col: int | None
    end_line: int | None = None
    end_col: int | None = None
    message: str
    expected: str | None = None
    found: str | None = None
    hint: str | None = None


def problem_json(p: Problem) -> dict[str, Any]:
    s = p.span
    return {"where": str(s) if s else None, "file": s.file if s else None, "line": s.line if s else None,
            "col": s.col if s else None, "end_line": (s.end_line or None) if s else None,
            "end_col": (s.end_col or None) if s else None, "message": p.message, "expected": p.expected,
            "found": p.found, "hint": p.hint}  # fmt: skip


class CauseOut(_Out):
    code: str
    message: str
    remedy: str


class ErrorOut(_Out):
    """What every command prints under `--json` when it stops on an error instead of its output."""

    error: str
    """The error's type: ScenarioError, PlanError (2), RunError, EvidenceError, IntegrityError (3),
    UsageError (2: click refused the arguments), Interrupted (3)."""
    exit_code: int
    problems: list[ProblemOut]
    status: Literal["unknown"] | None = None
    """Only for a cause on the machine found before launch (preflight): the run is unknown."""
    causes: list[CauseOut] | None = None


class VerdictOut(ScenarioVerdict):
    """A scenario's verdict (verdict.json) and the archive it judges."""

    model_config = ConfigDict(extra="forbid")
    archive: str


class FindingOut(_Out):
    scenario: str
    """The scenario file linted."""
    file: str
    """The file the finding is in (the scenario, or a file it extends)."""
    where: str | None
    line: int | None
    col: int | None
    code: str
    message: str
    citation: str
    provenance: Literal["observed", "inferred"]
    evidence: str
    blocks: bool


# ------------------------------------------------------------------------------ authoring
class ValidatedFile(_Out):
    file: str
    ok: bool
    problems: list[ProblemOut]


class ValidateOut(_Out):
    ok: bool
    files: list[ValidatedFile]


class FormattedFile(_Out):
    file: str
    canonical: bool
    """Whether the file was already in canonical form."""
    written: bool
    diff: str | None
    """With --check, the unified diff of what formatting would change."""


class FmtOut(_Out):
    check: bool
    files: list[FormattedFile]


class LintOut(_Out):
    files: list[str]
    findings: list[FindingOut]
    blocking: int
    """Findings of `observed` rules: any is exit 1 and blocks `cptest run`."""


class RuleArchiveOut(_Out):
    archive: str
    outcome: Literal["confirmed", "refuted", "untested"]
    why: str


class RuleOut(_Out):
    release: str
    rule: str
    stage: str
    provenance: str
    evidence: str
    status: Literal["confirmed", "refuted", "untested"]
    archives: list[RuleArchiveOut]


class SkippedOut(_Out):
    archive: str
    why: str


class LintEvidenceOut(_Out):
    """`cptest lint --evidence DIR`."""

    archives: int
    rules: list[RuleOut]
    skipped: list[SkippedOut]


class SchemaListOut(_Out):
    commands: list[str]


class ManifestObjectOut(_Out):
    kind: Literal["LeaderWorkerSet", "Service"]
    name: str
    role: Literal["main", "baseline", "control", "eager"]


class CompileLwsOut(_Out):
    """`compile --target lws --json`: the Kubernetes objects of every server (docs/kubernetes.md)."""

    target: Literal["lws"]
    scenario: str
    plan_sha256: str
    """sha256 of the plan's compact JSON (`Plan.model_dump_json()`; the manifests' `cptest/plan-sha256`)."""
    objects: list[ManifestObjectOut]
    """Kind, name and server role of each object, in the order of `manifests`."""
    manifests: list[dict[str, Any]]
    """The objects themselves: per server a LeaderWorkerSet, then its leader's Service."""
    yaml: str
    """The same objects as the multi-document YAML `compile --target lws` prints."""
    notes: list[str]
    """What is left to the user (an image not pinned by digest)."""


# ------------------------------------------------------------------------------ running
class RunBlockedOut(_Out):
    """`cptest run` stopped by lint findings of observed rules (exit 1): nothing launched."""

    launched: Literal[False]
    blocked_by: Literal["lint"]
    findings: list[FindingOut]


class SuiteScenarioOut(_Out):
    file: str
    scenario: str
    status: str | None
    exit_code: int | None
    archive: str | None
    not_run: str | None
    demand: dict[str, Any] | None
    placement: dict[str, Any] | None
    started_s: float | None
    ended_s: float | None
    duration_s: float | None


class SuiteMachineOut(_Out):
    gpus: dict[str, int]
    cpus: list[int]
    client_cpus: list[int]


class SuiteOut(_Out):
    suite_version: int
    folder: str
    machine: SuiteMachineOut
    jobs: int | None
    wall_s: float
    gpu_seconds_held: float
    gpu_seconds_busy: float
    scenarios: list[SuiteScenarioOut]
    counts: dict[str, int]


class DiffEntryOut(_Out):
    what: str
    subject: str
    item: int | None
    field: str
    a: Any
    b: Any
    kind: str
    within: bool
    why: str


class TolerancesOut(_Out):
    logprob: float | None
    logprob_from: str
    logprob_default_ulps: int
    capacity: float
    capacity_from: str


class DiffOut(_Out):
    a: str
    b: str
    scenario: str
    scenario_b: str
    placement_a: PlacementMode
    placement_b: PlacementMode
    """When they differ, the speed and memory figures are entries of kind `not comparable`."""
    same: bool
    differences: int
    within: int
    tolerances: TolerancesOut
    entries: list[DiffEntryOut]


class RerunOut(VerdictOut):
    """The new run's verdict, its archive, and the evidence diff against the archive rerun."""

    diff: DiffOut


class StartupServerOut(_Out):
    archive: str
    scenario: str
    role: str
    phases: dict[str, float | None]
    total_s: float | None


class StartupOut(_Out):
    servers: list[StartupServerOut]


# ------------------------------------------------------------------------------ archives
class CheckOut(VerdictOut):
    differs: bool
    """Whether the recomputed verdict differs from the archive's verdict.json."""


class VerifyOut(_Out):
    archive: str
    ok: bool
    problems: list[ProblemOut]


class SourceFindingOut(_Out):
    key: str
    file: str
    lines: list[int]
    anchor: str
    also: list[str]
    """Further anchors that must occur in the same lines (a flag's literal beside its field)."""
    status: Literal["moved", "not_found", "no_file", "out_of_range"]
    found_at: list[int]
    """Lines of the file where the anchor is now (moved)."""
    cited_by: list[str]
    """`file:line` of each doc or module text that cites it."""


class SourcesCheckOut(_Out):
    release: str
    source: str
    citations: int
    flag_declarations: int
    """The CLI flags whose declaration line in `server_args.py` was checked with the citations."""
    ok: bool
    problems: list[SourceFindingOut]


class ReportOut(_Out):
    archive: str
    markdown: str | None = None
    """The report recomputed from the archive's evidence (report.md's text); without --html."""
    html: str | None = None
    """The HTML page, with --html."""
    output: str | None = None
    """The file the report was written to (`-o FILE`), or None when it was printed."""


class MatrixRowOut(_Out):
    scenario: str
    engine: str
    placement: PlacementMode
    """`colocated`: the ranks shared GPUs (semantics, never speed); such an archive has its own row."""
    status: str
    contracts: dict[str, str]
    """Each checker's status in this archive (`pass (no-go seen)` for a declared violation seen)."""
    archive: str
    older: int
    """Older archives of the same scenario, engine and placement under the folders read (not in the row)."""
    analysis: str | None = None
    """`re-analysis <UTC time> of seal <sha256[:12]>` when the row's verdict is that of a re-analysis
    beside the archive's seal; None: the seal's own verdict."""


class MatrixOut(_Out):
    published: list[str]
    """The folders read: published evidence (default `results/`)."""
    rows: list[MatrixRowOut]
    markdown: str


class SupportCellOut(_Out):
    family: str
    regime: str
    mode: str
    backend: str
    decode: str


class SupportRuleOut(_Out):
    code: str
    reason: str
    citation: str
    """SGLang source lines, as paths in the release's wheel (`sglang/srt/...:LINE`)."""
    provenance: Literal["observed", "inferred"]
    evidence: str


class SupportRunOut(_Out):
    archive: str
    scenario: str
    placement: PlacementMode
    """`colocated`: the run's ranks shared GPUs; the cell then says co-located beside its verdicts."""
    status: str
    contracts: dict[str, str]


class SupportEntryOut(_Out):
    state: Literal["run", "ruled out", "not yet run"]
    cell: SupportCellOut | None
    """The grid cell; None for a scenario outside the grid (`where` says its topology)."""
    where: str
    scenarios: list[str]
    note: str
    rule: SupportRuleOut | None
    runs: list[SupportRunOut]


class SupportMatrixOut(_Out):
    """`cptest matrix --support`: every cell in exactly one state."""

    release: str
    counts: dict[str, int]
    grid: list[SupportEntryOut]
    outside: list[SupportEntryOut]
    output: str | None
    skipped: list[str]
    """Scenarios or archives that did not parse, with why."""
    markdown: str


class PublishOut(_Out):
    source: str
    archive: str
    """Where the archive now lies: `<results>/<scenario>/<run>`."""
    scenario: str
    run: str
    status: Literal["pass", "fail", "unknown"]
    already_published: bool
    """The same archive (byte-identical manifest) was already there: nothing was copied."""


# ------------------------------------------------------------------------------ images, models
class ImageInputsOut(_Out):
    recipe: int
    debian: dict[str, str]
    wheels: dict[str, str]


class ImageBuildOut(_Out):
    reference: str
    digest: str
    layer: str
    layer_bytes: int
    files: int
    inputs: ImageInputsOut
    seconds: float
    loaded: bool


class MadeModelOut(_Out):
    name: str
    directory: str
    tree_sha256: str


class ModelsMakeOut(_Out):
    store: str
    models: list[MadeModelOut]


class StoredModelOut(_Out):
    name: str
    tree_sha256: str | None
    aliases: list[str]


class ModelsListOut(_Out):
    store: str
    models: list[StoredModelOut]


class ModelsAddOut(_Out):
    directory: str
    tree_sha256: str


class JsonSchemaOut(RootModel[dict[str, Any]]):
    """A JSON Schema document."""


# ------------------------------------------------------------------------------ the registry
OUTPUTS: dict[str, tuple[type[BaseModel], ...]] = {
    "validate": (ValidateOut,),
    "fmt": (FmtOut,),
    "lint": (LintOut, LintEvidenceOut),
    "compile": (Plan, CompileLwsOut),
    "schema": (SchemaListOut, JsonSchemaOut),
    "run": (VerdictOut, RunBlockedOut),
    "suite": (SuiteOut,),
    "rerun": (RerunOut,),
    "startup": (StartupOut,),
    "check": (CheckOut,),
    "verify": (VerifyOut,),
    "diff": (DiffOut,),
    "report": (ReportOut,),
    "matrix": (MatrixOut, SupportMatrixOut),
    "publish": (PublishOut,),
    "image build": (ImageBuildOut,),
    "models make": (ModelsMakeOut,),
    "models list": (ModelsListOut,),
    "models add": (ModelsAddOut,),
    "sources check": (SourcesCheckOut,),
}
"""Each command (its words as typed after `cptest`) -> the models its `--json` output may take
besides `ErrorOut` (`lint` prints `LintEvidenceOut` with --evidence; `matrix` prints
`SupportMatrixOut` with --support; `compile` prints
`CompileLwsOut` with --target lws; `run` prints `RunBlockedOut` when lint blocks it; `schema` prints
a schema document, or the names with --list)."""


def command_name(name: str) -> str | None:
    """The registry's name for `name` as a user may type it (`models-make`, `models make`), or None."""
    key = " ".join(name.replace("-", " ").split())
    key = key.removesuffix(" evidence")  # `lint --evidence` prints one of lint's two documents
    return key if key in OUTPUTS else None


def adapter(name: str) -> TypeAdapter[Any]:
    """Validates a command's `--json` output (any of its models, or ErrorOut)."""
    models = (*OUTPUTS[command_name(name) or name], ErrorOut)
    union: Any = models[0]
    for m in models[1:]:
        union = union | m
    return TypeAdapter(union)


def schema_of(name: str) -> dict[str, Any]:
    """The JSON Schema of `cptest NAME --json` output."""
    doc = adapter(name).json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"cptest {name} --json", **doc}


__all__ = ["OUTPUTS", "ErrorOut", "ProblemOut", "adapter", "command_name", "problem_json", "schema_of"]
