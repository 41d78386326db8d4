"""Every command's interface, against README.md's command table (docs/decisions.md D50).

The table is the one place the exit codes are written. Here each command is run through every code
its row documents (a case per code; `NOT_HERE` names the one that needs a machine this is not), the
process's exit code is asserted, and its `--json` output is validated against the command's output
schema (`cptest.interface`, the same models `cptest schema --command NAME` serves): an error is an
`ErrorOut` carrying the same exit code. The table, the schemas and the command tree must name the
same commands, and every command takes `--json`.

Commands that start engines (run, suite, rerun, image build) run as `python -m cptest` processes on
the CPU reference engine (about 20 s each, six runs); the rest run in this process (click's
CliRunner), once with `--json` and once without, which must exit alike.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from cptest import interface
from cptest.cli import main
from cptest.engines.sglang import citations
from tests.engines.sglang.fake_source import fake_source
from tests.lang.cases import BASE

ROOT = Path(__file__).resolve().parents[1]
KV4 = next((ROOT / "results" / "dcp2_llama_kv4").iterdir())
"""A committed SGLang archive whose declared no-go a flipped verdict turns into a refuted lint rule."""
COMMITTED = sorted(p for p in (ROOT / "results" / "tp2_llama_kv1").iterdir() if p.is_dir())[-1]
"""A committed 0.5.17 archive: today's planner plans it differently, so a rerun is refused (exit 3)."""
TWO_NODES = ROOT / "scenarios" / "tp4_dcp2_two_nodes_sglang.cps"
"""The suite's multi-node SGLang scenario: `compile --target lws` renders its manifests."""
REFERENCE_TWO_NODES = ROOT / "scenarios" / "reference_two_node_kill_rank.cps"
"""The suite's multi-node reference scenario: its manifests mount cptest's source (D57)."""


