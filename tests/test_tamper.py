"""The tamper suite (issue 14): archives edited, forged, linked or replaced by FIFOs, and what
`cptest check`, `verify`, `diff`, `matrix`, `report` and `rerun` make of them.

One real archive is made per module: a small DCP2 scenario on the CPU reference engine (about 20 s
on 2 cores) that extends a defaults file and declares capacity wrong on purpose, so its verdict is
FAIL and a forger has a failing expectation to drop. Every case alters a copy of it and runs one
command in a subprocess (a FIFO that were opened would block it: the timeout says so) and asserts
the documented exit code, a message naming what is wrong, no traceback, and for `rerun` that
nothing was executed: the injected `/bin/sh -c 'touch MARKER'` never ran and nothing was written
outside `--results`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.reference.conftest import free_port

REPO = Path(__file__).resolve().parents[1]
NAME = "tamper_dcp2"

SCENARIO = """cptest 1
# DCP2 on TP2, tiny: the reference archive of the tamper suite. Capacity is declared wrong on
# purpose (3x), so the archive's verdict is FAIL and a forger has a failing expectation to drop.
scenario tamper_dcp2 {
  extends "defaults/tiny.cps"
  engine reference "builtin"
  model synthetic llama {
    layers 2
    hidden 128
    heads 4
    kv_heads 1
    head_dim 32
    vocab 512
    intermediate 256
    seed 3
  }
  topology {
    gpus 2
    tp 2
    dcp 2
  }
  baseline none
  workload {
    requests 4
    concurrency 2
    prompt_tokens uniform(16, 48)
    output_tokens 4
  }
  expect {
    rows kv_owner position % 2
    capacity logical == 3 * physical within 0.01
  }
}
"""


def cptest(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cptest", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


@dataclass(frozen=True)
class Made:
    archive: Path
    models: Path


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Made:
    root = tmp_path_factory.mktemp("tamper")
    suite = root / "suite"
    (suite / "defaults").mkdir(parents=True)
    shutil.copy2(REPO / "scenarios" / "defaults" / "tiny.cps", suite / "defaults" / "tiny.cps")
    (suite / "tamper.cps").write_text(SCENARIO)
    models = root / "models"
    done = cptest(
        "run",
        suite / "tamper.cps",
        "--engine",
        "reference",
        "--ports",
        f"{free_port()},{free_port()}",
        "--no-baseline-cache",
        "--results",
        root / "results",
        "--models",
        models,
        "--json",
        timeout=600,
    )
    assert done.returncode == 1, done.stderr[-3000:]  # capacity is declared 3x: FAIL
    archive = Path(json.loads(done.stdout)["archive"])
    assert (archive / "includes" / "defaults" / "tiny.cps").is_file()
    return Made(archive, models)


# ------------------------------------------------------------------------------------ edits
def plan_of(d: Path) -> dict[str, Any]:
    return json.loads((d / "plan.json").read_text())


def edit_plan(fn: Callable[[dict[str, Any]], Any], *, forge: bool = False) -> Callable[[Path, Path], None]:
    """Edit plan.json; with `forge`, recompute verdict and manifest as a forger with cptest would."""

    def edit(d: Path, tmp: Path) -> None:
        plan = plan_of(d)
        fn(plan)
        (d / "plan.json").write_text(json.dumps(plan, indent=2))
        if forge:
            refinish(d)

    return edit


def refinish(d: Path) -> None:
    """What a forger with cptest's library does: cptest never re-seals a finished archive, so the
    forger first hand-writes the manifest back to an empty first phase, then finishes it."""
    from cptest import checks, pipeline

    m = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps(m | {"phase": "begun", "files": {}}))
    pipeline.finish_archive(d, checks.check(d, require_finished=False))


def rehash(d: Path, tmp: Path | None = None) -> None:
    """A hand rehash: the manifest's `files` table recomputed over whatever the archive holds now,
    its verdict left as it is."""
    from cptest import store

    m = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps(m | {"files": store.file_hashes(d)}))


def flip_verdict(d: Path, tmp: Path) -> None:
    """verdict.json edited from FAIL to PASS, every verdict of it passing."""
    v = json.loads((d / "verdict.json").read_text())
    v["status"] = "pass"
    for x in v["verdicts"]:
        x["status"] = "pass"
    (d / "verdict.json").write_text(json.dumps(v))


def check_write(d: Path, tmp: Path) -> None:
    """`cptest check --write` run by the forger after an edit (its refusal is the next command's
    business: nothing it wrote may make the edit pass)."""
    cptest("check", "--write", d)


FORGED = "analyses/29991231T235959Z"


def forged_analysis(d: Path, tmp: Path) -> None:
    """A re-analysis beside the seal written by hand, consistent with itself and naming the seal,
    whose verdict is PASS: its hashes verify, its verdict is not what the evidence gives."""
    import hashlib

    from cptest import store

    a = d / FORGED
    a.mkdir(parents=True)
    shutil.copy2(d / "verdict.json", a / "verdict.json")
    flip_verdict(a, tmp)
    (a / "manifest.json").write_text(json.dumps({
        "analysis_version": 1, "created": "2999-12-31T23:59:59Z", "cptest_version": "0.1.0",
        "seal": {"file": "manifest.json",
                 "sha256": hashlib.sha256((d / "manifest.json").read_bytes()).hexdigest()},
        "previous": None, "files": store.file_hashes(a, beside_seal=False)}))


def node(plan: dict[str, Any], k: int = 0) -> dict[str, Any]:
    return plan["main"]["nodes"][k]


def inject_sh(tmp: Path) -> Callable[[dict[str, Any]], None]:
    def fn(plan: dict[str, Any]) -> None:
        node(plan)["argv"] = ["/bin/sh", "-c", f"touch {tmp / 'EXECUTED'}"]

    return fn


def replace_file(rel: str, text: str | bytes) -> Callable[[Path, Path], None]:
    def edit(d: Path, tmp: Path) -> None:
        path = d / rel
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())

    return edit


def fifo(rel: str) -> Callable[[Path, Path], None]:
    def edit(d: Path, tmp: Path) -> None:
        (d / rel).unlink(missing_ok=True)
        os.mkfifo(d / rel)

    return edit


def link(rel: str, *, to_outside: bool = True) -> Callable[[Path, Path], None]:
    """`rel` becomes a symbolic link: to a copy of it outside the archive, or to another file of it."""

    def edit(d: Path, tmp: Path) -> None:
        path = d / rel
        target = tmp / f"outside-{path.name}"
        if path.is_dir():
            shutil.copytree(path, target)
            shutil.rmtree(path)
        else:
            shutil.copy2(path, target)
            path.unlink()
        path.symlink_to(target if to_outside else d / "plan.json")

    return edit


def as_dir(rel: str) -> Callable[[Path, Path], None]:
    def edit(d: Path, tmp: Path) -> None:
        (d / rel).unlink()
        (d / rel).mkdir()

    return edit


def edit_text(rel: str, old: str, new: str, *, forge: bool = False) -> Callable[[Path, Path], None]:
    def edit(d: Path, tmp: Path) -> None:
        text = (d / rel).read_text()
        assert old in text, f"{old!r} not in {rel}"
        (d / rel).write_text(text.replace(old, new))
        if forge:
            refinish(d)

    return edit


def edit_manifest(fn: Callable[[dict[str, Any]], Any]) -> Callable[[Path, Path], None]:
    def edit(d: Path, tmp: Path) -> None:
        m = json.loads((d / "manifest.json").read_text())
        fn(m)
        (d / "manifest.json").write_text(json.dumps(m))

    return edit


def drop_failing(plan: dict[str, Any]) -> None:
    plan["expectations"] = [e for e in plan["expectations"] if e["kind"] != "capacity"]


def capacity_factor(plan: dict[str, Any]) -> None:
    for e in plan["expectations"]:
        if e["kind"] == "capacity":
            e["multiplier"] = 2.0


def add_baseline(plan: dict[str, Any]) -> None:
    plan["baseline"] = {**plan["main"], "role": "baseline"}


def both(*edits: Callable[[Path, Path], None]) -> Callable[[Path, Path], None]:
    def edit(d: Path, tmp: Path) -> None:
        for e in edits:
            e(d, tmp)

    return edit


def sh_and_escape(d: Path, tmp: Path) -> None:
    plan = plan_of(d)
    inject_sh(tmp)(plan)
    plan["scenario"] = "../../escaped"
    (d / "plan.json").write_text(json.dumps(plan))
    refinish(d)


# ------------------------------------------------------------------------------------ cases
@dataclass(frozen=True)
class Case:
    id: str
    edit: Callable[[Path, Path], None]
    command: tuple[str, ...]
    """Arguments of `cptest`: `{a}` the tampered archive, `{ok}` an untouched copy, `{results}` the
    folder holding both, `{rerun}` a fresh --results for a rerun, `{models}` the model store."""
    code: int
    message: str
    """A regular expression the command's output must match: what is wrong, named."""


