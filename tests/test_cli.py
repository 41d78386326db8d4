"""Specification of the `cptest` command, through the real console entry (`python -m cptest`, argv lists).

Exit codes (cptest/cli/): 0 ok/pass, 1 lint findings/fail/would reformat, 2 bad input, 3 unknown verdict or
infrastructure failure. Commands that would start SGLang are only tested for refusing to (no GPU here).
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from cptest.analyses import current_verdict_file
from cptest.lang import format_text
from cptest.plan.model import Plan
from tests.lang.cases import BAD, BASE, with_line

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.cps"))
ARCHIVES = sorted(
    d
    for d in (ROOT / "results").glob("*/*")
    if d.is_dir() and not d.parent.name.startswith("_") and (d / "verdict.json").is_file()
)
EXIT = {"pass": 0, "fail": 1, "unknown": 3}
ANSI = re.compile(r"\x1b\[")


Done = subprocess.CompletedProcess[str]


def cptest(*args: str | Path, env: dict[str, str] | None = None, cwd: Path = ROOT) -> Done:
    """`python -m cptest args...` from `cwd`, output captured as text."""
    return subprocess.run([sys.executable, "-m", "cptest", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=dict(os.environ, **(env or {})), timeout=120)  # fmt: skip


def _id(d: Path) -> str:
    return f"{d.parent.name}/{d.name}"


# ------------------------------------------------------------------------------ validate
def test_validate_accepts_every_scenario():
    done = cptest("validate", *SCENARIOS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("ok  ") == len(SCENARIOS)


def test_validate_bad_file_shows_position_source_line_and_caret(tmp_path: Path):
    bad = tmp_path / "bad.cps"
    bad.write_text(with_line(5, "  topolgy { gpus 2 tp 2 }"))
    done = cptest("validate", bad)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"{bad}:5:3: ")
    assert lines[1].strip() == "topolgy { gpus 2 tp 2 }"
    assert lines[2] == "  " + " " * 2 + "^" * len("topolgy")
    assert "did you mean 'topology'" in done.stderr
    assert "Traceback" not in done.stderr


def test_validate_reports_good_and_bad_files_together(tmp_path: Path):
    bad = tmp_path / "bad.cps"
    bad.write_text(with_line(5, "  topology { gpus 2 tp 0 }"))
    done = cptest("validate", "--json", SCENARIOS[0], bad)
    assert done.returncode == 2
    out = json.loads(done.stdout)
    assert out["ok"] is False and [r["ok"] for r in out["files"]] == [True, False]
    (problem,) = out["files"][1]["problems"]  # the position survives --json: file, line and column
    assert (problem["file"], problem["line"]) == (str(bad), 5) and problem["col"] > 1
    assert problem["where"] == f"{bad}:5:{problem['col']}"


def test_a_folder_names_the_scenarios_directly_in_it_for_validate_fmt_and_lint(tmp_path: Path):
    done = cptest("validate", "--json", "scenarios", "scenarios/qualification")
    assert done.returncode == 0, done.stderr
    named = [Path(r["file"]).name for r in json.loads(done.stdout)["files"]]
    qualification = sorted(p.name for p in (ROOT / "scenarios" / "qualification").glob("*.cps"))
    assert named == [p.name for p in SCENARIOS] + qualification  # defaults/ and subfolders are not scenarios
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "bad.cps").write_text(with_line(5, "  topology { gpus 2 tp 0 }"))
    (mixed / "ok.cps").write_text(BASE)
    done = cptest("validate", mixed)
    assert done.returncode == 2 and f"ok  {mixed / 'ok.cps'}" in done.stdout
    assert f"{mixed / 'bad.cps'}:5:" in done.stderr
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "a.cps").write_text(format_text(BASE, "a.cps").replace("\n  ", "\n      ", 1))
    assert cptest("fmt", "--check", loose).returncode == 1
    assert cptest("fmt", loose).returncode == 0 and cptest("fmt", "--check", loose).returncode == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    done = cptest("lint", empty)
    assert done.returncode == 2 and "no .cps file directly in this folder" in done.stderr


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Done]]:
    """Every bad input of tests/lang/cases.py through `cptest validate`, run in parallel (each run is a
    fresh interpreter: about half a second)."""
    folder = tmp_path_factory.mktemp("bad")

    def one(case: tuple[str, int, str, str, str]) -> tuple[str, tuple[Path, Done]]:
        name, line, text = case[:3]
        path = folder / f"{name}.cps"
        path.write_text(with_line(line, text))
        return name, (path, cptest("validate", path))

    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(pool.map(one, BAD))


def test_the_bad_input_table_has_forty_distinct_cases():
    assert len({c[0] for c in BAD}) == len(BAD) >= 40


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_exits_2_naming_its_position(case, bad_runs):
    name, _, _, where, phrase = case
    path, done = bad_runs[name]
    assert done.returncode == 2, done.stderr
    assert f"{path}:{where}:" in done.stderr
    assert phrase in done.stderr
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------------------ fmt
def _non_canonical(tmp_path: Path) -> Path:
    f = tmp_path / "t.cps"
    f.write_text(BASE.replace("  topology { gpus 2 tp 2 dcp 2 }", "  topology {gpus 2    tp 2 dcp 2}"))
    assert format_text(f.read_text(), str(f)) != f.read_text()
    return f


def test_fmt_check_accepts_the_canonical_suite():
    done = cptest("fmt", "--check", *SCENARIOS)
    assert done.returncode == 0, done.stdout
    assert done.stdout == ""


def test_fmt_check_exits_1_with_a_diff_and_writes_nothing(tmp_path: Path):
    f = _non_canonical(tmp_path)
    before = f.read_text()
    done = cptest("fmt", "--check", f)
    assert done.returncode == 1
    assert done.stdout.startswith(f"--- {f}\n+++ {f} (formatted)\n")
    assert "-  topology {gpus 2    tp 2 dcp 2}" in done.stdout
    assert f.read_text() == before


def test_fmt_rewrites_the_file_in_canonical_form(tmp_path: Path):
    f = _non_canonical(tmp_path)
    expected = format_text(f.read_text(), str(f))
    done = cptest("fmt", f)
    assert done.returncode == 0
    assert f.read_text() == expected
    assert cptest("fmt", "--check", f).returncode == 0


def test_fmt_of_a_bad_file_exits_2(tmp_path: Path):
    f = tmp_path / "bad.cps"
    f.write_text(with_line(5, "  topology { gpus 2 tp 2 dcp $ }"))
    done = cptest("fmt", "--check", f)
    assert done.returncode == 2 and f"{f}:5:30:" in done.stderr


# ------------------------------------------------------------------------------ lint, compile, schema
LLAMA_PCP = BASE.replace("tp 2 dcp 2", "tp 2 attn_cp 2 cp_strategy zigzag").replace(
    "expect { launch accepted }",
    "baseline { tp 1 }\n  expect { generation tokens_agree >= 0.9 vs baseline }",
).replace('sglang "0.5.17"', 'sglang "0.5.23"')
"""Llama with prefill CP that expects generation to hold: a lint finding at line 8 (SGLang 0.5.23
splits every architecture's prefill and shards Llama's attention heads over the full TP group;
inferred from its source)."""
DCP_KV4 = BASE.replace("kv_heads 1", "kv_heads 4").replace(
    "expect { launch accepted }",
    "baseline { tp 1 }\n  expect { generation tokens_agree >= 0.9 vs baseline }",
)
"""DCP2 with 4 KV heads that expects generation to hold: an observed rule says otherwise (line 8)."""


def test_lint_accepts_the_suite():
    done = cptest("lint", *SCENARIOS)
    assert done.returncode == 0, done.stdout
    assert "no findings" in done.stdout


def test_lint_of_an_inferred_rule_warns_and_exits_0(tmp_path: Path):
    f = tmp_path / "llama_pcp.cps"
    f.write_text(LLAMA_PCP)
    done = cptest("lint", f)
    assert done.returncode == 0, done.stdout  # a hypothesis read in the source: runs test it
    assert done.stdout.startswith(f"{f}:8:")
    assert "llama_pcp_silent" in done.stdout and "[inferred: a hypothesis, not blocking]" in done.stdout


def test_lint_of_an_observed_rule_exits_1_naming_the_archive(tmp_path: Path):
    f = tmp_path / "dcp_kv4.cps"
    f.write_text(DCP_KV4)
    done = cptest("lint", f)
    assert done.returncode == 1, done.stdout
    assert done.stdout.startswith(f"{f}:8:") and "mha_dcp_kv_not_replicated" in done.stdout
    assert ("[observed: results/dcp2_llama_kv4/20261203T081109Z-733943a0; "
            "results/dcp2_llama_kv4_graph/20261203T111929Z-7984e228]") in done.stdout


def test_lint_json_lists_findings(tmp_path: Path):
    f = tmp_path / "llama_pcp.cps"
    f.write_text(LLAMA_PCP)
    done = cptest("lint", "--json", f)
    assert done.returncode == 0
    out = json.loads(done.stdout)
    (finding,) = out["findings"]
    assert out["blocking"] == 0 and out["files"] == [str(f)]
    assert (finding["provenance"], finding["blocks"]) == ("inferred", False)
    assert finding["code"] == "llama_pcp_silent" and finding["where"].startswith(f"{f}:8:")
    assert (finding["file"], finding["line"]) == (str(f), 8)


def test_compile_json_prints_a_valid_plan():
    done = cptest("compile", "--json", ROOT / "scenarios" / "fault_kill_rank_dcp2.cps")
    assert done.returncode == 0, done.stderr
    plan = Plan.model_validate_json(done.stdout)
    assert plan.scenario == "fault_kill_rank_dcp2"
    assert plan.faults[0].process_title == "sglang::scheduler_TP1"


def test_compile_text_shows_argv_and_faults():
    done = cptest("compile", ROOT / "scenarios" / "fault_kill_rank_dcp2.cps")
    assert done.returncode == 0, done.stderr
    assert "--dcp-size 2" in done.stdout and "sglang::scheduler_TP1" in done.stdout


def test_compile_text_shows_every_field_of_every_fault(tmp_path: Path):
    f = tmp_path / "faults.cps"
    faults = ("  fault stop rank 1 after 3 decode_steps for 2s\n  fault kill rank 0 at 4s\n"
              "  fault sigterm server after 5 requests\n")
    f.write_text(BASE.replace("  expect {", faults + "  expect {"))
    text = cptest("compile", f)
    as_json = cptest("compile", "--json", f)
    assert text.returncode == as_json.returncode == 0, text.stderr
    planned = Plan.model_validate_json(as_json.stdout).faults
    lines = [line for line in text.stdout.splitlines() if line.startswith("fault ")]
    assert len(lines) == len(planned) == 3
    phrases = {"at_s": "at {} s", "after_requests": "after {} requests",
               "after_decode_steps": "after {} decode steps", "heal_after_s": "after {} s",
               "process_title": "(process title {})", "rank": " {}", "index": "fault {}:",
               "action": "{}", "target": "{}"}  # fmt: skip
    for line, fault in zip(lines, planned, strict=True):
        for name, value in fault.model_dump().items():
            if value is not None:  # every field the plan holds reaches the text, the trigger included
                assert phrases[name].format(value) in line, (name, value, line)
    assert "healed (SIGCONT) after 2.0 s" in lines[0] and "after 3 decode steps" in lines[0]


def test_compile_of_an_unknown_release_exits_2_with_did_you_mean(tmp_path: Path):
    f = tmp_path / "t.cps"
    f.write_text(BASE.replace('"0.5.17"', '"0.5.71"'))
    done = cptest("compile", f)
    assert done.returncode == 2
    assert f"{f}:3:" in done.stderr and "did you mean 0.5.17" in done.stderr


def test_schema_prints_the_json_schema_of_the_scenario():
    done = cptest("schema")
    assert done.returncode == 0
    schema = json.loads(done.stdout)
    assert "topology" in schema["properties"]


# ------------------------------------------------------------------------------ run without a GPU
def _processes_marked(marker: str) -> list[str]:
    """Live processes whose environment carries `marker`: anything the command started inherits it.
    (Matching on "sglang" in command lines would also see other tests' fake engines.)"""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.environ().get("CPTEST_TEST_MARK") == marker:
                found.append(" ".join(p.info["cmdline"] or []))
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def test_run_with_engine_sglang_without_nvidia_smi_exits_3_and_launches_nothing(tmp_path: Path):
    # Without --engine, an sglang scenario falls back to the CPU reference engine (with a note);
    # asking for SGLang explicitly on a machine without a GPU must refuse before anything starts.
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    marker = f"run-no-gpu-{os.getpid()}-{tmp_path.name}"
    done = cptest("run", "--engine", "sglang", "--results", tmp_path / "results",
                  ROOT / "scenarios" / "dcp2_llama_kv1.cps", env={"CPTEST_TEST_MARK": marker})  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "nvidia-smi" in done.stderr
    assert "--engine reference" in done.stderr  # what to do next
    assert not (tmp_path / "results").exists()  # the archive is made just before launching
    assert _processes_marked(marker) == []


# ------------------------------------------------------------------------------ archives
@pytest.mark.parametrize("directory", ARCHIVES, ids=_id)
def test_check_reproduces_the_archived_verdict_and_exits_with_its_code(directory: Path):
    # The held verdict: the seal's own, or the newest re-analysis `check --write` put beside it.
    stored = json.loads(current_verdict_file(directory).read_text())
    done = cptest("check", "--json", directory)
    assert json.loads(done.stdout) == stored | {"archive": str(directory), "differs": False}
    # `check` exits max(code, 1) when the recomputed verdict differs byte-wise: for a failing verdict
    # only the message tells the two apart.
    assert "differs" not in done.stderr
    assert done.returncode == EXIT[stored["status"]]


def test_check_text_names_each_checker():
    directory = ARCHIVES[0]
    done = cptest("check", directory)
    stored = json.loads((directory / "verdict.json").read_text())
    placed = ", co-located" if stored.get("placement") == "colocated" else ""
    assert done.stdout.startswith(
        f"{stored['scenario']}: {stored['status'].upper()} (engine {stored['engine']}{placed})"
    )
    for v in stored["verdicts"]:
        assert f" {v['checker']}" in done.stdout


@pytest.mark.parametrize("directory", ARCHIVES, ids=_id)
def test_verify_accepts_each_archive(directory: Path):
    done = cptest("verify", directory)
    assert done.returncode == 0, done.stderr


def test_verify_exits_3_after_one_byte_of_evidence_changes(tmp_path: Path):
    copy = tmp_path / "archive"
    shutil.copytree(ARCHIVES[0], copy)
    evidence = sorted(p for p in (copy / "evidence").rglob("*") if p.is_file() and p.stat().st_size > 0)[0]
    data = bytearray(evidence.read_bytes())
    data[len(data) // 2] ^= 0x01
    evidence.write_bytes(bytes(data))
    done = cptest("verify", "--json", copy)
    assert done.returncode == 3
    out = json.loads(done.stdout)
    problems = out["problems"]
    assert out["ok"] is False and out["archive"] == str(copy)
    assert problems and any(evidence.name in (p["where"] or "") + p["message"] for p in problems)
    assert evidence.name in done.stderr


def test_diff_of_an_archive_with_itself_exits_0():
    done = cptest("diff", ARCHIVES[0], ARCHIVES[0])
    assert done.returncode == 0, done.stdout + done.stderr


def test_check_of_a_folder_that_is_no_archive_is_an_evidence_error_not_a_pass(tmp_path: Path):
    done = cptest("check", tmp_path)
    assert done.returncode == 3, done.stdout
    assert f"{tmp_path}/plan.json" in done.stderr and "no plan.json" in done.stderr
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------------------ NO_COLOR
LOGGER_SNIPPET = """
import sys
from cptest.outline import Logger, TerminalSink
log = Logger([TerminalSink(sys.stderr)])
with log.step("waiting for rank 1"):
    log.warning("slow")
"""
"""The run stage's outline logger (the one cptest output that is coloured on a terminal)."""


def _through_a_terminal(*argv: str | Path, no_color: bool = True) -> str:
    """Output of `python argv...` with stdout and stderr on a pseudo-terminal, where colour would be on."""
    leader, follower = pty.openpty()
    env = dict(os.environ, TERM="xterm-256color")
    env.pop("FORCE_COLOR", None)
    env.pop("NO_COLOR", None)
    if no_color:
        env["NO_COLOR"] = "1"
    proc = subprocess.Popen([sys.executable, *map(str, argv)], stdout=follower, stderr=follower,
                            stdin=subprocess.DEVNULL, cwd=ROOT, env=env)  # fmt: skip
    os.close(follower)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 60)
            if not ready:
                break
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
        proc.wait(timeout=60)
    return b"".join(chunks).decode(errors="replace")


def test_the_terminal_harness_sees_colour_when_no_color_is_unset():
    # Without this control, the NO_COLOR test below could pass because no colour ever reaches the pty.
    assert ANSI.search(_through_a_terminal("-c", LOGGER_SNIPPET, no_color=False))


def test_no_color_is_respected_on_a_terminal(tmp_path: Path):
    bad = tmp_path / "bad.cps"
    bad.write_text(with_line(5, "  topolgy { gpus 2 tp 2 }"))
    outputs = [
        _through_a_terminal("-c", LOGGER_SNIPPET),
        _through_a_terminal("-m", "cptest", "validate", bad),
        _through_a_terminal("-m", "cptest", "check", ARCHIVES[0]),
        _through_a_terminal("-m", "cptest", "lint", *SCENARIOS[:2]),
    ]
    assert "waiting for rank 1" in outputs[0] and "topolgy" in outputs[1] and "(engine " in outputs[2]
    assert [o for o in outputs if ANSI.search(o)] == []
    # A Python traceback, not the word (a log contract's verdict names the pattern it searched for).
    assert not [o for o in outputs if "Traceback (most recent call last)" in o]


# ------------------------------------------------------------------------------ --json
@pytest.mark.parametrize(
    "args",
    [
        ("validate", "--json", "scenarios/tp2_llama_kv1.cps"),
        ("lint", "--json", "scenarios/tp2_llama_kv1.cps"),
        ("compile", "--json", "scenarios/tp2_llama_kv1.cps"),
        ("check", "--json", "ARCHIVE"),
        ("verify", "--json", "ARCHIVE"),
        ("schema",),
    ],
    ids=lambda a: a[0],
)
def test_json_output_parses(args: tuple[str, ...]):
    done = cptest(*(str(ARCHIVES[0]) if a == "ARCHIVE" else a for a in args))
    assert done.returncode in (0, 1, 3), done.stderr
    json.loads(done.stdout)


def test_json_error_output_parses(tmp_path: Path):
    f = tmp_path / "t.cps"
    f.write_text(BASE.replace('"0.5.17"', '"0.5.71"'))
    done = cptest("compile", "--json", f)
    assert done.returncode == 2
    error = json.loads(done.stdout)
    assert error["error"] == "PlanError" and error["exit_code"] == 2
    assert error["problems"][0]["where"].startswith(f"{f}:3:")


def test_the_verdict_text_of_a_colocated_run_says_so_on_its_first_line(tmp_path: Path):
    from cptest.cli import verdict_text
    from cptest.verdict import Verdict, scenario_verdict

    verdicts = [Verdict(checker="rows", status="pass", reason="ok")]
    physical = scenario_verdict("dcp2", "sglang", "0.5.17", verdicts)
    colocated = scenario_verdict("dcp2", "sglang", "0.5.17", verdicts, placement="colocated")
    assert verdict_text(physical, tmp_path).splitlines()[0] == "dcp2: PASS (engine sglang)"
    assert verdict_text(colocated, tmp_path).splitlines()[0] == "dcp2: PASS (engine sglang, co-located)"