# ------------------------------------------------------------------------------ the README table
def documented() -> dict[str, set[int]]:
    """README's command table: command (its words as typed, up to the first argument) -> exit codes."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text[text.index("| command | what it does | exit codes |"):].split("\n\n")[0]
    out: dict[str, set[int]] = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        words = cells[0].strip("`").split()[1:]  # drop `cptest`
        key = []
        for w in words:
            mode = w == "--evidence"  # `lint --evidence` is a row of its own
            if not re.fullmatch(r"[a-z][a-z-]*", w) and not mode:
                break
            key.append(w)
        codes = {int(m) for m in re.findall(r"(?:^|;)\s*(\d+)\b", cells[2])}
        out.setdefault(" ".join(key), set()).update(codes)  # `report DIR --html` is a row of `report`
    return out


def command_paths(group: click.Group = main, prefix: str = "") -> dict[str, click.Command]:
    out: dict[str, click.Command] = {}
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out |= command_paths(cmd, f"{prefix}{name} ")
        else:
            out[f"{prefix}{name}"] = cmd
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------ what the cases use
SCENARIO = """cptest 1
scenario NAME {
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
    capacity logical == FACTOR * physical within 0.01
  }
}
"""
"""A tiny DCP2 reference run: FACTOR 2 passes, 3 fails (the capacity contract is declared wrong)."""

LOST = SCENARIO.replace("NAME", "lost").replace("FACTOR", "2").replace(
    SCENARIO[SCENARIO.index("  model synthetic"):SCENARIO.index("  topology")],
    '  model local "/nonexistent/ckpt"\n  facts { architecture "LlamaForCausalLM" layers 2 hidden 128 '
    "heads 4 kv_heads 1 head_dim 32 vocab 512 }\n")
"""A scenario whose model is missing on this machine: preflight says unknown (3), nothing launched."""


@dataclass
class Done:
    code: int
    stdout: str
    stderr: str


class World:
    """The files the cases need, made once; the engine runs made lazily and kept."""

    def __init__(self, root: Path) -> None:
        self.root = root
        suite = root / "suite"
        (suite / "defaults").mkdir(parents=True)
        shutil.copy2(ROOT / "scenarios" / "defaults" / "tiny.cps", suite / "defaults" / "tiny.cps")
        self.pass_cps = suite / "exit_pass.cps"
        self.pass_cps.write_text(SCENARIO.replace("NAME", "exit_pass").replace("FACTOR", "2"))
        self.fail_cps = suite / "exit_fail.cps"
        self.fail_cps.write_text(SCENARIO.replace("NAME", "exit_fail").replace("FACTOR", "3"))
        self.lost_cps = suite / "lost.cps"
        self.lost_cps.write_text(LOST.replace('extends "defaults/tiny.cps"',
                                              f'extends "{suite / "defaults" / "tiny.cps"}"'))
        self.bad_cps = root / "bad.cps"
        self.bad_cps.write_text(BASE.replace("tp 2 dcp 2", "tp 0 dcp 2"))
        self.broken_cps = root / "broken.cps"  # not even its syntax: fmt cannot format it
        self.broken_cps.write_text(BASE.replace("  topology {", "  topology {{"))
        self.ugly_cps = root / "ugly.cps"  # valid, not canonical
        self.ugly_cps.write_text(BASE.replace("  topology {", "  topology   {"))
        self.blocked_cps = root / "dcp_kv4.cps"  # an observed lint rule: blocks run, exit 1
        self.blocked_cps.write_text(BASE.replace("kv_heads 1", "kv_heads 4").replace(
            "expect { launch accepted }",
            "baseline { tp 1 }\n  expect { generation tokens_agree >= 0.9 vs baseline }"))
        self.models = root / "models"
        self.empty = root / "empty"
        self.empty.mkdir()
        self.missing = root / "missing"
        self.runs = root / "runs"

    def heavy(self, *args: str | Path, fake_gpu: bool = False,
              env_extra: dict[str, str] | None = None) -> Done:
        env = {**os.environ, "NO_COLOR": "1", **(env_extra or {})}
        if fake_gpu:  # `nvidia-smi` on the PATH: cptest plans for SGLang, so lint applies (and blocks)
            bin_dir = self.root / "fake-gpu-bin"
            bin_dir.mkdir(exist_ok=True)
            (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 1\n")
            (bin_dir / "nvidia-smi").chmod(0o755)
            env["PATH"] = f"{bin_dir}:{env['PATH']}"
        done = subprocess.run([sys.executable, "-m", "cptest", *map(str, args)], capture_output=True,
                              text=True, cwd=ROOT, timeout=600, env=env)
        return Done(done.returncode, done.stdout, done.stderr)

    def _run(self, cps: Path) -> Done:
        return self.heavy("run", cps, "--ports", f"{_free_port()},{_free_port()}", "--no-baseline-cache",
                          "--results", self.runs, "--models", self.models, "--json")

    @cached_property
    def run_pass(self) -> Done:
        return self._run(self.pass_cps)

    @cached_property
    def run_fail(self) -> Done:
        return self._run(self.fail_cps)

    @cached_property
    def passed(self) -> Path:
        assert self.run_pass.code == 0, self.run_pass.stderr[-3000:]
        return Path(json.loads(self.run_pass.stdout)["archive"])

    @cached_property
    def failed(self) -> Path:
        assert self.run_fail.code == 1, self.run_fail.stderr[-3000:]
        return Path(json.loads(self.run_fail.stdout)["archive"])

    def copy(self, archive: Path, name: str, edit: Callable[[Path], None] | None = None) -> Path:
        """A copy of `archive` at `<root>/<name>/<scenario>/<run>` (the same name as the original)."""
        target = self.root / name / archive.parent.name / archive.name
        if not target.exists():
            shutil.copytree(archive, target)
            if edit is not None:
                edit(target)
        return target

    def tampered(self) -> Path:
        def flip(d: Path) -> None:
            f = d / "evidence" / "main" / "rank0.jsonl"
            data = bytearray(f.read_bytes())
            data[len(data) // 2] ^= 0x01
            f.write_bytes(bytes(data))
        return self.copy(self.passed, "tampered", flip)

    def other_tokens(self) -> Path:
        def edit(d: Path) -> None:  # one output token of one request changed: an exact difference
            f = d / "evidence" / "main" / "runner.jsonl"
            text = f.read_text()
            m = re.search(r'"output_ids":\[(\d+)', text)
            assert m is not None
            f.write_text(text[:m.start(1)] + str((int(m.group(1)) + 1) % 512) + text[m.end(1):])
        return self.copy(self.passed, "other_tokens", edit)

    def forged(self) -> Path:
        def edit(d: Path) -> None:
            f = d / "verdict.json"
            f.write_text(f.read_text().replace('"status": "pass"', '"status": "fail"'))
        return self.copy(self.passed, "forged", edit)

    def log_linked(self) -> Path:
        """An archive whose engine log is a symbolic link (to a copy of itself, outside)."""
        def edit(d: Path) -> None:
            log = d / "logs" / "main-node0.log"
            outside = d.parent / "outside-main-node0.log"
            shutil.copy2(log, outside)
            log.unlink()
            log.symlink_to(outside)
        return self.copy(self.passed, "log-linked", edit)

    def unparsable(self) -> Path:
        def edit(d: Path) -> None:
            with (d / "scenario.cps").open("a") as f:
                f.write("garbage {\n")
        return self.copy(self.passed, "unparsable", edit)

    def refuted(self) -> Path:
        """Evidence under which a release rule is refuted (tests/checks/test_hypotheses.py)."""
        def edit(d: Path) -> None:
            verdict = json.loads((d / "verdict.json").read_text())
            for v in verdict["verdicts"]:
                if v["checker"] == "generation":
                    v["status"] = "fail" if v["status"] == "pass" else "pass"
            (d / "verdict.json").write_text(json.dumps(verdict))
        self.copy(KV4, "refuted", edit)
        return self.root / "refuted"

    def bad_verdict(self) -> Path:
        d = self.root / "bad_verdict" / "x" / "20260101T000000Z-00000000"
        d.mkdir(parents=True, exist_ok=True)
        (d / "verdict.json").write_text("{")
        return self.root / "bad_verdict"

    def taken(self) -> Path:
        """Published evidence where another archive already holds the passing run's name."""
        (self.root / "taken" / self.passed.parent.name / self.passed.name).mkdir(parents=True, exist_ok=True)
        return self.root / "taken"

    def checkpoint(self) -> Path:
        store = self.root / "store"
        if not (store / "llama-kv1").exists():
            r = CliRunner().invoke(main, ["models", "make", "llama-kv1", "--models", str(store)])
            assert r.exit_code == 0, r.output
        return (store / "llama-kv1").resolve()

    def sglang_source(self, shifted: bool = False) -> Path:
        """An unpacked-wheel tree where every 0.5.17 citation holds; `shifted`: one range's anchor
        pushed a line down."""
        root = fake_source(citations.load("0.5.17"), self.root / ("shifted" if shifted else "source"))
        if shifted:
            first = citations.load("0.5.17").citations[0]
            path = root / first.wheel_path
            path.write_text("\n" * first.end + path.read_text())
        return root


