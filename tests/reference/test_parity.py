"""Parity: the reference engine under TP, PCP (zigzag, interleave), DCP and attention DP gives the
log-probabilities of a single-rank transformers forward of the same checkpoint, within 1e-4.

Each layout runs a real server (one process per rank, gloo) and gets four prompts at once, so that
extends are batched (one of 3 tokens, shorter than 2*cp: the zigzag fallback) and decodes continue
together. The oracle is transformers' forward over prompt + generated tokens in float32.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import httpx
import pytest

from tests.reference.conftest import reference_server

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPTS = [[0, 5, 17], [0, 5, 17, 300, 42, 7, 1000, 2048],
           [(i * 37 + 11) % 4096 for i in range(37)], [(i * 101 + 3) % 4096 for i in range(100)]]
NEW = 6
TOLERANCE = 1e-4

LAYOUTS = {
    "tp1": ("llama-kv1", ["--tp-size", "1"]),
    "tp2_kv4": ("llama-kv4", ["--tp-size", "2"]),
    "dcp2_kv1": ("llama-kv1", ["--tp-size", "2", "--dcp-size", "2"]),
    "dcp2_kv4": ("llama-kv4", ["--tp-size", "2", "--dcp-size", "2"]),
    "tp4_dcp4_kv4_page2": ("llama-kv4", ["--tp-size", "4", "--dcp-size", "4", "--page-size", "2"]),
    "pcp2_zigzag_qwen3": ("qwen3-kv2", ["--tp-size", "2", "--attn-cp-size", "2", "--enable-prefill-cp"]),
    "pcp2_interleave_qwen3": ("qwen3-kv2", ["--tp-size", "2", "--attn-cp-size", "2", "--enable-prefill-cp",
                                            "--cp-strategy", "interleave"]),
    "tp4_pcp2_zigzag_qwen3": ("qwen3-kv2", ["--tp-size", "4", "--attn-cp-size", "2", "--enable-prefill-cp"]),
    "pcp2_zigzag_llama_kv2": ("llama-kv2", ["--tp-size", "2", "--attn-cp-size", "2", "--enable-prefill-cp"]),
    # attention DP: the four prompts go two to each DP rank, whose batches meet in the MLP's buffer
    "dp2_llama_kv2": ("llama-kv2", ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"]),
    "tp4_dp2_pcp2_zigzag_qwen3": ("qwen3-kv2", ["--tp-size", "4", "--dp-size", "2", "--enable-dp-attention",
                                                "--attn-cp-size", "2", "--enable-prefill-cp"]),
    # DCP inside each attention-DP rank: a DCP group is the DP rank's attention-TP pair
    "tp4_dp2_dcp2_llama_kv1": ("llama-kv1", ["--tp-size", "4", "--dp-size", "2", "--enable-dp-attention",
                                             "--dcp-size", "2"]),
}


@cache
def _hf(path: str) -> object:
    return transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()


def _oracle(path: Path, prompt: list[int], out: list[int]) -> tuple[list[float], list[int]]:
    """transformers' logprob of each generated token and its greedy choice at each step."""
    with torch.no_grad():
        logits = _hf(str(path))(torch.tensor([prompt + out])).logits[0]  # type: ignore[operator]
    lp = torch.log_softmax(logits.float(), dim=-1)
    at = range(len(prompt) - 1, len(prompt) - 1 + len(out))
    return [float(lp[i, t]) for i, t in zip(at, out, strict=True)], [int(lp[i].argmax()) for i in at]


def _generate(url: str, prompt: list[int]) -> dict:
    r = httpx.post(url + "/generate", timeout=60, json={
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": NEW, "temperature": 0.0, "ignore_eos": True},
        "return_logprob": True, "logprob_start_len": -1, "stream": False})  # fmt: skip
    r.raise_for_status()
    return r.json()


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_reference_logprobs_equal_a_single_rank_transformers_forward(name: str, tiny_models: Path) -> None:
    model, args = LAYOUTS[name]
    path = tiny_models / model
    with reference_server(["--model-path", str(path), *args]) as (url, _), \
            ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(lambda p: _generate(url, p), PROMPTS))
    worst = 0.0
    for prompt, ans in zip(PROMPTS, answers, strict=True):
        out = ans["output_ids"]
        assert len(out) == NEW
        got = [t[0] for t in ans["meta_info"]["output_token_logprobs"]]
        want, greedy = _oracle(path, prompt, out)
        assert out == greedy, f"{name}: prompt of {len(prompt)}: tokens {out} vs transformers {greedy}"
        worst = max(worst, *(abs(a - b) for a, b in zip(got, want, strict=True)))
    assert worst <= TOLERANCE, f"{name}: max |logprob difference| {worst:.3g} > {TOLERANCE}"
