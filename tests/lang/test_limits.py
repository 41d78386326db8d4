"""Bounds on what a scenario may ask for (cptest/lang/tables.py): each one is bad input (exit 2) at the
setting, never a traceback, an exhausted memory or a run that never ends; and the run deadline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cptest.errors import PlanError, ScenarioError
from cptest.lang import format_text, parse_file, parse_text
from cptest.lang import tables as T
from cptest.plan import plan
from cptest.plan.workload import load_dataset

ROOT = Path(__file__).resolve().parents[2]


def scenario(*, workload: str = "requests 2 concurrency 1 prompt_tokens 8 output_tokens 4",
             geometry: str = "layers 1 hidden 64 heads 8 kv_heads 1 head_dim 16 vocab 256 intermediate 128",
             extra: str = "") -> str:
    return f"""cptest 1
scenario s {{
  engine sglang "0.5.17"
  model synthetic llama {{ {geometry} }}
  topology {{ gpus 1 tp 1 }}
  workload {{ {workload} }}
  {extra}
}}
"""


def problems(text: str, base_dir: str = "/nonexistent") -> list[str]:
    with pytest.raises(ScenarioError) as e:
        parse_text(text, "s.cps", base_dir=base_dir)
    return [f"{p.span}: {p.message} (expected {p.expected})" for p in e.value.problems]


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cptest", *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


@pytest.mark.parametrize(("workload", "where", "expected"), [
    ("requests 1000000000 concurrency 1 prompt_tokens 8 output_tokens 4", "s.cps:6:14", "<= 100000"),
    ("requests 2 concurrency 100000 prompt_tokens 8 output_tokens 4", "s.cps:6:25", "<= 4096"),
    ("requests 2 concurrency 1 prompt_tokens 2000000 output_tokens 4", "s.cps:6:39", "<= 1048576"),
    ("requests 2 concurrency 1 prompt_tokens uniform(1, 1048577) output_tokens 4", "s.cps:6:39",
     "<= 1048576"),
    ("requests 2 concurrency 1 prompt_tokens 8 output_tokens 99999999", "s.cps:6:55", "<= 1048576"),
    ("requests 100000 concurrency 1 prompt_tokens 1000 output_tokens 4", "s.cps:6:14", "<= 33,554,432"),
    ("requests 2 concurrency 1 prompt_tokens 8 output_tokens 4 timeout 999999h", "s.cps:6:71", "<= 86400"),
    ("requests 2 concurrency 1 prompt_tokens 8 output_tokens 4 seed 9223372036854775808", "s.cps:6:71",
     "<= 9223372036854775807"),
])  # fmt: skip
def test_each_workload_limit_is_an_error_at_its_setting(workload: str, where: str, expected: str) -> None:
    (found,) = problems(scenario(workload=workload))
    assert found.startswith(where) and expected in found, found


def test_a_choice_of_too_many_values_is_an_error() -> None:
    values = ", ".join(["8"] * (T.MAX_CHOICES + 1))
    workload = f"requests 2 concurrency 1 prompt_tokens choice({values}) output_tokens 4"
    (found,) = problems(scenario(workload=workload))
    assert "choice() has 1025 values" in found


@pytest.mark.parametrize(("geometry", "message"), [
    ("layers 1 hidden 64 heads 8 kv_heads 1 head_dim 16 vocab 99999999 intermediate 128",
     "vocab is out of range"),
    ("layers 9999999 hidden 64 heads 8 kv_heads 1 head_dim 16 vocab 256 intermediate 128",
     "layers is out of range"),
    ("layers 1000 hidden 65536 heads 64 kv_heads 8 head_dim 128 vocab 256 intermediate 200000",
     "the synthetic model would have about"),
])  # fmt: skip
def test_model_sizes_are_bounded(geometry: str, message: str) -> None:
    (found,) = problems(scenario(geometry=geometry))
    assert found.startswith("s.cps:4:") and message in found, found


@pytest.mark.parametrize("digits", [31, 4300, 4301, 20000])
def test_an_integer_of_any_length_is_exit_2_with_its_position(tmp_path: Path, digits: int) -> None:
    f = tmp_path / "big.cps"
    f.write_text(scenario(workload=f"requests {'9' * digits} concurrency 1 prompt_tokens 8 output_tokens 4"))
    for command in ("validate", "lint", "compile"):
        done = cli(command, str(f))
        assert done.returncode == 2, (command, done.stderr[-500:])
        assert f"big.cps:6:23: integer of {digits} digits is too large" in done.stderr
        assert "Traceback" not in done.stderr
    with pytest.raises(ScenarioError, match="too large"):
        format_text(f.read_text(), str(f))


@pytest.mark.parametrize("literal", ["1" + "0" * 400 + ".5", "9" * 70 + "s"])
def test_a_number_or_duration_literal_of_any_length_is_an_error(literal: str) -> None:
    workload = f"requests 2 concurrency 1 prompt_tokens 8 output_tokens 4 rate {literal}"
    found = problems(scenario(workload=workload))
    assert any("too large" in f for f in found), found


def test_a_string_too_long_and_too_many_statements_are_errors() -> None:
    (found,) = problems(scenario(extra=f'description "{"x" * (T.MAX_TEXT_CHARS + 1)}"'))
    assert found.startswith("s.cps:7:3: string of 65537 characters is too long")
    logs = " ".join(f'log contains "{i}"' for i in range(T.MAX_LIST_ENTRIES + 1))
    (found,) = problems(scenario(extra=f"expect {{ {logs} }}"))
    assert "more than 256 log statements" in found


def test_a_dataset_of_dev_zero_is_exit_2_not_a_hang(tmp_path: Path) -> None:
    f = tmp_path / "z.cps"
    f.write_text(scenario(workload='requests 2 concurrency 1 prompt_tokens 8 output_tokens 4 '
                                   'source dataset "/dev/zero"'))
    done = cli("compile", str(f))
    assert done.returncode == 2 and "/dev/zero is not a regular file" in done.stderr, done.stderr


def test_a_dataset_larger_than_the_limit_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("[5, 6, 7]\n" * 100)
    assert len(load_dataset(data)) == 100
    with pytest.raises(PlanError, match="larger than 100 bytes"):
        load_dataset(data, max_bytes=100)
    data.write_text("[" * 100_000 + "]" * 100_000 + "\n" + "[" + "9" * 5000 + "]\n")
    with pytest.raises(PlanError, match="not JSON"):
        load_dataset(data)


def test_a_dataset_repeated_over_many_requests_is_bounded_in_the_plan(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text(json.dumps(list(range(3, 3 + 1000))) + "\n")
    f = tmp_path / "s.cps"
    f.write_text(scenario(workload='requests 100000 concurrency 1 prompt_tokens 8 output_tokens 4 '
                                   'source dataset "d.jsonl"'))
    with pytest.raises(PlanError, match="would store 100,000,000 prompt tokens"):
        plan(parse_file(f))


@pytest.mark.parametrize(("target", "why"), [
    ("/dev/zero", "not a scenario file"), ("/", "not a scenario file"),
    ("fifo.cps", "not a regular file"), ("dir.cps", "it is a directory"),
])
def test_extends_and_scenario_files_are_read_only_as_small_regular_files(tmp_path: Path, target: str,
                                                                          why: str) -> None:
    os.mkfifo(tmp_path / "fifo.cps")  # in the tree and named .cps, still never opened for reading
    (tmp_path / "dir.cps").mkdir()
    f = tmp_path / "e.cps"
    f.write_text(scenario(extra=f'extends "{target}"'))
    (found,) = problems(f.read_text(), base_dir=str(tmp_path))
    assert f"'{target}'" in found and why in found
    done = cli("validate", "/dev/zero")
    assert done.returncode == 2 and "not a regular file" in done.stderr
    big = tmp_path / "big.cps"
    big.write_text("# x\n" * (T.MAX_SCENARIO_BYTES // 4 + 1))
    done = cli("validate", str(big))
    assert done.returncode == 2 and "larger than 1,048,576 bytes" in done.stderr


def test_the_deadline_defaults_to_an_hour_and_a_scenario_may_declare_a_longer_one() -> None:
    s = parse_text(scenario(), "s.cps", base_dir="/nonexistent")
    p = plan(s)
    assert s.deadline_s is None and p.deadline_s == T.DEFAULT_DEADLINE_S == 3600.0
    assert "deadline_s" not in json.loads(p.model_dump_json())  # plans and hashes of old scenarios unchanged
    s = parse_text(scenario(extra="deadline 3h"), "s.cps", base_dir="/nonexistent")
    assert s.deadline_s == 10800.0 and plan(s).deadline_s == 10800.0
    assert json.loads(plan(s).model_dump_json())["deadline_s"] == 10800.0
    assert "deadline 10800s" in format_text(scenario(extra="deadline 3h"), "s.cps")


@pytest.mark.parametrize(("value", "message"), [("0s", "deadline is out of range"),
                                                ("999h", "deadline is out of range"),
                                                ("30", "deadline needs a unit"),
                                                ('"1h"', "wrong type for deadline")])
def test_a_bad_deadline_is_an_error_at_its_statement(value: str, message: str) -> None:
    (found,) = problems(scenario(extra=f"deadline {value}"))
    assert found.startswith("s.cps:7:3: " + message), found
