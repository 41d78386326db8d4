"""Prompt and top-k logprobs of the reference engine: SGLang 0.5.17's `logprob_start_len` and
`top_logprobs_num` on `POST /generate`, in its meta_info shapes (`cptest.reference.server.Logprobs`
cites the SGLang source of each shape).

One TP1 server (tiny Llama, 4 KV heads) answers most tests; TP2, DCP2 and PCP2 (zigzag) servers answer
the same forced sequence, which must agree with TP1 within 1e-3. Teacher forcing: the input logprobs
of prompt + greedy output equal the output logprobs the greedy generation returned (1e-4).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.reference.conftest import reference_server

torch = pytest.importorskip("torch")

MODEL = "llama-kv4"
PROMPT = [0, 5, 17, 300, 42, 7, 1000, 2048, 11, 99]
NEW = 4
K = 5
FORCING_TOLERANCE = 1e-4
LAYOUT_TOLERANCE = 1e-3
BATCH_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("probe")


@pytest.fixture(scope="module")
def tp1(tiny_models: Path, probe_dir: Path) -> Iterator[str]:
    with reference_server(["--model-path", str(tiny_models / MODEL), "--tp-size", "1"],
                          env={"CPTEST_PROBE_DIR": str(probe_dir)}) as (url, _):
        yield url


def generate(url: str, ids: list[int], *, new: int = NEW, start: int | None = None, k: int | None = None,
             stream: bool = False, rid: str | None = None, logprob: bool = True) -> Any:
    sampling = {"max_new_tokens": new, "temperature": 0.0, "ignore_eos": True}
    body: dict[str, Any] = {"input_ids": ids, "return_logprob": logprob, "stream": stream,
                            "sampling_params": sampling}
    if start is not None:
        body["logprob_start_len"] = start
    if k is not None:
        body["top_logprobs_num"] = k
    if rid is not None:
        body["rid"] = rid
    r = httpx.post(url + "/generate", json=body, timeout=60)
    r.raise_for_status()
    if not stream:
        return r.json()
    chunks = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    return [json.loads(c) for c in chunks[:-1]]


def values(triples: list[list[Any]]) -> list[float | None]:
    return [t[0] for t in triples]


def assert_top_k(row: list[list[Any]], k: int) -> None:
    """K triples `[logprob, token_id, null]`, logprob descending, distinct tokens, a distribution."""
    assert len(row) == k
    assert all(len(t) == 3 and t[2] is None and isinstance(t[1], int) for t in row)
    lps = [t[0] for t in row]
    assert lps == sorted(lps, reverse=True)
    assert len({t[1] for t in row}) == k
    assert sum(math.exp(x) for x in lps) <= 1.0 + 1e-5


def close(a: list[float | None], b: list[float | None], tol: float) -> float:
    """The largest |a - b| (None only where both are None)."""
    assert len(a) == len(b)
    assert [x is None for x in a] == [x is None for x in b]
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    return max((abs(x - y) for x, y in pairs), default=0.0)


# ------------------------------------------------------------------------------------------ shapes
def test_default_start_returns_output_logprobs_and_empty_input_lists(tp1: str) -> None:
    m = generate(tp1, PROMPT)["meta_info"]
    assert m["input_token_logprobs"] == []
    assert len(m["output_token_logprobs"]) == m["output_token_logprobs_length"] == NEW
    assert "input_top_logprobs" not in m and "output_top_logprobs" not in m
    m = generate(tp1, PROMPT, start=-1, k=K)["meta_info"]
    assert m["input_token_logprobs"] == [] and m["input_top_logprobs"] == []
    assert len(m["output_top_logprobs"]) == NEW
    for row in m["output_top_logprobs"]:
        assert_top_k(row, K)


def test_without_return_logprob_no_logprob_fields_and_the_options_are_ignored(tp1: str) -> None:
    m = generate(tp1, PROMPT, start=999, k=999, logprob=False)["meta_info"]
    assert not any("logprob" in key for key in m)


@pytest.mark.parametrize("start", [0, 3, len(PROMPT) - 1, len(PROMPT)])
def test_input_logprobs_cover_positions_from_start_with_the_first_one_null(tp1: str, start: int) -> None:
    ans = generate(tp1, PROMPT, start=start, k=K)
    m = ans["meta_info"]
    n = len(PROMPT) - start
    inp, top = m["input_token_logprobs"], m["input_top_logprobs"]
    assert len(inp) == len(top) == n
    assert [t[1] for t in inp] == PROMPT[start:]
    assert all(len(t) == 3 and t[2] is None for t in inp)
    if n:
        # SGLang scores from row `start` on: the token at `start` itself has no logprob, whatever start is.
        assert inp[0][0] is None and top[0] is None
    for t, row in zip(inp[1:], top[1:], strict=True):
        assert isinstance(t[0], float) and t[0] <= 0.0
        assert_top_k(row, K)
        assert t[0] <= row[0][0] + 1e-6  # no token beats the top one
        hit = [x[0] for x in row if x[1] == t[1]]
        if hit:
            assert abs(hit[0] - t[0]) <= 1e-6
    assert ans["output_ids"] == [t[1] for t in m["output_token_logprobs"]]
    assert len(m["output_top_logprobs"]) == NEW


def test_top_k_of_zero_and_of_one(tp1: str) -> None:
    m0 = generate(tp1, PROMPT, start=0, k=0)["meta_info"]
    assert len(m0["input_token_logprobs"]) == len(PROMPT)
    assert "input_top_logprobs" not in m0 and "output_top_logprobs" not in m0
    m1 = generate(tp1, PROMPT, start=0, k=1)["meta_info"]
    assert values(m1["input_token_logprobs"]) == values(m0["input_token_logprobs"])
    assert all(len(row) == 1 for row in m1["output_top_logprobs"])
    assert [row[0][1] for row in m1["output_top_logprobs"]] == [t[1] for t in m1["output_token_logprobs"]]


# ------------------------------------------------------------------------------------------ values
def test_teacher_forcing_reproduces_the_free_running_logprobs(tp1: str) -> None:
    free = generate(tp1, PROMPT, k=K)
    out = free["output_ids"]
    out_lps = values(free["meta_info"]["output_token_logprobs"])
    out_top = free["meta_info"]["output_top_logprobs"]
    forced = generate(tp1, PROMPT + out, start=0, k=K, new=1)["meta_info"]
    at = slice(len(PROMPT), len(PROMPT) + NEW)
    got = values(forced["input_token_logprobs"][at])
    worst = close(got, out_lps, FORCING_TOLERANCE)
    assert worst <= FORCING_TOLERANCE, f"teacher forcing differs by {worst:.3g}"
    for tok, row, free_row in zip(out, forced["input_top_logprobs"][at], out_top, strict=True):
        assert row[0][1] == tok == free_row[0][1]  # the argmax is first, and it is the greedy token
        assert close([x[0] for x in row], [x[0] for x in free_row], FORCING_TOLERANCE) <= FORCING_TOLERANCE
    # The last output token is the sampled one of the forced request's extend: the same distribution.
    assert forced["output_top_logprobs"][0][0][0] == forced["output_token_logprobs"][0][0]


def test_streaming_chunks_carry_the_same_cumulative_lists(tp1: str) -> None:
    whole = generate(tp1, PROMPT, start=2, k=2)
    chunks = generate(tp1, PROMPT, start=2, k=2, stream=True)
    assert len(chunks) == NEW
    for i, c in enumerate(chunks):
        m = c["meta_info"]
        assert len(c["output_ids"]) == i + 1
        assert len(m["output_token_logprobs"]) == len(m["output_top_logprobs"]) == i + 1
        assert m["input_token_logprobs"] == whole["meta_info"]["input_token_logprobs"]
        assert m["input_top_logprobs"] == whole["meta_info"]["input_top_logprobs"]
    last = chunks[-1]["meta_info"]
    for key in ("output_token_logprobs", "output_top_logprobs"):
        assert last[key] == whole["meta_info"][key]


def _batched_extend(probe_dir: Path, rid: str) -> bool:
    for line in (probe_dir / "rank0.jsonl").read_text().splitlines():
        rec = json.loads(line)
        batched = rec.get("mode") == "extend" and rec.get("batch_size", 0) > 1
        if batched and rid in (rec.get("seq_positions") or {}):
            return True
    return False


def _at_once(gate: threading.Barrier, url: str, ids: list[int], rid: str) -> Any:
    gate.wait()
    return generate(url, ids, start=0, k=K, rid=rid)


def test_a_sequence_gets_the_same_logprobs_alone_and_in_a_batch(tp1: str, probe_dir: Path) -> None:
    """Copies of one sequence sent at once with other requests (a long prompt among them keeps the
    leader busy while the rest queue) share extends; each copy must equal the sequence sent alone.
    The probe's Step records say whether a copy was batched; the send is retried until one was."""
    seq = PROMPT + [3, 4, 5]
    alone = generate(tp1, seq, start=0, k=K)["meta_info"]
    others = [[(i * 37 + 11) % 4096 for i in range(600)], [7, 8, 9], [1, 2, 3, 4, 5, 6]]
    copies = 3
    for attempt in range(10):
        rids = [f"batch{attempt}-{i}" for i in range(copies + len(others))]
        bodies = [seq] * copies + others
        gate = threading.Barrier(len(rids))
        with ThreadPoolExecutor(len(rids)) as pool:
            n = len(rids)
            answers = list(pool.map(_at_once, [gate] * n, [tp1] * n, bodies, rids))
        for ans in answers[:copies]:
            got = ans["meta_info"]
            for key in ("input_token_logprobs", "output_token_logprobs"):
                assert close(values(got[key]), values(alone[key]), BATCH_TOLERANCE) <= BATCH_TOLERANCE
            for key in ("input_top_logprobs", "output_top_logprobs"):
                for a, b in zip(got[key], alone[key], strict=True):
                    assert (a is None) == (b is None)
                    if a is not None:
                        assert a[0][1] == b[0][1]
                        assert close([x[0] for x in a], [x[0] for x in b], BATCH_TOLERANCE) <= BATCH_TOLERANCE
        if any(_batched_extend(probe_dir, rid) for rid in rids[:copies]):
            return
    pytest.fail("no copy of the sequence shared an extend with another request")