CHECK = ("check", "{a}")
VERIFY = ("verify", "{a}")
RERUN = ("rerun", "{a}", "--results", "{rerun}", "--models", "{models}", "--no-baseline-cache")
REPORT = ("report", "{a}")
MATRIX = ("matrix", "{results}")
DIFF = ("diff", "{ok}", "{a}")
STARTUP = ("startup", "{a}")
CHECK_WRITE = ("check", "--write", "{a}")
PUBLISH = ("publish", "{a}", "--results", "{rerun}")


def append(rel: str, text: str) -> Callable[[Path, Path], None]:
    def edit(d: Path, tmp: Path) -> None:
        with (d / rel).open("a", encoding="utf-8") as f:
            f.write(text)

    return edit


def rehashed(fn: Callable[[dict[str, Any]], Any]) -> Callable[[Path, Path], None]:
    """Edit plan.json, then rehash the manifest by hand: `verify` passes, only the re-plan can tell."""
    return both(edit_plan(fn), rehash)


def add_flag(plan: dict[str, Any]) -> None:
    node(plan)["argv"].append("--enable-foo")


def add_env(plan: dict[str, Any]) -> None:
    node(plan)["env"]["CPTEST_X"] = "1"


def absolute_model_and_flag(plan: dict[str, Any]) -> None:
    # Looks like an archive of the planner before D43 (absolute model mounts), whose listed flags
    # are tolerated: any other flag still differs.
    for n in plan["main"]["nodes"]:
        n["model_mount"] = "/abs/model"
    add_flag(plan)


