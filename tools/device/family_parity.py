"""family_parity.py: teacher-forced parity of TP1 archives against transformers, an independent
implementation of each model family.

    python3 tools/device/family_parity.py RESULTS [--models DIR] [--model DIR] [--device cuda|cpu]
        [--max-ratio R] [--json]

RESULTS is an archive (`results/<scenario>/<run>/`), a scenario's folder of archives, or a folder of
those. For each archive whose main server ran at TP1 (one rank: the baselines of
scenarios/baselines/), every completed request of the main server is re-scored: its prompt (the
plan's token ids) followed by the server's output, one forward of transformers'
AutoModelForCausalLM on the archive's checkpoint, in float32 (the reference) and in bfloat16 (the
dtype's own noise: the floor). Per archive, over the output positions:
- |server logprob - fp32 logprob| at p50, p99 and max (nearest rank);
- the same for bf16 against fp32: the floor, never below `bf16_rounding` (below);
- their ratio per statistic, and top-1 agreement: the share of positions where the server's token
  is fp32's argmax (the server decodes greedily, so its token is its own argmax).

The floor's minimum: a bfloat16 forward returns its logits rounded to 8 significant bits, and
rounding to nearest moves a logit, and with it the token's log-probability, by up to half a
bfloat16 spacing at that logit. No bfloat16 engine can be asked to agree more closely than that,
however lucky the measured bf16 figure is on a small workload (where it agrees with float32 to the
bit on many positions, its p50 can be 0 and any ratio infinite); the floor is never below half the
spacing at the median |fp32 logit| of the scored tokens (`bf16_rounding`).

Exit 0 when every TP1 archive was scored (and, with --max-ratio, every p99 ratio is within it), 1
when a ratio is over --max-ratio, 2 on bad input (no archive, no TP1 archive, no checkpoint, a
checkpoint transformers cannot load, a prompt that does not match the server's record).
The model is loaded from the model store (`--models`, else $CPTEST_MODELS, else the checkout's
.cptest/models); a synthetic checkpoint missing there is written from its pinned geometry and seed,
as `cptest models make` does. On CUDA, TF32 is turned off so that float32 means float32.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cptest.checks.load import load_archive
from cptest.contracts.parity import nearest_rank, sig
from cptest.errors import EvidenceError
from cptest.plan.model import Plan
from cptest.run.models import ensure_synthetic, store_dir

STATS = {"p50": 0.5, "p99": 0.99, "max": 1.0}
BAD_INPUT = 2


class BadInput(Exception):
    """What makes the input unusable, said so that the user can fix it."""


@dataclass(frozen=True)
class Scored:
    """One request: the prompt the plan sent, the server's output tokens and their logprobs."""

    index: int
    prompt: list[int]
    output: list[int]
    logprobs: list[float]


@dataclass
class Deltas:
    """|Δlogprob| and top-1 agreement over the output positions of one archive."""

    server: list[float] = field(default_factory=list)
    bf16: list[float] = field(default_factory=list)
    logits: list[float] = field(default_factory=list)
    """|fp32 logit| of each scored token: where the bf16 spacing is taken."""
    server_top1: int = 0
    bf16_top1: int = 0
    nonfinite: int = 0
    """Positions where the server returned no finite logprob (left out of `server`)."""

    @property
    def positions(self) -> int:
        return len(self.bf16)


def bf16_spacing(x: float) -> float:
    """The spacing of bfloat16 numbers (8 significant bits) at |x|."""
    x = abs(x)
    if x == 0 or not math.isfinite(x):
        return 0.0
    return 2.0 ** (math.floor(math.log2(x)) - 7)


def archive_dirs(root: Path) -> list[Path]:
    """The archives at or under `root` (an archive holds plan.json), at most two levels down."""
    if not root.is_dir():
        raise BadInput(f"{root} is not a directory")
    if (root / "plan.json").is_file():
        return [root]
    found = sorted({p.parent for pattern in ("*/plan.json", "*/*/plan.json") for p in root.glob(pattern)})
    if not found:
        raise BadInput(f"no archive under {root} (an archive is results/<scenario>/<run>/ with a plan.json)")
    return found


def attention_backend(plan: Plan) -> str | None:
    argv = plan.main.nodes[0].argv if plan.main.nodes else []
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--attention-backend"), None)