def test_model_logits_of_a_sequence_do_not_depend_on_its_batch(tiny_models: Path) -> None:
    """The same check below HTTP, where the batch is certain: `Model.forward` with rows from L."""
    from cptest.reference.layout import Layout
    from cptest.reference.modeling import KvPool, Model, SeqRows, SoloComm, load_config, load_shard
    from cptest.topology import Degrees

    path = tiny_models / MODEL
    cfg = load_config(path)
    lay = Layout(Degrees(tp=1), rank=0)
    shard = load_shard(path, cfg, lay)

    def run(seqs: list[list[int]], starts: list[int | None]) -> list[torch.Tensor]:
        model = Model(cfg, shard, lay, SoloComm(), KvPool(cfg, lay, 256, 4, len(shard.kv_heads)))
        rows, at = [], 0
        for i, ids in enumerate(seqs):
            blocks = list(range(at, at + -(-len(ids) // 4)))
            at += len(blocks)
            rows.append(SeqRows(rid=str(i), positions=list(range(len(ids))), context=len(ids), blocks=blocks,
                                logits_from=starts[i]))
        logits, _ = model.forward([t for ids in seqs for t in ids], rows, True, True)
        assert logits is not None
        return list(torch.split(logits, [r.logits_rows() for r in rows]))

    seq = PROMPT + [3, 4, 5]
    (alone,) = run([seq], [2])
    assert alone.shape == (len(seq) - 2, cfg.vocab)
    batch = run([[7, 8, 9], seq, [1] * 20], [None, 2, 0])
    assert [b.shape[0] for b in batch] == [1, len(seq) - 2, 20]
    assert torch.allclose(batch[1], alone, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------ layouts
LAYOUTS = {
    "tp2": ["--tp-size", "2"],
    "dcp2": ["--tp-size", "2", "--dcp-size", "2"],
    "pcp2_zigzag": ["--tp-size", "2", "--attn-cp-size", "2", "--enable-prefill-cp",
                    "--cp-strategy", "zigzag"],
}
FORCED = PROMPT + [3, 4, 5, 6, 7]


@pytest.fixture(scope="module")
def tp1_forced(tp1: str) -> dict[str, Any]:
    return generate(tp1, FORCED, start=0, k=K)["meta_info"]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layouts_agree_with_tp1(name: str, tiny_models: Path, tp1_forced: dict[str, Any]) -> None:
    with reference_server(["--model-path", str(tiny_models / MODEL), *LAYOUTS[name]]) as (url, _):
        got = generate(url, FORCED, start=0, k=K)["meta_info"]
    for key in ("input_token_logprobs", "output_token_logprobs"):
        worst = close(values(got[key]), values(tp1_forced[key]), LAYOUT_TOLERANCE)
        assert worst <= LAYOUT_TOLERANCE, f"{name}: {key} differs from TP1 by {worst:.3g}"
        assert [t[1] for t in got[key]] == [t[1] for t in tp1_forced[key]]
    for key in ("input_top_logprobs", "output_top_logprobs"):
        for a, b in zip(got[key], tp1_forced[key], strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                assert a[0][1] == b[0][1]
                assert close([x[0] for x in a], [x[0] for x in b], LAYOUT_TOLERANCE) <= LAYOUT_TOLERANCE


# ------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("body", [
    {"logprob_start_len": -2}, {"logprob_start_len": len(PROMPT) + 1}, {"logprob_start_len": "0"},
    {"logprob_start_len": 1.5}, {"top_logprobs_num": -1}, {"top_logprobs_num": 65},
    {"top_logprobs_num": True},
])  # fmt: skip
def test_bad_logprob_options_are_refused_with_400(tp1: str, body: dict[str, Any]) -> None:
    r = httpx.post(tp1 + "/generate", timeout=30, json={
        "input_ids": PROMPT, "return_logprob": True, "sampling_params": {"max_new_tokens": 1}, **body})
    assert r.status_code == 400
    assert isinstance(r.json()["error"]["message"], str)
    # The server still serves afterwards.
    assert len(generate(tp1, PROMPT, start=0, k=64, new=1)["meta_info"]["input_top_logprobs"][1]) == 64


def test_input_logprobs_in_chunks_equal_one_log_softmax(monkeypatch: pytest.MonkeyPatch) -> None:
    from cptest.reference import rank

    g = torch.Generator().manual_seed(0)
    ids = [int(t) for t in torch.randint(0, 50, (12,), generator=g)]
    rows = torch.randn(12 - 2, 50, generator=g)  # positions 2..11
    whole = torch.log_softmax(rows[:-1], dim=-1)
    monkeypatch.setattr(rank, "LOGPROB_CHUNK_ROWS", 3)
    vals, top = rank.input_logprobs(rows, ids, 2, 4)
    assert vals[0] is None and top is not None and top[0] is None
    assert len(vals) == len(top) == 10
    assert vals[1:] == [float(whole[j, ids[3 + j]]) for j in range(9)]
    assert [[t for _, t in row] for row in top[1:]] == whole.topk(4).indices.tolist()  # type: ignore[union-attr]
    assert rank.input_logprobs(rows[-1:], ids, 12, 4) == ([], [])
    assert rank.input_logprobs(rows[-1:], ids, 11, 0) == ([None], None)
