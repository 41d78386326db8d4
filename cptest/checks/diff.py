"""Evidence diff of two archives (`cptest diff`, `cptest rerun`): what differs, and whether it is
inside the declared tolerances. Pure: reads the two archives, returns values."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cptest.checks.load import load_archive
from cptest.store import Layout
from cptest.verdict import ScenarioVerdict


@dataclass(frozen=True)
class DiffEntry:
    what: str
    """e.g. `request 3 output_ids`, `rank 1 kv_pool rows`, `verdict capacity`."""
    a: Any
    b: Any
    within: bool
    """True when the difference is inside the tolerance (reported, not counted)."""


@dataclass
class DiffReport:
    a: Path
    b: Path
    entries: list[DiffEntry] = field(default_factory=list)

    @property
    def differences(self) -> list[DiffEntry]:
        return [e for e in self.entries if not e.within]

    @property
    def same(self) -> bool:
        return not self.differences

    def render(self) -> str:
        if self.same:
            return f"{self.a} and {self.b} agree ({len(self.entries)} difference(s) within tolerances)"
        lines = [f"{len(self.differences)} difference(s) between {self.a} and {self.b}:"]
        lines += [f"  {e.what}: {e.a!r} != {e.b!r}" for e in self.differences]
        return "\n".join(lines)


DEFAULT_TOLERANCES: dict[str, float] = {"logprob": 0.0, "capacity": 0.0}
"""logprob: max abs difference per position; capacity: relative difference of token counts."""


def diff(a: Path, b: Path, tolerances: dict[str, float] | None = None) -> DiffReport:
    """Compare two archives' evidence: request outputs, capacity figures, geometry and verdicts.
    Raises EvidenceError when either archive is unreadable."""
    tol = {**DEFAULT_TOLERANCES, **(tolerances or {})}
    A, B = load_archive(a).evidence, load_archive(b).evidence
    rep = DiffReport(a=Path(a), b=Path(b))
    for role in sorted(set(A.roles) | set(B.roles)):
        ra, rb = A.role(role), B.role(role)
        qa = {r.index: r for r in (ra.runner.requests if ra.runner else [])}
        qb = {r.index: r for r in (rb.runner.requests if rb.runner else [])}
        for i in sorted(set(qa) | set(qb)):
            x, y = qa.get(i), qb.get(i)
            if x is None or y is None:
                rep.entries.append(DiffEntry(f"{role} request {i}", x and x.status, y and y.status, False))
                continue
            if x.status != y.status:
                rep.entries.append(DiffEntry(f"{role} request {i} status", x.status, y.status, False))
            if x.output_ids != y.output_ids:
                rep.entries.append(
                    DiffEntry(f"{role} request {i} output_ids", x.output_ids, y.output_ids, False)
                )
            pairs = list(zip(x.output_logprobs, y.output_logprobs, strict=False))
            worst = max((abs(p - q) for p, q in pairs), default=0.0)
            if worst > 0:
                rep.entries.append(
                    DiffEntry(
                        f"{role} request {i} max logprob diff", 0.0, round(worst, 6), worst <= tol["logprob"]
                    )
                )
        for w in sorted(set(ra.ranks) | set(rb.ranks)):
            ka, kb = ra.ranks.get(w), rb.ranks.get(w)
            figs = []
            for name, get in (
                ("kv_pool rows", lambda r: r.kv_pools[-1].rows if r.kv_pools else None),
                ("allocator size", lambda r: r.kv_pools[-1].allocator_size if r.kv_pools else None),
                (
                    "max_total_num_tokens",
                    lambda r: r.capacities[-1].max_total_num_tokens if r.capacities else None,
                ),
            ):
                figs.append((name, get(ka) if ka else None, get(kb) if kb else None))
            for name, x, y in figs:
                if x != y:
                    within = (
                        x is not None and y is not None and abs(x - y) <= tol["capacity"] * max(abs(x), 1)
                    )
                    rep.entries.append(DiffEntry(f"{role} rank {w} {name}", x, y, within))
            ga = ka.geometry[-1].groups if ka and ka.geometry else None
            gb = kb.geometry[-1].groups if kb and kb.geometry else None
            if ga != gb:
                rep.entries.append(DiffEntry(f"{role} rank {w} geometry groups", ga, gb, False))
    va, vb = _verdicts(Path(a)), _verdicts(Path(b))
    for name in sorted(set(va) | set(vb)):
        if va.get(name) != vb.get(name):
            rep.entries.append(DiffEntry(f"verdict {name}", va.get(name), vb.get(name), False))
    return rep


def _verdicts(dir: Path) -> dict[str, str]:
    p = Layout(dir).verdict
    if not p.is_file():
        return {}
    sv = ScenarioVerdict.from_json(p.read_text(encoding="utf-8"))
    out = {"scenario": sv.status}
    for i, v in enumerate(sv.verdicts):
        out[f"{i}:{v.checker}"] = v.status
    return out