@dataclass(frozen=True)
class Case:
    command: str
    code: int
    args: Callable[[World], list[Any]]
    heavy: bool = False
    why: str = ""
    fake_gpu: bool = False

    @property
    def id(self) -> str:
        return f"{self.command.replace(' ', '-')}-{self.code}-{self.why.replace(' ', '_')}"


def _ports() -> list[str]:
    return ["--ports", f"{_free_port()},{_free_port()}"]


CASES = [
    Case("validate", 0, lambda w: ["validate", w.pass_cps], why="valid"),
    Case("validate", 2, lambda w: ["validate", w.pass_cps, w.bad_cps], why="one bad file"),
    Case("validate", 2, lambda w: ["validate", w.root / "nope.cps"], why="no such file"),
    Case("fmt", 0, lambda w: ["fmt", "--check", w.pass_cps], why="canonical"),
    Case("fmt", 1, lambda w: ["fmt", "--check", w.ugly_cps], why="would change"),
    Case("fmt", 2, lambda w: ["fmt", w.broken_cps], why="bad syntax"),
    Case("lint", 0, lambda w: ["lint", w.pass_cps], why="no finding"),
    Case("lint", 1, lambda w: ["lint", w.blocked_cps], why="observed finding"),
    Case("lint", 2, lambda w: ["lint", w.bad_cps], why="bad file"),
    Case("lint --evidence", 0, lambda w: ["lint", "--evidence", ROOT / "results"], why="committed archives"),
    Case("lint --evidence", 1, lambda w: ["lint", "--evidence", w.refuted()], why="a rule refuted"),
    Case("lint --evidence", 2, lambda w: ["lint", "--evidence", w.missing], why="no such directory"),
    Case("compile", 0, lambda w: ["compile", ROOT / "scenarios" / "fault_kill_rank_dcp2.cps"], why="ok"),
    Case("compile", 2, lambda w: ["compile", w.bad_cps], why="bad file"),
    Case("compile", 0, lambda w: ["compile", "--target", "lws", TWO_NODES], why="LeaderWorkerSet manifests"),
    Case("compile", 2, lambda w: ["compile", "--target", "lws", "--models-claim", "Not_A_Name", TWO_NODES],
         why="lws: a bad claim name"),
    Case("compile", 0, lambda w: ["compile", "--target", "lws", REFERENCE_TWO_NODES],
         why="lws: the reference engine, cptest from the source claim"),
    Case("schema", 0, lambda w: ["schema"], why="scenario"),
    Case("schema", 0, lambda w: ["schema", "--list"], why="list"),
    Case("schema", 0, lambda w: ["schema", "--command", "models-make"], why="a command"),
    Case("schema", 2, lambda w: ["schema", "--command", "nope"], why="no such command"),
    Case("run", 0, lambda w: w.run_pass, heavy=True, why="pass"),
    Case("run", 1, lambda w: w.run_fail, heavy=True, why="fail"),
    Case("run", 1, lambda w: ["run", w.blocked_cps, "--results", w.runs, "--json"], heavy=True, why="lint",
         fake_gpu=True),
    Case("run", 2, lambda w: ["run", w.bad_cps, "--results", w.runs, "--json"], heavy=True, why="bad file"),
    Case("run", 3, lambda w: ["run", w.lost_cps, "--results", w.runs, "--no-baseline-cache", "--json"],
         heavy=True, why="model missing"),
    Case("suite", 0, lambda w: ["suite", w.pass_cps, "--results", w.root / "suite0", "--models", w.models,
                                "--no-baseline-cache", "--json"], heavy=True, why="pass"),
    Case("suite", 1, lambda w: ["suite", w.fail_cps, "--results", w.root / "suite1", "--models", w.models,
                                "--no-baseline-cache", "--json"], heavy=True, why="fail"),
    Case("suite", 2, lambda w: ["suite", w.bad_cps, "--results", w.root / "suite2", "--json"], heavy=True,
         why="bad file"),
    Case("suite", 3, lambda w: ["suite", w.lost_cps, "--results", w.root / "suite3", "--json"], heavy=True,
         why="model missing"),
    Case("rerun", 0, lambda w: ["rerun", w.passed, "--results", w.runs, "--models", w.models,
                                "--no-baseline-cache", "--json"], heavy=True, why="pass same"),
    Case("rerun", 1, lambda w: ["rerun", w.failed, "--results", w.runs, "--models", w.models,
                                "--no-baseline-cache", "--json"], heavy=True, why="fail"),
    Case("rerun", 2, lambda w: ["rerun", w.unparsable(), "--results", w.runs, "--json"], heavy=True,
         why="scenario does not parse"),
    Case("rerun", 2, lambda w: ["rerun", w.missing, "--json"], heavy=True, why="no such directory"),
    Case("rerun", 3, lambda w: ["rerun", COMMITTED, "--results", w.runs, "--json"], heavy=True,
         why="plan changed"),
    Case("startup", 0, lambda w: ["startup", w.passed], why="ok"),
    Case("startup", 2, lambda w: ["startup", w.missing], why="no such directory"),
    Case("startup", 3, lambda w: ["startup", w.log_linked()], why="a log is a link"),
    Case("check", 0, lambda w: ["check", w.passed], why="pass"),
    Case("check", 1, lambda w: ["check", w.failed], why="fail"),
    Case("check", 2, lambda w: ["check", w.missing], why="no such directory"),
    Case("check", 3, lambda w: ["check", w.empty], why="not an archive"),
    Case("verify", 0, lambda w: ["verify", w.passed], why="ok"),
    Case("verify", 2, lambda w: ["verify", w.missing], why="no such directory"),
    Case("verify", 3, lambda w: ["verify", w.tampered()], why="a byte changed"),
    Case("verify", 3, lambda w: ["verify", w.empty], why="not an archive"),
    Case("diff", 0, lambda w: ["diff", w.passed, w.passed], why="same"),
    Case("diff", 1, lambda w: ["diff", w.passed, w.other_tokens()], why="a token differs"),
    Case("diff", 2, lambda w: ["diff", w.passed, w.failed], why="other scenario"),
    Case("diff", 2, lambda w: ["diff", w.passed, w.missing], why="no such directory"),
    Case("diff", 3, lambda w: ["diff", w.passed, w.empty], why="not an archive"),
    Case("report", 0, lambda w: ["report", w.passed], why="ok"),
    Case("report", 2, lambda w: ["report", w.missing], why="no such directory"),
    Case("report", 3, lambda w: ["report", w.empty], why="not an archive"),
    Case("matrix", 0, lambda w: ["matrix"], why="published results"),
    Case("matrix", 0, lambda w: ["matrix", "--support"], why="support matrix"),
    Case("matrix", 2, lambda w: ["matrix", w.missing], why="no such directory"),
    Case("matrix", 3, lambda w: ["matrix", w.bad_verdict()], why="unreadable verdict"),
    Case("publish", 0, lambda w: ["publish", w.passed, "--results", w.root / "published"], why="published"),
    Case("publish", 2, lambda w: ["publish", w.passed, "--results", w.taken()], why="name taken"),
    Case("publish", 2, lambda w: ["publish", w.missing], why="no such directory"),
    Case("publish", 3, lambda w: ["publish", w.forged(), "--results", w.root / "pub3"], why="forged"),
    Case("publish", 3, lambda w: ["publish", w.tampered(), "--results", w.root / "pub3"], why="damaged"),
    Case("image build", 2, lambda w: ["image", "build", "nope"], why="no such recipe"),
    # An engine socket that cannot exist: CI runs a real Podman service (DOCKER_HOST), with which
    # this build would succeed (exit 0).
    Case("image build", 3, lambda w: w.heavy("image", "build", "reference", "--json",
                                             env_extra={"DOCKER_HOST": f"unix://{w.missing}/docker.sock"}),
         why="no container engine"),
    Case("models make", 0, lambda w: ["models", "make", "llama-kv1", "--models", w.root / "store"], why="ok"),
    Case("models make", 2, lambda w: ["models", "make", "nope", "--models", w.root / "store"], why="no such"),
    Case("models list", 0, lambda w: ["models", "list", "--models", w.root / "store"], why="ok"),
    Case("models add", 0, lambda w: ["models", "add", w.checkpoint(), "--models", w.root / "st2"], why="ok"),
    Case("models add", 2, lambda w: ["models", "add", w.missing], why="no such directory"),
    Case("models add", 2, lambda w: ["models", "add", w.empty], why="no checkpoint"),
    Case("sources check", 0, lambda w: ["sources", "check", "--wheel", w.sglang_source()], why="ok"),
    Case("sources check", 1, lambda w: ["sources", "check", "--wheel", w.sglang_source(shifted=True)],
         why="a citation moved"),
    Case("sources check", 3, lambda w: ["sources", "check", "--wheel", w.missing / "sglang.whl"],
         why="no wheel"),
]

