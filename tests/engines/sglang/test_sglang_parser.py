"""The argv cptest builds is accepted by SGLang's own parser (0.5.17), when sglang is importable.

CI installs the 0.5.17 wheel with --no-deps plus the light dependencies `server_args` imports (see
docs/decisions.md); elsewhere this module is skipped and the flag-table tests stand in for it.
`from_cli_args` also runs SGLang's parse-time validation, so admission's parse-stage predictions are
checked against the real thing here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

server_args = pytest.importorskip("sglang.srt.server_args")
sglang = pytest.importorskip("sglang")

from cptest.engines.sglang.admission import predict  # noqa: E402
from cptest.engines.sglang.argv import LAUNCHER, build_argv  # noqa: E402
from cptest.engines.sglang.releases import KNOWN_RELEASES  # noqa: E402
from tests.engines.sglang.configs import launch, serve_config  # noqa: E402

RELEASE = KNOWN_RELEASES.get(getattr(sglang, "__version__", ""))
if RELEASE is None:
    pytest.skip(
        f"installed sglang {getattr(sglang, '__version__', '?')} has no cptest table", allow_module_level=True
    )




QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny-qwen3")
    (d / "config.json").write_text(json.dumps(QWEN3))
    return d


def sglang_parse(argv: list[str]):
    """Parse with SGLang's parser and build ServerArgs (runs its parse-time validation)."""
    assert argv[: len(LAUNCHER)] == list(LAUNCHER)
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    # No GPU here: name the device so ServerArgs does not probe for one.
    ns = parser.parse_args([*argv[len(LAUNCHER) :], "--device", "cuda"])
    return server_args.ServerArgs.from_cli_args(ns)


def test_dcp2_argv_is_accepted_by_sglangs_parser(model_dir):
    cfg = serve_config(str(model_dir), tp=2, dcp=2, attention_backend="triton", cuda_graph={"decode": "full"})
    sa = sglang_parse(build_argv(RELEASE, cfg))
    assert (sa.tp_size, sa.dcp_size, sa.attention_backend) == (2, 2, "triton")
    assert sa.skip_tokenizer_init


def test_pcp2_argv_is_accepted_by_sglangs_parser(model_dir):
    cfg = serve_config(
        str(model_dir),
        tp=2,
        attn_cp=2,
        prefill_cp=True,
        cp_strategy="zigzag",
        attention_backend="fa3",
        eager=True,
    )
    sa = sglang_parse(build_argv(RELEASE, cfg))
    assert (sa.attn_cp_size, sa.enable_prefill_cp, sa.cp_strategy) == (2, True, "zigzag")


@pytest.mark.parametrize(
    "launch",
    [
        launch(tp=2, attn_cp=2, prefill_cp=True),
        launch(tp=3, attn_cp=2, prefill_cp=True, cp_strategy="zigzag"),
        launch(tp=2, dcp=0),
        launch(tp=4, dcp=2, attn_cp=2, prefill_cp=True, cp_strategy="zigzag"),
        launch(tp=4, dcp=3),
    ],
    ids=["no-strategy", "tp3-cp2", "dcp0", "pcp+dcp", "tp4-dcp3"],
)
def test_parse_stage_predictions_match_sglang(model_dir, launch):
    adm = predict(RELEASE, launch)
    cfg = serve_config(
        str(model_dir),
        tp=launch.tp,
        dcp=launch.dcp,
        attn_cp=launch.attn_cp,
        prefill_cp=launch.prefill_cp,
        cp_strategy=launch.cp_strategy,
    )
    argv = build_argv(RELEASE, cfg)
    if adm.stage == "parse":
        with pytest.raises((ValueError, AssertionError)) as err:
            sglang_parse(argv)
        assert str(err.value) == adm.message
        assert type(err.value).__name__ == adm.exception
    else:
        sglang_parse(argv)  # accepted at parse time (worker-start rules fire later, on GPUs)
