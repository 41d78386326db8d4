"""SGLang 0.5.17's own code, run in its own interpreter through `driver.py`, for the differential tests.

`CPTEST_SGLANG_PYTHON` names that interpreter (`tools/sglang-cpu-env.sh` builds it and prints the
line). Unset, these tests skip; CI sets `CPTEST_REQUIRE_SGLANG_SRC=1`, and there a missing or broken
interpreter fails them instead.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck

DRIVER = Path(__file__).resolve().parent / "driver.py"

DIFFERENTIAL: dict[str, Any] = {"deadline": None, "derandomize": True,
                                "suppress_health_check": [HealthCheck.function_scoped_fixture]}
"""Hypothesis settings of every differential test but the number of examples: reproducible draws,
and no deadline (SGLang's code runs in another process)."""
COMPARED: defaultdict[str, Counter[str]] = defaultdict(Counter)
"""Per test module, the cases it compared with SGLang's code, printed when the module is done."""


@pytest.fixture(scope="module", autouse=True)
def report_compared(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    counts = COMPARED.get(request.module.__name__)
    if counts:
        print(f"\n{request.module.__name__.rsplit('.', 1)[-1]}, cases compared: {dict(counts)}")

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 32},
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_attention_heads": 8,
              "num_key_value_heads": 2},
    "qwen3-moe": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "num_experts": 8,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 64, "decoder_sparse_step": 1,
                  "mlp_only_layers": []},
}
"""Configs only (no weights): what ServerArgs reads of a model. One dense model whose attention is
sharded over attention-TP, one over full TP (Llama), and one CP-v2 class (Qwen3-MoE)."""

_COMMON = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "vocab_size": 1000,
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
           "torch_dtype": "bfloat16", "tie_word_embeddings": False}


class SGLangDriver:
    """One `driver.py` process; `ask` sends a batch of requests and returns the answers in order."""

    def __init__(self, python: str) -> None:
        self.proc = subprocess.Popen([python, str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)

    def ask(self, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("".join(json.dumps(r) + "\n" for r in requests))
        self.proc.stdin.flush()
        answers = []
        for _ in requests:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the SGLang driver exited ({self.proc.poll()}) before answering")
            answers.append(json.loads(line))
        for a in answers:
            assert "driver_error" not in a, a["driver_error"]
        return answers

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def sglang() -> Iterator[SGLangDriver]:
    python = os.environ.get("CPTEST_SGLANG_PYTHON")
    why = None
    if not python:
        why = "CPTEST_SGLANG_PYTHON is not set (tools/sglang-cpu-env.sh builds the interpreter)"
    elif not Path(python).exists():
        why = f"CPTEST_SGLANG_PYTHON={python} does not exist"
    if why is not None:
        if os.environ.get("CPTEST_REQUIRE_SGLANG_SRC") == "1":
            pytest.fail(f"CPTEST_REQUIRE_SGLANG_SRC=1 but {why}")
        pytest.skip(why)
    driver = SGLangDriver(str(python))
    try:
        version = driver.ask([{"op": "version"}])[0]
        assert version.get("version") == "0.5.17", version
        yield driver
    finally:
        driver.close()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Model directory per family: a config.json and nothing else."""
    out = {}
    for name, config in TINY_CONFIGS.items():
        d = tmp_path_factory.mktemp(f"tiny-{name}")
        (d / "config.json").write_text(json.dumps({**_COMMON, **config}))
        out[name] = str(d)
    return out