def sparse_file(rel: str, size: int) -> Callable[[Path, Path], None]:
    """`rel` replaced by `size` zero bytes that take no disk: larger than cptest reads of it."""

    def edit(d: Path, tmp: Path) -> None:
        (d / rel).unlink(missing_ok=True)
        with (d / rel).open("wb") as f:
            f.truncate(size)

    return edit


def many_files(d: Path, tmp: Path) -> None:
    (d / "logs" / "many").mkdir()
    for k in range(4096):
        (d / "logs" / "many" / str(k)).touch()


LONG_LINE = '{"kind": "log", "line": "' + "x" * (4 << 20) + '"}\n'
"""A record one byte longer than a line of evidence may be, and then some."""


def stored_prompts(plan: dict[str, Any], *, change_first: bool = False) -> None:
    """Each request's prompt stored as its ids (base64), as a version 2 plan holds them; with
    `change_first`, the first request's first id is another."""
    from cptest.plan.model import PlannedRequest, encode_ids

    plan["plan_version"] = 2
    for k, r in enumerate(plan["workload"]["requests"]):
        ids = PlannedRequest.model_validate(r).input_ids
        if change_first and k == 0:
            ids[0] += 1
        r["prompt"] = encode_ids(ids)


def fifo_argument(d: Path, tmp: Path) -> None:
    shutil.rmtree(d)
    os.mkfifo(d)

