"""Generation parity figures: pure functions over the runner records of two servers.

Teacher-forced (`Score` records): every server scored the same token sequences (each prompt followed
by the baseline's greedy output for it), so position j of request i is the same history on both
sides and the two log-probabilities of the sequence's token are directly comparable. Figures over
all scored positions: |Δlogprob| at p50, p99 and max (nearest rank), and top-k agreement (the
fraction of positions where each side's most likely token is among the other side's k most likely).

Free-running (`RequestResult` records): the rule of vLLM's test-suite (`check_logprobs_close`): the
outputs are compared up to the first token where they differ; there, each side's token must be among
the other side's top-k at that position (same history up to it, so the distributions compare); past
it, the sequences are conditioned on different histories and nothing more is compared.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cptest.evidence import RequestResult, Score


def nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile by nearest rank (a value that occurred, no interpolation)."""
    n = len(sorted_values)
    return sorted_values[min(max(math.ceil(q * n) - 1, 0), n - 1)]


STATS = {"p50": 0.5, "p99": 0.99, "max": 1.0}


def sig(x: float, digits: int = 6) -> float:
    """`x` to `digits` significant digits (figures of 1e-7 must not print as 0)."""
    return float(f"{x:.{digits}g}")


def f32_ulp(x: float) -> float:
    """The spacing of float32 numbers at |x|: the smallest difference two engines returning float32
    log-probabilities of that size can show."""
    x = abs(x)
    if x == 0 or not math.isfinite(x):
        return 0.0
    return 2.0 ** (math.floor(math.log2(x)) - 23)


def _top_ids(top: Sequence[Sequence[Any]], k: int) -> set[int]:
    return {int(t[0]) for t in top[:k]}


@dataclass
class ForcedFigures:
    """|Δlogprob| and top-k agreement of one server against the baseline over the same sequences."""

    requests: int = 0
    positions: int = 0
    deltas: list[float] = field(default_factory=list)
    largest: float = 0.0
    """Largest |logprob| compared: one float32 ulp at it is the figures' resolution."""
    agree: dict[int, int] = field(default_factory=dict)
    """k -> positions where both top-1 tokens are within the other side's top-k."""
    topk_positions: int = 0
    """Positions where both sides sent a top list (the denominator of agreement)."""
    per_request: list[dict[str, Any]] = field(default_factory=list)
    mismatched: list[int] = field(default_factory=list)
    """Requests whose scored sequence differs (hash) between the two sides: not comparable."""

    def stat(self, name: str) -> float | None:
        if not self.deltas:
            return None
        return nearest_rank(sorted(self.deltas), STATS[name])

    @property
    def resolution(self) -> float:
        return f32_ulp(self.largest)

    def agreement(self, k: int) -> float | None:
        if not self.topk_positions:
            return None
        return self.agree.get(k, 0) / self.topk_positions

    def summary(self, ks: Iterable[int]) -> dict[str, Any]:
        out: dict[str, Any] = {"requests": self.requests, "positions": self.positions}
        for name in STATS:
            v = self.stat(name)
            out[f"logprob_{name}"] = None if v is None else sig(v)
        out["resolution"] = sig(self.resolution)
        for k in sorted(set(ks)):
            a = self.agreement(k)
            out[f"top{k}_agree"] = None if a is None else sig(a)
        if self.mismatched:
            out["mismatched_sequences"] = self.mismatched
        return out


def forced(side: Iterable[Score], baseline: Iterable[Score], ks: Sequence[int]) -> ForcedFigures:
    """Compare `side`'s scores with the baseline's, request by request (only `ok` on both)."""
    b = {s.index: s for s in baseline if s.status == "ok"}
    fig = ForcedFigures(agree={k: 0 for k in ks})
    for s in sorted((s for s in side if s.status == "ok" and s.index in b), key=lambda s: s.index):
        o = b[s.index]
        if s.sequence_sha256 != o.sequence_sha256 or s.start != o.start:
            fig.mismatched.append(s.index)
            continue
        fig.requests += 1
        mine = _abs_deltas(fig, zip(s.token_logprobs, o.token_logprobs, strict=False))  # the shorter decides
        row: dict[str, Any] = {"index": s.index, "positions": len(mine)}
        if mine:
            srt = sorted(mine)
            row.update(p50=sig(nearest_rank(srt, 0.5)), p99=sig(nearest_rank(srt, 0.99)), max=sig(srt[-1]))
        for j in range(min(len(s.top), len(o.top))):
            if not s.top[j] or not o.top[j]:
                continue
            fig.topk_positions += 1
            for k in ks:
                if int(s.top[j][0][0]) in _top_ids(o.top[j], k) and int(o.top[j][0][0]) in _top_ids(
                    s.top[j], k
                ):
                    fig.agree[k] += 1
        fig.per_request.append(row)
    return fig


