"""Issue 14's tamper inputs through `cptest validate`, `lint` and `compile`: each is exit 2 with the
file:line:col of what to change, never a traceback or exit 1."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cptest.cli import main

W = "requests 2 concurrency 1 prompt_tokens 8 output_tokens 4"


def scenario(serve: str = "", workload: str = W, vocab: str = "256") -> str:
    return f"""cptest 1
scenario t {{
  engine sglang "0.5.17"
  model synthetic llama {{ layers 1 hidden 64 heads 8 kv_heads 1 head_dim 16 vocab {vocab} intermediate 128 }}
  topology {{ gpus 1 tp 1 }}
  serve {{ {serve} }}
  workload {{ {workload} }}
}}
"""


TAMPER = {
    "env PYTHONPATH": (scenario('env "PYTHONPATH" "/tmp/x"'), "6:11"),
    "env LD_PRELOAD": (scenario('env "LD_PRELOAD" "/tmp/x.so"'), "6:11"),
    "env NCCL_NVLS_ENABLE": (scenario('env "NCCL_NVLS_ENABLE" "1"'), "6:11"),
    "flag --config": (scenario('flag "--config" "c.yaml"'), "6:11"),
    "flag --custom-weight-loader": (scenario('flag "--custom-weight-loader" "m.f"'), "6:11"),
    "flag --trust-remote-code": (scenario('flag "--trust-remote-code"'), "6:11"),
    "flag --enable-custom-logit-processor": (scenario('flag "--enable-custom-logit-processor"'), "6:11"),
    "requests 1000000000": (scenario(workload=W.replace("requests 2", "requests 1000000000")), "7:14"),
    "huge prompt_tokens": (scenario(workload=W.replace("prompt_tokens 8", "prompt_tokens 999999999")),
                           "7:39"),
    "huge vocab": (scenario(vocab="999999999999"), "4:77"),
    "dataset /dev/zero": (scenario(workload=W + ' source dataset "/dev/zero"'), "7:71"),
    "4301-digit integer": (scenario(workload=W.replace("requests 2", "requests " + "9" * 4301)), "7:23"),
}  # fmt: skip


@pytest.mark.parametrize("command", ["validate", "lint", "compile"])
@pytest.mark.parametrize("name", list(TAMPER))
def test_a_tamper_input_is_exit_2_at_its_position(tmp_path: Path, name: str, command: str) -> None:
    text, where = TAMPER[name]
    f = tmp_path / "t.cps"
    f.write_text(text)
    result = CliRunner().invoke(main, [command, str(f)])
    assert result.exit_code == 2, (result.output, result.exception)
    assert f"t.cps:{where}:" in result.output and "Traceback" not in result.output, result.output
    assert re.search(r"t\.cps:\d+:\d+: ", result.output)


def test_extra_flag_values_are_refused_by_validate_lint_and_compile_at_the_value(tmp_path: Path) -> None:
    f = tmp_path / "t.cps"
    f.write_text(scenario('flag "--max-running-requests" "4" "5"'))
    for command in ("validate", "lint", "compile"):
        result = CliRunner().invoke(main, [command, str(f)])
        expected = "t.cps:6:45: --max-running-requests: takes exactly one value (found 2)"
        assert result.exit_code == 2 and expected in result.output, result.output