CASES = [
    # 1. rerun never executes an archive's argv, env or mounts, and never writes outside --results.
    Case("rerun-argv-sh", lambda d, t: edit_plan(inject_sh(t))(d, t), RERUN, 3, r"main node 0 argv differs"),
    Case(
        "rerun-argv-sh-forged",
        lambda d, t: edit_plan(inject_sh(t), forge=True)(d, t),
        RERUN,
        3,
        r"refused: this cptest would run .* differently",
    ),
    Case(
        "rerun-env-ld-preload",
        edit_plan(lambda p: node(p)["env"].update(LD_PRELOAD="/tmp/evil.so")),
        RERUN,
        3,
        r"main node 0 env differs",
    ),
    Case(
        "rerun-image",
        edit_plan(lambda p: node(p).update(image="evil/image:latest")),
        RERUN,
        3,
        r"main node 0 image differs",
    ),
    Case(
        "rerun-model-mount",
        edit_plan(lambda p: node(p).update(model_mount="<models>/../../../etc")),
        RERUN,
        3,
        r"main node 0 model_mount differs",
    ),
    Case(
        "rerun-host",
        edit_plan(lambda p: node(p).update(host="10.0.0.1")),
        RERUN,
        3,
        r"main node 0 host differs",
    ),
    Case(
        "rerun-extra-node",
        edit_plan(lambda p: p["main"]["nodes"].append({**node(p), "node_rank": 1})),
        RERUN,
        3,
        r"main server has 2 nodes archived, 1 now",
    ),
    Case(
        "rerun-added-server",
        edit_plan(add_baseline),
        RERUN,
        3,
        r"baseline server is only in the archived plan",
    ),
    Case(
        "rerun-scenario-name-escapes",
        edit_plan(lambda p: p.update(scenario="../../escaped")),
        RERUN,
        3,
        r"plan.json names another scenario",
    ),
    Case(
        "rerun-argv-and-name-forged",
        sh_and_escape,
        RERUN,
        3,
        r"argv differs[\s\S]*another scenario|"
        r"another scenario[\s\S]*argv differs",
    ),
    Case("rerun-plan-link", link("plan.json"), RERUN, 3, r"plan.json is a symbolic link"),
    Case("rerun-scenario-fifo", fifo("scenario.cps"), RERUN, 3, r"scenario.cps is a FIFO"),
    Case(
        "rerun-model-pin-not-a-hash",
        edit_manifest(lambda m: m["pins"]["model"].update(sha256="../../x")),
        RERUN,
        3,
        r"pinned tree hash .* is not a sha256",
    ),
    Case("rerun-plan-not-json", replace_file("plan.json", "{not json"), RERUN, 3, r"bad plan"),
    Case(
        "rerun-extends-outside",
        edit_text("scenario.cps", '"defaults/tiny.cps"', '"../../../../etc/passwd"'),
        RERUN,
        2,
        r"extends '../../../../etc/passwd': not a scenario file",
    ),
    # 2. check recompiles the plan from the archived scenario; forged archives are integrity failures.
    Case(
        "check-forged-dropped-failing-expectation",
        edit_plan(drop_failing, forge=True),
        CHECK,
        3,
        r"integrity check failed: plan.json holds 6 expectations, scenario.cps compiles to 7",
    ),
    Case(
        "check-forged-expectation-parameter",
        edit_plan(capacity_factor, forge=True),
        CHECK,
        3,
        r"integrity check failed: expectation \d+ \(capacity\) differs from scenario.cps in multiplier",
    ),
    Case(
        "check-forged-world-size",
        edit_plan(lambda p: p["main"].update(world_size=1), forge=True),
        CHECK,
        3,
        r"integrity check failed: plan.json's servers",
    ),
    Case(
        "check-forged-scenario-name",
        edit_plan(lambda p: p.update(scenario="other"), forge=True),
        CHECK,
        3,
        r"integrity check failed: plan.json names another scenario",
    ),
    Case(
        "check-forged-fewer-requests",
        edit_plan(lambda p: p["workload"].update(requests=p["workload"]["requests"][:2]), forge=True),
        CHECK,
        3,
        r"integrity check failed: plan.json plans 2 requests, scenario.cps 4",
    ),
    Case(
        "check-scenario-garbage",
        replace_file("scenario.cps", "this is no scenario\n"),
        CHECK,
        3,
        r"integrity check failed: the archived scenario.cps does not compile",
    ),
    Case(
        "check-extends-own-log",
        edit_text("scenario.cps", '"defaults/tiny.cps"', '"logs/main-node0.log"'),
        CHECK,
        3,
        r"does not compile: .*extends 'logs/main-node0.log': not a scenario file",
    ),
    Case(
        "check-include-removed",
        lambda d, t: (d / "includes/defaults/tiny.cps").unlink(),
        CHECK,
        3,
        r"does not compile: .*cannot read extended file 'defaults/tiny.cps'",
    ),
    Case(
        "check-include-edited-forged",
        edit_text("includes/defaults/tiny.cps", '    log absent "Traceback"\n', "", forge=True),
        CHECK,
        3,
        r"integrity check failed: plan.json holds 7 expectations, scenario.cps compiles to 6",
    ),
    Case("check-include-link", link("includes/defaults/tiny.cps"), CHECK, 3, r"tiny.cps is a symbolic link"),
    Case("check-verdict-link", link("verdict.json"), CHECK, 3, r"verdict.json is a symbolic link"),
    Case("check-evidence-dir-link", link("evidence/main"), CHECK, 3, r"evidence/main is a symbolic link"),
    Case("check-log-link", link("logs/main-node0.log"), CHECK, 3, r"logs/main-node0.log is a symbolic link"),
    Case(
        "check-log-link-inside",
        link("logs/main-node0.log", to_outside=False),
        CHECK,
        3,
        r"logs/main-node0.log is a symbolic link",
    ),
    Case("check-log-fifo", fifo("logs/main-node0.log"), CHECK, 3, r"logs/main-node0.log is a FIFO"),
    Case("check-plan-fifo", fifo("plan.json"), CHECK, 3, r"plan.json is a FIFO"),
    Case("check-plan-directory", as_dir("plan.json"), CHECK, 3, r"plan.json is a directory"),
    Case(
        "check-rank-directory", as_dir("evidence/main/rank0.jsonl"), CHECK, 3, r"rank0.jsonl is a directory"
    ),
    Case("check-runner-fifo", fifo("evidence/main/runner.jsonl"), CHECK, 3, r"runner.jsonl is a FIFO"),
    Case("check-manifest-fifo", fifo("manifest.json"), CHECK, 3, r"manifest.json is a FIFO"),
    Case("check-plan-not-json", replace_file("plan.json", "{not json"), CHECK, 3, r"bad plan"),
    Case("check-plan-a-list", replace_file("plan.json", "[]"), CHECK, 3, r"bad plan"),
    Case(
        "check-evidence-line-malformed",
        edit_text("evidence/main/rank0.jsonl", "\n", "\n{oops\n"),
        CHECK,
        3,
        r"rank0.jsonl:2",
    ),
    Case(
        "check-scenario-not-utf8",
        replace_file("scenario.cps", b"\xff\xfe scenario"),
        CHECK,
        3,
        r"scenario.cps is not UTF-8",
    ),
    Case(
        "check-write-junit-link",
        link("junit.xml"),
        ("check", "--write", "{a}"),
        3,
        r"junit.xml is a symbolic link",
    ),
    Case(
        "check-write-manifest-link",
        link("manifest.json"),
        ("check", "--write", "{a}"),
        3,
        r"manifest.json is a symbolic link",
    ),
    # 6. malformed manifests, verdicts, plans, directories or FIFOs: a message, never a traceback.
    Case(
        "verify-manifest-not-json",
        replace_file("manifest.json", "{"),
        VERIFY,
        3,
        r"manifest.json is not JSON",
    ),
    Case("verify-manifest-a-list", replace_file("manifest.json", "[1, 2]"), VERIFY, 3, r"malformed manifest"),
    Case(
        "verify-manifest-lists-outside",
        edit_manifest(lambda m: m["files"].update({"../../x": "0" * 64})),
        VERIFY,
        3,
        r"manifest lists '../../x', which is no file of the archive",
    ),
    Case(
        "verify-manifest-hash-not-hex",
        edit_manifest(lambda m: m["files"].update({"plan.json": 5})),
        VERIFY,
        3,
        r"malformed manifest",
    ),
    Case(
        "verify-fifo-added",
        lambda d, t: os.mkfifo(d / "evidence" / "extra.jsonl"),
        VERIFY,
        3,
        r"evidence/extra.jsonl is a FIFO",
    ),
    Case(
        "verify-link-added",
        lambda d, t: (d / "extra").symlink_to("/etc/passwd"),
        VERIFY,
        3,
        r"extra is a symbolic link",
    ),
    Case("verify-manifest-link", link("manifest.json"), VERIFY, 3, r"manifest.json is a symbolic link"),
    Case("verify-manifest-directory", as_dir("manifest.json"), VERIFY, 3, r"manifest.json is a directory"),
    Case("verify-plan-edited", edit_plan(drop_failing), VERIFY, 3, r"plan.json changed since the run"),
    Case(
        "verify-manifest-missing",
        lambda d, t: (d / "manifest.json").unlink(),
        VERIFY,
        3,
        r"archive has no manifest.json",
    ),
    Case(
        "report-verdict-malformed",
        replace_file("verdict.json", '{"scenario": 1}'),
        REPORT,
        3,
        r"verdict.json changed since the run",
    ),
    Case("report-verdict-fifo", fifo("verdict.json"), REPORT, 3, r"verdict.json is a FIFO"),
    Case("report-plan-malformed", replace_file("plan.json", "{}"), REPORT, 3,
         r"plan.json changed since the run"),
    Case(
        "matrix-verdict-malformed",
        replace_file("verdict.json", "[]"),
        MATRIX,
        3,
        r"verdict.json changed since the run",
    ),
    Case("matrix-verdict-fifo", fifo("verdict.json"), MATRIX, 3, r"verdict.json is a FIFO"),
    Case("diff-plan-malformed", replace_file("plan.json", "{not json"), DIFF, 3, r"bad plan"),
    Case("diff-link", link("evidence/main/rank1.jsonl"), DIFF, 3, r"rank1.jsonl is a symbolic link"),
    Case("diff-rank-fifo", fifo("evidence/main/rank0.jsonl"), DIFF, 3, r"rank0.jsonl is a FIFO"),
    # `cptest startup` reads the engine's log and cptest's outline log as `check` reads an archive.
    Case("startup-log-link", link("logs/main-node0.log"), STARTUP, 3, r"main-node0.log is a symbolic link"),
    Case("startup-log-fifo", fifo("logs/main-node0.log"), STARTUP, 3, r"logs/main-node0.log is a FIFO"),
    Case("startup-log-directory", as_dir("logs/main-node0.log"), STARTUP, 3, r"node0.log is a directory"),
    Case("startup-outline-fifo", fifo("evidence/cptest.jsonl"), STARTUP, 3, r"cptest.jsonl is a FIFO"),
    Case("startup-outline-directory", as_dir("evidence/cptest.jsonl"), STARTUP, 3,
         r"cptest.jsonl is a directory"),
    Case("startup-outline-line-malformed", edit_text("evidence/cptest.jsonl", "\n", "\n{oops\n"), STARTUP, 3,
         r"cptest.jsonl:2: not a JSON line"),
    Case("startup-outline-line-a-list", edit_text("evidence/cptest.jsonl", "\n", "\n[1, 2]\n"), STARTUP, 3,
         r"cptest.jsonl:2: a JSON list, not an object"),
    Case("startup-outline-wall-malformed",
         append("evidence/cptest.jsonl", '{"kind": "step_start", "title": "launching main server", '
                '"wall": "yesterday"}\n'),
         STARTUP, 3, r"cptest.jsonl:\d+: `wall` 'yesterday' is not an ISO time"),
    Case("startup-outline-not-utf8", replace_file("evidence/cptest.jsonl", b"\xff\xfe{}\n"), STARTUP, 3,
         r"cptest.jsonl is not UTF-8"),
    Case("startup-log-stamp-no-date",
         append("logs/main-node0.log", "[2026-13-45 25:61:00 TP0] Load weight end\n"), STARTUP, 3,
         r"main-node0.log:\d+: the time stamp '2026-13-45 25:61:00' is no date"),
    # 7. Laundering (issue 32): a sealed archive keeps its seal; a FAIL never becomes a PASS.
    Case("check-write-after-verdict-flipped", flip_verdict, CHECK_WRITE, 3,
         r"verdict.json changed since the run"),
    Case("verify-after-verdict-flipped-and-check-write", both(flip_verdict, check_write), VERIFY, 3,
         r"verdict.json changed since the run"),
    Case("publish-after-verdict-flipped-and-check-write", both(flip_verdict, check_write), PUBLISH, 3,
         r"verdict.json changed since the run"),
    Case("matrix-after-verdict-flipped-and-check-write", both(flip_verdict, check_write), MATRIX, 3,
         r"verdict.json changed since the run"),
    Case("report-after-verdict-flipped-and-check-write", both(flip_verdict, check_write), REPORT, 3,
         r"verdict.json changed since the run"),
    Case("check-write-after-evidence-edited", edit_text("evidence/main/runner.jsonl", "shutdown_done", "x"),
         CHECK_WRITE, 3, r"evidence/main/runner.jsonl changed since the run"),
    Case("publish-after-evidence-edited-and-check-write",
         both(edit_text("evidence/main/runner.jsonl", "shutdown_done", "x"), check_write), PUBLISH, 3,
         r"evidence/main/runner.jsonl changed since the run"),
    Case("check-write-phase-set-back-to-begun",
         both(edit_manifest(lambda m: m.update(phase="begun")), flip_verdict), CHECK_WRITE, 3,
         r"verdict.json changed since the run began"),
    Case("check-write-manifest-removed", lambda d, t: (d / "manifest.json").unlink(), CHECK_WRITE, 3,
         r"archive has no manifest.json"),
    Case("matrix-forged-analysis-pass", forged_analysis, MATRIX, 3,
         r"analyses/29991231T235959Z/verdict.json is not what the evidence gives \(recomputed: fail, "
         r"archived: pass\)"),
    Case("report-forged-analysis-pass", forged_analysis, REPORT, 3,
         r"analyses/29991231T235959Z/verdict.json is not what the evidence gives"),
    Case("publish-forged-analysis-pass", forged_analysis, PUBLISH, 3,
         r"analyses/29991231T235959Z/verdict.json is not what the evidence gives"),
    Case("verify-analysis-of-another-seal",
         both(forged_analysis, edit_text(f"{FORGED}/manifest.json", '"sha256": "', '"sha256": "0')),
         VERIFY, 3, r"names another seal than this archive's manifest.json"),
    Case("verify-analysis-file-added", both(forged_analysis, lambda d, t: (d / FORGED / "x").touch()),
         VERIFY, 3, r"analyses/29991231T235959Z/x is not in its manifest"),
    Case("verify-analyses-stray-entry", lambda d, t: (d / "analyses/notes").mkdir(parents=True), VERIFY, 3,
         r"analyses/notes is not a re-analysis cptest wrote"),
    # 8. argv, env and serve are covered: a rehashed plan.json cannot change what the scenario plans.
    Case("check-argv-rehashed", rehashed(add_flag), CHECK, 3,
         r"integrity check failed: main node 0 argv differs from what scenario.cps plans"),
    Case("check-env-rehashed", rehashed(add_env), CHECK, 3,
         r"integrity check failed: main node 0 env differs from what scenario.cps plans"),
    Case("check-serve-timeout-rehashed", rehashed(lambda p: p["main"].update(shutdown_timeout_s=1.0)),
         CHECK, 3,
         r"integrity check failed: the main server's shutdown_timeout_s differs"),
    Case("check-serve-eager-rehashed", rehashed(lambda p: p["main"].update(eager=True)), CHECK, 3,
         r"integrity check failed: the main server's eager differs"),
    Case("check-workload-rehashed", rehashed(lambda p: p["workload"]["requests"][0].update(max_new_tokens=1)),
         CHECK, 3, r"integrity check failed: plan.json's workload requests differs"),
    Case("check-synthetic-prompt-moved-rehashed",
         rehashed(lambda p: p["workload"]["requests"][0]["prompt"].update(at=1)), CHECK, 3,
         r"integrity check failed: plan.json's workload requests differs"),
    Case("check-stored-prompt-changed-rehashed", rehashed(lambda p: stored_prompts(p, change_first=True)),
         CHECK, 3, r"integrity check failed: plan.json's workload requests differs"),
    Case("check-legacy-looking-argv-rehashed", rehashed(absolute_model_and_flag), CHECK, 3,
         r"main node 0 argv differs from what scenario.cps plans"),
    Case("matrix-argv-rehashed", rehashed(add_flag), MATRIX, 3, r"main node 0 argv differs from what"),
    Case("report-env-rehashed", rehashed(add_env), REPORT, 3, r"main node 0 env differs from what"),
    Case("publish-argv-rehashed", rehashed(add_flag), PUBLISH, 3, r"main node 0 argv differs from what"),
    # 9. Bounds: what is larger than cptest reads is refused unread, named, never judged.
    Case("check-evidence-file-over-its-bound", sparse_file("evidence/main/rank0.jsonl", 2 << 30), CHECK, 3,
         r"unknown +evidence: evidence larger than cptest reads was not read: .*rank0.jsonl is 2,048 MiB, "
         r"larger than an evidence file may be \(16 MiB\); not read"),
    Case("check-evidence-line-over-its-bound", append("evidence/main/runner.jsonl", LONG_LINE), CHECK, 3,
         r"runner.jsonl:\d+: a record longer than a line of an evidence file may be \(4 MiB\); not read"),
    Case("check-log-over-its-bound", sparse_file("logs/main-node0.log", 1 << 30), CHECK, 3,
         r"main-node0.log is 1,024 MiB, larger than an engine log may be \(8 MiB\)"),
    Case("check-plan-over-its-bound", sparse_file("plan.json", 2 << 30), CHECK, 3,
         r"plan.json is 2,048 MiB, larger than a plan may be \(16 MiB\); not read"),
    Case("verify-plan-over-its-bound", sparse_file("plan.json", 2 << 30), VERIFY, 3,
         r"plan.json is 2,048 MiB, larger than a plan may be \(16 MiB\)"),
    Case("verify-too-many-files", many_files, VERIFY, 3,
         r"holds more than 4,096 files and folders; not read"),
    Case("startup-outline-line-over-its-bound", append("evidence/cptest.jsonl", LONG_LINE), STARTUP, 3,
         r"cptest.jsonl:\d+: a record longer than a line of an evidence file may be"),
    Case("startup-fifo-argument", fifo_argument, STARTUP, 2, r"not a folder"),
    Case("startup-no-such-directory", lambda d, t: None, ("startup", "{a}/missing"), 2, r"does not exist"),
    Case("check-not-a-directory", lambda d, t: None, ("check", "{a}/plan.json"), 2, r"is a file"),
    Case("verify-no-such-directory", lambda d, t: None, ("verify", "{a}/missing"), 2, r"does not exist"),
]