def requests_of(dir: Path) -> tuple[Plan, list[Scored]]:
    """The archive's plan and its main server's completed requests, each with the plan's prompt."""
    try:
        archive = load_archive(dir)
    except EvidenceError as e:
        raise BadInput(f"{dir}: {e}") from None
    plan = archive.plan
    planned = {r.index: r.input_ids for r in plan.workload.requests}
    main = archive.evidence.roles.get("main")
    out = []
    for r in main.runner.requests if main is not None else []:
        if r.run != "main" or r.status != "ok" or not r.output_ids:
            continue
        prompt = planned.get(r.index)
        if prompt is None or len(prompt) != r.prompt_len:
            planned_len = None if prompt is None else len(prompt)
            raise BadInput(f"{dir}: request {r.index}'s prompt is not the plan's "
                           f"({r.prompt_len} tokens recorded, {planned_len} planned)")
        if len(r.output_logprobs) != len(r.output_ids):
            raise BadInput(f"{dir}: request {r.index} has {len(r.output_ids)} output tokens but "
                           f"{len(r.output_logprobs)} logprobs (was the workload run with logprobs?)")
        out.append(Scored(r.index, list(prompt), list(r.output_ids), list(r.output_logprobs)))
    return plan, out


def model_directory(plan: Plan, store: Path, override: Path | None) -> Path:
    """The archive's checkpoint: `override`, the store's copy of a synthetic model (written from its
    pinned geometry and seed when missing), or a local model's own directory."""
    if override is not None:
        return override
    pin = plan.pins.model
    if pin.synthetic is not None:
        directory = store / pin.synthetic.store_name()
        ensure_synthetic(pin.synthetic.model_dump(), directory)
        return directory
    if pin.kind == "local" and pin.path and Path(pin.path).is_dir():
        return Path(pin.path)
    raise BadInput(f"the archive's model ({pin.kind} {pin.path or pin.id}) is not on this machine: "
                   "pass --model DIR")


class Oracle:
    """transformers' forward of one checkpoint in float32 and in bfloat16."""

    def __init__(self, directory: Path, device: str) -> None:
        import torch
        import transformers

        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        self.torch, self.device = torch, device
        try:
            self.f32 = self._load(transformers, directory, torch.float32)
            self.bf16 = self._load(transformers, directory, torch.bfloat16)
        except (OSError, ValueError, KeyError, ImportError) as e:
            raise BadInput(f"transformers {transformers.__version__} cannot load {directory}: {e}") from None

    def _load(self, transformers: Any, directory: Path, dtype: Any) -> Any:
        transformers.utils.logging.disable_progress_bar()
        model, info = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype,
                                                                        output_loading_info=True)
        # A weight transformers did not find is left at its random initialisation: the reference
        # would then be another model, so the checkpoint must load whole.
        left = {k: sorted(v)[:3] for k, v in info.items() if v}
        if left:
            raise BadInput(f"transformers {transformers.__version__} does not load {directory} whole: {left}")
        return model.to(self.device).eval()

    def score(self, model: Any, ids: list[int], n_out: int) -> tuple[list[float], list[int], list[float]]:
        """log p(ids[k] | ids[:k]) at the last `n_out` positions (log_softmax in float32), the argmax
        there, and the chosen token's logit."""
        torch = self.torch
        with torch.no_grad():
            logits = model(torch.tensor([ids], device=self.device)).logits[0].float()
        at = logits[len(ids) - n_out - 1: len(ids) - 1]
        chosen = torch.tensor(ids[len(ids) - n_out:], device=self.device)[:, None]
        logp = torch.log_softmax(at, dim=-1)
        return (logp.gather(1, chosen)[:, 0].tolist(), logp.argmax(dim=-1).tolist(),
                at.gather(1, chosen)[:, 0].tolist())


def deltas(oracle: Oracle, requests: list[Scored]) -> Deltas:
    d = Deltas()
    for r in requests:
        ids = r.prompt + r.output
        ref, argmax, logits = oracle.score(oracle.f32, ids, len(r.output))
        low, low_argmax, _ = oracle.score(oracle.bf16, ids, len(r.output))
        columns = zip(r.output, r.logprobs, ref, argmax, low, low_argmax, logits, strict=True)
        for tok, got, want, best, lo, lo_best, logit in columns:
            if got is None or not math.isfinite(got):
                d.nonfinite += 1
            else:
                d.server.append(abs(got - want))
            d.bf16.append(abs(lo - want))
            d.logits.append(abs(logit))
            d.server_top1 += int(tok == best)
            d.bf16_top1 += int(lo_best == best)
    return d


