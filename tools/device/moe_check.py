"""moe_check.py: the Python side of tools/device/moe_check.sh (docs/decisions.md D64): does SGLang 0.5.17
serve cptest's tiny Qwen3-MoE, how long does it take to start, and does it compute what the checkpoint
says?

    python3 tools/device/moe_check.py serve --port P --pid PID --launch EPOCH --ready-s 300 \
        --until EPOCH --out FILE
    python3 tools/device/moe_check.py compare MODEL_DIR REQUESTS_JSON --out FILE
    python3 tools/device/moe_check.py startup LOG --launch EPOCH [--ready EPOCH]

`serve` waits for /health_generate (the server's process alive, at most READY_S from the launch), then
sends two rounds of concurrent greedy /generate requests by token ids, with logprobs (no request
waits past UNTIL; a round is not started with less than 20 s left), and writes what came back and how
long each took (the fused-MoE Triton kernels compile at the first forward of each
batch shape, so a round's first requests may be slow). `compare` scores SGLang's tokens with
transformers' Qwen3MoeForCausalLM on the same checkpoint, teacher-forced in float32 on the CPU:
SGLang's log-probability of each token it generated against transformers', beside two calibrations
on the same tokens: transformers in bfloat16 against float32 (the precision floor: what SGLang's
bfloat16 forward should look like) and float32 with every expert's down projection zeroed (what a
weight SGLang left unset would look like: its loader skips a name it has no parameter for without a
word, models/qwen3_moe.py:1169, 1189, 1211). `startup` splits the log's startup as `cptest startup`
does (cptest/report/startup.py) between the script's launch and ready times.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROUNDS: dict[str, list[int]] = {
    "a": [5, 16, 33, 64],  # as probe-smoke.sh: small, concurrent, one batch of mixed lengths
    "b": [128, 256, 384, 512, 640, 768, 896, 1024],  # longer prefills: other fused-MoE batch shapes
}
NEW_TOKENS = 16
FLOOR_RATIO = 4.0
"""SGLang's mean |Δlogprob| against float32 may be at most this many times transformers' own bfloat16
one on the same tokens (the project's rule for a noise floor, docs/language.md "Generation parity")."""


def prompt(i: int, n: int, vocab: int = 4096) -> list[int]:
    """Deterministic token ids (not 0 or 1, the config's bos and eos)."""
    return [(7 * i + 13 * j) % (vocab - 2) + 2 for j in range(n)]


# ------------------------------------------------------------------------------ serve
def _get(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def wait_ready(base: str, pid: int, launch: float, ready_s: float) -> dict[str, Any]:
    """Poll /health_generate every 2 s until it answers, the server's process is gone, or `ready_s`
    from `launch` (epoch seconds) have passed."""
    while time.time() - launch < ready_s:
        if not _alive(pid):
            return {"ready": False, "why": "the server exited before it was ready",
                    "after_s": round(time.time() - launch, 1)}
        try:
            _get(base + "/health_generate", 10)
            return {"ready": True, "ready_at": time.time(), "ready_s": round(time.time() - launch, 1)}
        except OSError:
            time.sleep(2)
    return {"ready": False, "why": f"not ready within {ready_s:.0f} s",
            "after_s": round(time.time() - launch, 1)}


def send_round(base: str, name: str, lens: list[int], timeout: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{} for _ in lens]

    def one(i: int, n: int) -> None:
        ids = prompt(i + (100 if name == "b" else 0), n)
        body = {"rid": f"moe-{name}{i}", "input_ids": ids, "return_logprob": True,
                "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}}
        t0 = time.monotonic()
        try:
            r = _post(base + "/generate", body, timeout)
            meta = r.get("meta_info") or {}
            out[i] = {"rid": body["rid"], "ok": True, "input_ids": ids, "output_ids": r.get("output_ids"),
                      "output_logprobs": [x[0] for x in meta.get("output_token_logprobs") or []],
                      "finish_reason": meta.get("finish_reason"), "s": round(time.monotonic() - t0, 3)}
        except Exception as e:  # noqa: BLE001 - every failure is a finding to record
            out[i] = {"rid": body["rid"], "ok": False, "input_len": n, "error": repr(e)[:500],
                      "s": round(time.monotonic() - t0, 3)}

    threads = [threading.Thread(target=one, args=(i, n)) for i, n in enumerate(lens)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def serve(port: int, pid: int, launch: float, ready_s: float, until: float) -> dict[str, Any]:
    base = f"http://127.0.0.1:{port}"
    result = wait_ready(base, pid, launch, min(ready_s, until - launch))
    if not result["ready"]:
        return result
    try:
        result["server_info"] = json.loads(_get(base + "/server_info", 10))
    except Exception as e:  # noqa: BLE001
        result["server_info_error"] = repr(e)[:300]
    result["rounds"] = {}
    for name, lens in ROUNDS.items():
        if until - time.time() < 20:
            result["rounds"][name] = {"requests": [], "s": 0.0, "skipped": "no time left"}
            continue
        t0 = time.monotonic()
        sent = send_round(base, name, lens, min(180.0, until - time.time()))
        result["rounds"][name] = {"requests": sent, "s": round(time.monotonic() - t0, 3)}
    return result


# ------------------------------------------------------------------------------ compare
def _token_logprobs(model: Any, ids: list[int], n_out: int) -> tuple[list[float], list[int], list[float]]:
    """log p(ids[k] | ids[:k]) for the last `n_out` positions, transformers' argmax there, and its
    margin (top-1 minus top-2 log-probability: how near a tie the greedy choice was)."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits[len(ids) - n_out - 1: len(ids) - 1], dim=-1)
    chosen = torch.tensor(ids[len(ids) - n_out:])
    top2 = logp.topk(2, dim=-1)
    return (logp.gather(1, chosen[:, None])[:, 0].tolist(), top2.indices[:, 0].tolist(),
            (top2.values[:, 0] - top2.values[:, 1]).tolist())


def _stats(d: list[float]) -> dict[str, float | None]:
    if not d:
        return {"n": 0, "mean": None, "max": None}
    return {"n": len(d), "mean": sum(d) / len(d), "max": max(d)}


def compare(model_dir: Path, requests: dict[str, Any]) -> dict[str, Any]:
    """SGLang's tokens and log-probabilities (the `serve` record) against transformers' on the
    checkpoint; see the module's doc."""
    import torch
    import transformers

    def load(dtype: Any) -> Any:
        return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()

    f32, bf16, zeroed = load(torch.float32), load(torch.bfloat16), load(torch.float32)
    with torch.no_grad():
        for layer in zeroed.model.layers:
            layer.mlp.experts.down_proj.zero_()
    rows = []
    d_sgl: list[float] = []
    d_bf16: list[float] = []
    d_zero: list[float] = []
    agree = total = 0
    for name, rnd in (requests.get("rounds") or {}).items():
        for r in rnd["requests"]:
            if not r.get("ok") or not r.get("output_ids"):
                rows.append({"rid": r.get("rid"), "round": name, "skipped": r.get("error") or "no output"})
                continue
            out, lps = list(r["output_ids"]), list(r["output_logprobs"])
            ids = list(r["input_ids"]) + out
            ref, argmax, margin = _token_logprobs(f32, ids, len(out))
            low, _, _ = _token_logprobs(bf16, ids, len(out))
            off, _, _ = _token_logprobs(zeroed, ids, len(out))
            ds = [abs(a - b) for a, b in zip(lps, ref, strict=False) if a is not None and math.isfinite(a)]
            d_sgl += ds
            d_bf16 += [abs(a - b) for a, b in zip(low, ref, strict=True)]
            d_zero += [abs(a - b) for a, b in zip(off, ref, strict=True)]
            same = sum(int(a == b) for a, b in zip(out, argmax, strict=True))
            agree += same
            total += len(out)
            rows.append({"rid": r["rid"], "round": name, "input_len": len(r["input_ids"]),
                         "max_abs_dlogprob": max(ds) if ds else None, "argmax_agree": f"{same}/{len(out)}",
                         "first_disagreement_margin": next((round(m, 5) for a, b, m in
                                                             zip(out, argmax, margin, strict=True) if a != b),
                                                            None),
                         "finite_logprobs": len(ds) == len(lps) == len(out)})
    s, floor, lost = _stats(d_sgl), _stats(d_bf16), _stats(d_zero)
    verdict = "no tokens to compare"
    if s["n"] and floor["mean"] is not None and lost["mean"] is not None:
        limit = FLOOR_RATIO * max(floor["mean"], 1e-4)
        if s["mean"] <= limit and s["mean"] < lost["mean"]:
            verdict = (f"consistent: mean |dlogprob| {s['mean']:.4f} <= {FLOOR_RATIO:g} x the bf16 floor "
                       f"{floor['mean']:.4f}; a lost expert weight shows {lost['mean']:.4f}")
        else:
            verdict = (f"INCONSISTENT: mean |dlogprob| {s['mean']:.4f} against a bf16 floor of "
                       f"{floor['mean']:.4f} (limit {limit:.4f}); a lost expert weight shows "
                       f"{lost['mean']:.4f}")
    return {"verdict": verdict, "sglang_vs_fp32": s, "bf16_vs_fp32": floor, "experts_zeroed_vs_fp32": lost,
            "argmax_agree": f"{agree}/{total}", "requests": rows}


# ------------------------------------------------------------------------------ startup
def startup_phases(text: str, launch: float, ready: float | None) -> dict[str, Any]:
    """The phases of cptest/report/startup.py over a raw SGLang log (time stamps UTC, as on the GPU
    machine), from the script's launch time to its ready time."""
    from cptest.report.startup import ORDER, PHASES, STAMP

    stamped = []
    for line in text.splitlines():
        m = STAMP.match(line)
        if m:
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
            stamped.append((t, m.group(2)))
    phases: dict[str, float | None] = dict.fromkeys(ORDER)
    if not stamped:
        return {"phases": phases, "total_s": round(ready - launch, 1) if ready else None}
    phases["imports"] = round(max(0.0, stamped[0][0] - launch), 1)
    start = stamped[0][0]
    for name, pattern, last in PHASES:
        hits = [t for t, msg in stamped if re.search(pattern, msg)]
        if hits:
            end = hits[-1] if last else hits[0]
            phases[name] = round(max(0.0, end - start), 1)
            start = end
    if ready is not None:
        phases["ready"] = round(max(0.0, ready - start), 1)
    moe = sorted({msg[:200] for _, msg in stamped if re.search(r"(?i)moe|expert|fused", msg)})
    return {"phases": phases, "total_s": round(ready - launch, 1) if ready else None, "moe_lines": moe[:20]}


# ------------------------------------------------------------------------------ command line
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--pid", type=int, required=True)
    s.add_argument("--launch", type=float, required=True)
    s.add_argument("--ready-s", type=float, default=300.0)
    s.add_argument("--until", type=float, default=float("inf"), help="no request waits past this epoch")
    s.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare")
    c.add_argument("model_dir", type=Path)
    c.add_argument("requests", type=Path)
    c.add_argument("--out", type=Path, required=True)
    u = sub.add_parser("startup")
    u.add_argument("log", type=Path)
    u.add_argument("--launch", type=float, required=True)
    u.add_argument("--ready", type=float)
    a = ap.parse_args()
    if a.cmd == "serve":
        result = serve(a.port, a.pid, a.launch, a.ready_s, a.until)
        a.out.write_text(json.dumps(result, indent=1, default=str))
        rounds = result.get("rounds") or {}
        ok = {k: f"{sum(r['ok'] for r in v['requests'])}/{len(v['requests'])} in {v['s']} s"
              for k, v in rounds.items()}
        print(f"ready: {result['ready']} ({result.get('ready_s', result.get('why'))}); requests ok: {ok}")
    elif a.cmd == "compare":
        result = compare(a.model_dir, json.loads(a.requests.read_text()))
        a.out.write_text(json.dumps(result, indent=1))
        print(result["verdict"], "| argmax agree", result["argmax_agree"])
    else:
        result = startup_phases(a.log.read_text(errors="replace"), a.launch, a.ready)
        print(json.dumps(result))


if __name__ == "__main__":
    main()