def test_the_suite_has_forty_cases_or_more_with_unique_names() -> None:
    assert len(CASES) >= 40 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_tampered_archive_is_refused_with_a_message(case: Case, made: Made, tmp_path: Path) -> None:
    results = tmp_path / "results"
    a = results / NAME / made.archive.name
    ok = tmp_path / "pristine" / NAME / made.archive.name
    shutil.copytree(made.archive, a, symlinks=True)
    shutil.copytree(made.archive, ok, symlinks=True)
    case.edit(a, tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    args = [
        x.format(a=a, ok=ok, results=results, rerun=tmp_path / "rerun", models=made.models)
        for x in case.command
    ]
    done = cptest(*args)
    out = done.stdout + done.stderr
    assert done.returncode == case.code, out[-3000:]
    assert re.search(case.message, out), out[-3000:]
    assert "Traceback" not in out
    # Nothing executed, nothing written anywhere else: not the injected command's marker, not a
    # new archive (a refused rerun writes none), not a folder a `../` name would escape to.
    assert not (tmp_path / "EXECUTED").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not (tmp_path.parent / "escaped").exists()


def test_a_forged_archive_passes_verify_but_not_check(made: Made, tmp_path: Path) -> None:
    # The manifest hashes itself: only recompiling the scenario catches a consistent forgery.
    a = tmp_path / NAME
    shutil.copytree(made.archive, a)
    edit_plan(drop_failing, forge=True)(a, tmp_path)
    assert cptest("verify", a).returncode == 0
    assert json.loads((a / "verdict.json").read_text())["status"] == "pass"
    done = cptest("check", a)
    assert done.returncode == 3 and "integrity check failed" in done.stderr


def test_the_library_checks_integrity_by_default(made: Made, tmp_path: Path) -> None:
    # pipeline.check_archive, called as a library, refuses the consistent forgery as `cptest check`
    # does, and judges the untouched archive (FAIL: capacity) with the same default.
    from cptest import pipeline, store

    a = tmp_path / NAME
    shutil.copytree(made.archive, a)
    edit_plan(drop_failing, forge=True)(a, tmp_path)
    with pytest.raises(store.IntegrityError, match="integrity check failed"):
        pipeline.check_archive(a)
    assert pipeline.check_archive(made.archive).verdict.status == "fail"


def test_hostile_log_text_stays_text_in_report_md_and_junit_xml(made: Made, tmp_path: Path) -> None:
    # An engine log line is untrusted: the defaults' `log absent "Traceback"` quotes it in its reason.
    # Finished with it, junit.xml parses and carries it as written (what XML 1.0 forbids shown
    # as \xNN), and report.md rendered as markdown keeps its tables and shows the line as text.
    import xml.etree.ElementTree as ET

    from markdown_it import MarkdownIt

    a = tmp_path / NAME / made.archive.name
    shutil.copytree(made.archive, a)
    line = ("Traceback | a | b |`code` <script>alert(1)</script> ]]><![CDATA[ \x1b[31m\x00"
            "\r# heading\x0b| fake | row |\u2028- item")
    append("logs/main-node0.log", line + "\n")(a, tmp_path)
    refinish(a)  # as if the engine had printed it: cptest itself never re-seals an edited archive
    done = cptest("check", a)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert cptest("verify", a).returncode == 0
    verdicts = json.loads((a / "verdict.json").read_text())["verdicts"]
    (log,) = [v for v in verdicts if v["checker"] == "log" and v["status"] == "fail"]
    assert line.strip() in log["reason"]
    printed = cptest("check", a)  # the terminal gets the escape and the NUL as text, not as control codes
    assert "\\x1b[31m\\x00" in printed.stdout
    assert "\x1b" not in printed.stdout and "\x00" not in printed.stdout

    root = ET.fromstring((a / "junit.xml").read_bytes())
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == len(verdicts)
    messages = [f.get("message") for f in root.iter("failure")]
    shown = line.replace("\x1b", "\\x1b").replace("\x00", "\\x00").replace("\x0b", "\\x0b")
    assert any(m is not None and shown.strip() in m for m in messages), messages

    page = MarkdownIt("commonmark").enable("table").render((a / "report.md").read_text())
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("<h1>") == 1 and "<li>" not in page
    table = page.split("<table>")[2].split("</table>")[0]  # the verdicts' table
    assert table.count("<tr>") == 1 + len(verdicts)
    assert all(row.count("<td>") == 4 for row in table.split("<tr>")[2:])


def test_the_untouched_archive_checks_verifies_and_plans_the_same(made: Made) -> None:
    # The control of every case above.
    assert cptest("check", made.archive).returncode == 1  # its verdict: capacity FAILs
    assert cptest("verify", made.archive).returncode == 0
    assert cptest("startup", made.archive).returncode == 0


def test_a_plan_that_stores_its_prompts_plans_the_same(made: Made, tmp_path: Path) -> None:
    # A version 2 plan stores the ids that this one names in the synthetic stream: the same ids, so
    # an archive of that shape still plans what its scenario plans (its verdict: capacity FAILs).
    a = tmp_path / NAME / made.archive.name
    shutil.copytree(made.archive, a)
    rehashed(stored_prompts)(a, tmp_path)
    done = cptest("check", a)
    assert done.returncode == 1 and "integrity" not in done.stdout + done.stderr, done.stdout + done.stderr


def test_startup_forgives_what_a_run_may_leave(made: Made, tmp_path: Path) -> None:
    # The engine's log is its own bytes (not UTF-8 here), and cptest killed mid-write leaves a
    # truncated last outline line: neither is damage, and the startup table is still printed.
    a = tmp_path / NAME / made.archive.name
    shutil.copytree(made.archive, a)
    with (a / "logs" / "main-node0.log").open("ab") as f:
        f.write(b"\xff\xfe engine bytes\n")
    append("evidence/cptest.jsonl", '{"kind": "step_st')(a, tmp_path)
    done = cptest("startup", a, "--json")
    assert done.returncode == 0, done.stderr
    (server,) = [s for s in json.loads(done.stdout)["servers"] if s["role"] == "main"]
    assert server["scenario"] == NAME and set(server["phases"]) >= {"imports", "ready"}


def test_an_accepted_plan_change_still_runs_only_what_this_cptest_plans(made: Made, tmp_path: Path) -> None:
    # With --accept-plan-changes the rerun runs, but from the re-planned scenario: the archived
    # `/bin/sh` never runs and the new archive lies under --results by the scenario's own name.
    a = tmp_path / "archive" / made.archive.name
    shutil.copytree(made.archive, a)
    sh_and_escape(a, tmp_path)
    done = cptest(
        "rerun",
        a,
        "--results",
        tmp_path / "rerun",
        "--models",
        made.models,
        "--no-baseline-cache",
        "--accept-plan-changes",
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    assert "plan change accepted" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "EXECUTED").exists()
    (new,) = (tmp_path / "rerun" / NAME).iterdir()
    assert cptest("check", new).returncode == 1 and cptest("verify", new).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["archive", "rerun"]


def test_check_write_analyses_beside_the_seal_and_the_matrix_says_so(made: Made, tmp_path: Path) -> None:
    # The seal, the evidence and the original verdict.json stay byte for byte; each re-analysis has
    # its own manifest naming the seal and the one before it; verify, matrix, report and publish
    # accept it and the matrix names the re-analysis and the seal it checked.
    from cptest import analyses, store

    results = tmp_path / "results"
    a = results / NAME / made.archive.name
    shutil.copytree(made.archive, a)
    before = store.file_hashes(a) | {"manifest.json": store.sha256_file(a / "manifest.json")}
    first = cptest("check", "--write", a)
    second = cptest("check", "--write", a)
    assert first.returncode == second.returncode == 1, first.stderr[-3000:]  # the evidence FAILs
    assert "re-analysis written beside the seal" in first.stderr
    assert store.file_hashes(a) | {"manifest.json": store.sha256_file(a / "manifest.json")} == before
    older, newer = analyses.listed(a)
    seal = store.seal_sha256(store.Layout(a))
    m1, m2 = (json.loads((x / "manifest.json").read_text()) for x in (older, newer))
    assert m1["seal"]["sha256"] == m2["seal"]["sha256"] == seal and m1["previous"] is None
    link = {"analysis": f"analyses/{older.name}", "sha256": store.sha256_file(older / "manifest.json")}
    assert m2["previous"] == link
    assert (newer / "verdict.json").read_text() == (a / "verdict.json").read_text()
    assert cptest("verify", a).returncode == 0
    shown = cptest("matrix", "--json", results)
    assert shown.returncode == 0, shown.stderr[-3000:]
    (row,) = json.loads(shown.stdout)["rows"]
    assert row["status"] == "fail" and row["analysis"] == f"re-analysis {newer.name} of seal {seal[:12]}"
    assert f"re-analysis {newer.name} of seal {seal[:12]}" in cptest("report", a).stderr
    assert cptest("publish", a, "--results", tmp_path / "published").returncode == 0
    # Deleting the older analysis breaks the chain; editing the newer one is named.
    shutil.rmtree(older)
    broken = cptest("verify", a)
    assert broken.returncode == 3 and "breaks the chain of analyses" in broken.stderr


def test_a_flipped_verdict_stays_refused_after_check_write(made: Made, tmp_path: Path) -> None:
    # The reproduction of issue 32: FAIL edited into PASS, then `check --write`, then verify and
    # publish. Nothing is written, and every command that shows or copies the verdict refuses it.
    a = tmp_path / "results" / NAME / made.archive.name
    shutil.copytree(made.archive, a)
    flip_verdict(a, tmp_path)
    done = cptest("check", "--write", a)
    assert done.returncode == 3 and "verdict.json changed since the run" in done.stderr
    assert not (a / "analyses").exists()
    assert (a / "manifest.json").read_bytes() == (made.archive / "manifest.json").read_bytes()
    for args in (("verify", a), ("publish", a, "--results", tmp_path / "pub"), ("matrix", a.parent.parent),
                 ("report", a)):
        refused = cptest(*args)
        assert refused.returncode == 3 and "verdict.json changed since the run" in refused.stderr, args
    assert not (tmp_path / "pub" / NAME).exists()
    # `check` still judges the evidence: FAIL, and says the held verdict differs.
    rechecked = cptest("check", a)
    assert rechecked.returncode == 1 and "FAIL" in rechecked.stdout and "differs" in rechecked.stderr