def figures(d: Deltas) -> dict[str, Any]:
    """The per-archive figures of the module's doc."""
    rounding = bf16_spacing(statistics.median(d.logits)) / 2 if d.logits else 0.0
    out: dict[str, Any] = {"positions": d.positions, "nonfinite": d.nonfinite,
                           "bf16_rounding": sig(rounding), "server_vs_fp32": {}, "bf16_vs_fp32": {},
                           "floor": {}, "ratio": {}}
    srv, low = sorted(d.server), sorted(d.bf16)
    for name, q in STATS.items():
        s = nearest_rank(srv, q) if srv else None
        b = nearest_rank(low, q) if low else None
        floor = None if b is None else max(b, rounding)
        out["server_vs_fp32"][name] = None if s is None else sig(s)
        out["bf16_vs_fp32"][name] = None if b is None else sig(b)
        out["floor"][name] = None if floor is None else sig(floor)
        out["ratio"][name] = None if s is None or not floor else round(s / floor, 4)
    out["top1_agree"] = round(d.server_top1 / d.positions, 4) if d.positions else None
    out["bf16_top1_agree"] = round(d.bf16_top1 / d.positions, 4) if d.positions else None
    return out


def judge_archive(dir: Path, store: Path, override: Path | None, device: str,
                  oracles: dict[Path, Oracle]) -> dict[str, Any]:
    """One archive's row: skipped (not TP1) or scored."""
    plan, requests = requests_of(dir)
    row: dict[str, Any] = {"archive": str(dir), "scenario": plan.scenario, "engine": plan.main.engine,
                           "backend": attention_backend(plan), "architecture": plan.pins.model.architecture}
    if plan.main.world_size != 1:
        return row | {"skipped": f"main server has {plan.main.world_size} ranks, not TP1"}
    if not requests:
        return row | {"skipped": "no completed request with output tokens"}
    directory = model_directory(plan, store, override)
    if directory not in oracles:
        oracles[directory] = Oracle(directory, device)
    return row | {"model": str(directory), "requests": len(requests),
                  **figures(deltas(oracles[directory], requests))}


def table(rows: list[dict[str, Any]]) -> str:
    head = ("scenario", "backend", "pos", "srv p50", "srv p99", "srv max", "floor p50", "floor p99",
            "ratio p50", "ratio p99", "top1", "bf16 top1")
    lines = ["  ".join(f"{h:>9}" if i else f"{h:<28}" for i, h in enumerate(head))]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['scenario']:<28}  skipped: {r['skipped']}")
            continue
        cells = (r["backend"] or "-", r["positions"], r["server_vs_fp32"]["p50"], r["server_vs_fp32"]["p99"],
                 r["server_vs_fp32"]["max"], r["floor"]["p50"], r["floor"]["p99"], r["ratio"]["p50"],
                 r["ratio"]["p99"], r["top1_agree"], r["bf16_top1_agree"])
        lines.append(f"{r['scenario']:<28}  " + "  ".join(f"{_cell(c):>9}" for c in cells))
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return "-" if v is None else str(v)


def run(root: Path, *, models: Path | None = None, model: Path | None = None, device: str | None = None,
        max_ratio: float | None = None) -> tuple[int, list[dict[str, Any]]]:
    """Score every archive under `root`; (exit code, rows). Raises BadInput."""
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    store = store_dir(models)
    oracles: dict[Path, Oracle] = {}
    rows = [judge_archive(d, store, model, device, oracles) for d in archive_dirs(root)]
    scored = [r for r in rows if "skipped" not in r]
    if not scored:
        raise BadInput(f"no TP1 archive with completed requests under {root}")
    over = [r for r in scored if max_ratio is not None and (r["ratio"]["p99"] or 0) > max_ratio]
    return (1 if over else 0), rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path,
                    help="an archive, or a folder of archives (results/<scenario>/<run>/)")
    ap.add_argument("--models", type=Path,
                    help="the model store (default $CPTEST_MODELS, else .cptest/models)")
    ap.add_argument("--model", type=Path, help="score every archive with this checkpoint instead")
    ap.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when there is one")
    ap.add_argument("--max-ratio", type=float, help="exit 1 when an archive's p99 ratio is above this")
    ap.add_argument("--json", action="store_true", help="the rows as JSON on stdout")
    args = ap.parse_args(argv)
    try:
        code, rows = run(args.results, models=args.models, model=args.model, device=args.device,
                         max_ratio=args.max_ratio)
    except BadInput as e:
        print(f"family_parity: {e}", file=sys.stderr)
        return BAD_INPUT
    print(json.dumps({"exit": code, "archives": rows}, indent=2) if args.json else table(rows))
    return code


if __name__ == "__main__":
    sys.exit(main())