@dataclass
class FreeRunning:
    """The free-running comparison of one server with the baseline under the vLLM rule."""

    pairs: int = 0
    identical: int = 0
    diverged: int = 0
    within_topk: int = 0
    violations: list[dict[str, Any]] = field(default_factory=list)
    unjudged: list[int] = field(default_factory=list)
    """Diverged requests without a top-k list at the divergence (nothing to judge them by)."""
    agreed_tokens: int = 0
    compared_tokens: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "identical": self.identical,
            "diverged": self.diverged,
            "diverged_within_topk": self.within_topk,
            "violations": self.violations[:10],
            "violation_count": len(self.violations),
            "unjudged": self.unjudged,
            "prefix_agree": round(self.agreed_tokens / self.compared_tokens, 6)
            if self.compared_tokens
            else None,
        }


def free_running(
    side: Iterable[RequestResult], baseline: Iterable[RequestResult], k: int | None
) -> FreeRunning:
    """Pairs of `ok` answers by request index; `k` None: only count prefixes and divergences."""
    b = {r.index: r for r in baseline if r.status == "ok"}
    fr = FreeRunning()
    for r in sorted((r for r in side if r.status == "ok" and r.index in b), key=lambda r: r.index):
        o = b[r.index]
        fr.pairs += 1
        a, c = r.output_ids, o.output_ids
        n = min(len(a), len(c))
        j = 0
        while j < n and a[j] == c[j]:
            j += 1
        fr.agreed_tokens += j
        fr.compared_tokens += max(len(a), len(c))
        if j == max(len(a), len(c)):
            fr.identical += 1
            continue
        fr.diverged += 1
        if j == n:  # one side stopped early (an end-of-sequence token the other did not pick)
            fr.within_topk += 1 if k is not None else 0
            continue
        if k is None:
            continue
        ta = r.output_top[j] if r.output_top is not None and j < len(r.output_top) else None
        tc = o.output_top[j] if o.output_top is not None and j < len(o.output_top) else None
        if not ta or not tc:
            fr.unjudged.append(r.index)
            continue
        if a[j] in _top_ids(tc, k) and c[j] in _top_ids(ta, k):
            fr.within_topk += 1
        else:
            fr.violations.append(
                {
                    "index": r.index,
                    "position": j,
                    "token": a[j],
                    "baseline_token": c[j],
                    "baseline_topk": sorted(_top_ids(tc, k)),
                    "topk": sorted(_top_ids(ta, k)),
                }
            )
    return fr


def _abs_deltas(fig: ForcedFigures, pairs: Iterable[tuple[float, float]]) -> list[float]:
    """|Δlogprob| of each pair where both sides have a logprob (NaN: SGLang sent none), added to
    `fig`'s positions and deltas, its largest |logprob| widened (the float32 ulp scale)."""
    mine: list[float] = []
    for a, c in pairs:
        if math.isnan(a) or math.isnan(c):
            continue
        mine.append(abs(a - c))
        fig.largest = max(fig.largest, abs(a), abs(c))
    fig.positions += len(mine)
    fig.deltas.extend(mine)
    return mine


def decode_prefix(side: Iterable[RequestResult], other: Iterable[RequestResult]) -> ForcedFigures:
    """|Δlogprob| of the free-running outputs along each pair's common greedy prefix, past its first
    token: the positions where both sides had the same history and computed the token's logprob in
    a *decode* forward (position 0 comes from the prefill). Teacher forcing by agreement: what the
    scored sequences cannot show, since scoring is one prefill forward and never runs a decode graph.
    Pairs of `ok` answers by request index; top-k agreement is not figured (no top lists needed)."""
    b = {r.index: r for r in other if r.status == "ok"}
    fig = ForcedFigures()
    for r in sorted((r for r in side if r.status == "ok" and r.index in b), key=lambda r: r.index):
        o = b[r.index]
        n = min(len(r.output_ids), len(o.output_ids), len(r.output_logprobs), len(o.output_logprobs))
        k = 0
        while k < n and r.output_ids[k] == o.output_ids[k]:
            k += 1
        fig.requests += 1
        mine = _abs_deltas(fig, zip(r.output_logprobs[1:k], o.output_logprobs[1:k], strict=True))
        row: dict[str, Any] = {"index": r.index, "positions": len(mine), "prefix": k}
        if mine:
            srt = sorted(mine)
            row.update(p50=sig(nearest_rank(srt, 0.5)), p99=sig(nearest_rank(srt, 0.99)), max=sig(srt[-1]))
        fig.per_request.append(row)
    return fig