NOT_HERE = {("image build", 0): "needs a container engine: tests/test_e2e_docker.py builds the image"}
"""Documented codes no case here produces, and where they are produced instead."""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return World(tmp_path_factory.mktemp("interface"))


def _in_process(args: list[Any]) -> Done:
    r = CliRunner().invoke(main, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return Done(r.exit_code, r.stdout, r.stderr)


def _check_json(case: Case, done: Done) -> None:
    assert done.code == case.code, f"{case.id}: {done.code}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr
    data = json.loads(done.stdout)  # exactly one JSON document on stdout
    interface.adapter(case.command).validate_python(data)
    if "error" in data:
        assert data["exit_code"] == done.code
        assert data["problems"] and all({"file", "line", "col", "where"} <= set(p) for p in data["problems"])
    elif "ok" in data:  # validate, verify: their own document says whether all was well
        assert data["ok"] is (done.code == 0)
    elif "status" in data and "counts" in data:  # a verdict: the code is the verdict's
        assert done.code == {"pass": 0, "fail": 1, "unknown": 3}[data["status"]] or data.get("diff")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_each_documented_exit_code_and_its_json(case: Case, world: World, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(ROOT)  # `matrix` reads results/ of the working folder
    args = case.args(world)
    if isinstance(args, Done):  # a run made once for several cases
        _check_json(case, args)
        return
    if case.heavy:
        _check_json(case, world.heavy(*args, fake_gpu=case.fake_gpu))
        return
    _check_json(case, _in_process([*args, "--json"]))
    text = _in_process(args)
    assert text.code == case.code, text.stderr  # the same exit code without --json
    assert not text.stdout.lstrip().startswith('{\n  "error"')


def test_every_documented_code_has_a_case_and_every_case_is_documented():
    table = documented()
    covered: dict[str, set[int]] = {}
    for case in CASES:
        assert case.code in table[case.command], f"{case.id}: exit {case.code} is not in README's table"
        covered.setdefault(case.command, set()).add(case.code)
    for (command, code), why in NOT_HERE.items():
        assert why and code in table[command]
        covered.setdefault(command, set()).add(code)
    assert covered == table


def test_the_table_the_schemas_and_the_commands_name_the_same_commands():
    commands = set(command_paths())
    table = set(documented())
    assert table - {"lint --evidence"} == commands
    assert set(interface.OUTPUTS) == commands
    no_json = [name for name, cmd in command_paths().items()
               if not any("--json" in p.opts for p in cmd.params)]
    assert no_json == []


@pytest.mark.parametrize("name", sorted(interface.OUTPUTS))
def test_cptest_schema_serves_each_commands_output_schema(name: str):
    done = _in_process(["schema", "--command", name.replace(" ", "-")])
    assert done.code == 0
    assert json.loads(done.stdout) == interface.schema_of(name)
    assert json.loads(done.stdout)["title"] == f"cptest {name} --json"


def test_schema_list_and_default():
    listed = json.loads(_in_process(["schema", "--list", "--json"]).stdout)
    assert listed == {"commands": list(interface.OUTPUTS)}
    assert "properties" in json.loads(_in_process(["schema"]).stdout)  # the scenario model, as before


def test_an_output_with_a_field_its_schema_does_not_know_is_refused():
    # The check above must be able to fail: a verify output with an extra field, or without `ok`.
    adapter = interface.adapter("verify")
    good = {"archive": "a", "ok": True, "problems": []}
    adapter.validate_python(good)
    for bad in (good | {"surprise": 1}, {"archive": "a", "problems": []}):
        with pytest.raises(ValueError):
            adapter.validate_python(bad)


def test_trial_runs_go_to_a_git_ignored_folder_and_publish_into_results():
    commands = command_paths()
    defaults = {name: next(p.default for p in commands[name].params if p.name == "results")
                for name in ("run", "suite", "rerun", "publish")}
    assert defaults == {"run": Path(".cptest/runs"), "suite": Path(".cptest/runs"),
                        "rerun": Path(".cptest/runs"), "publish": Path("results")}
    trial = ".cptest/runs/s/20260101T000000Z-00000000/plan.json"
    ignored = subprocess.run(["git", "check-ignore", "-q", trial], cwd=ROOT, timeout=30)
    assert ignored.returncode == 0  # a trial run never shows up as a change to commit
    assert subprocess.run(["git", "check-ignore", "-q", "results/s/r/plan.json"], cwd=ROOT,
                          timeout=30).returncode == 1
