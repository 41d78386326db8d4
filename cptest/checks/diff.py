"""Evidence diff of two archives (`cptest diff`, `cptest rerun`) within the declared tolerances.

Evidence falls under one of three rules:
- **exact**: what an engine that is deterministic must reproduce: the workload's inputs, each
  request's status and token ids, the teacher-forced sequences, the K/V positions each rank wrote
  per request, the pools' and groups' shapes, each checker's status. Any difference counts.
- **tolerance**: log-probabilities (free-running and teacher-forced) within the tightest logprob
  limit the plan's generation and graph parity contracts declare (for `* control`, the limit the
  verdict resolved),
  never below one float32 ulp of the values compared; capacity figures within the capacity
  contract's relative tolerance. Outside: counted; inside: reported, not counted.
- **measurement**: timings, throughput, memory: they vary from run to run by nature; reported
  beside the differences, never counted.
- **not comparable**: the speed and per-GPU memory measurements of two archives of different
  placements (one physical, one co-located): co-located ranks share GPUs and talk over sockets, so
  such figures are not speed measurements (`Colocation.cannot_judge`). Reported with both
  placements, never counted.

Not compared: the rows each rank computed per step (PCP packs the batch, so the split of one
request follows what else ran with it; the rows checker judges the rule and its status is compared),
step numbering and batch composition, top-k lists (their order at near-ties is float noise).

Pure: reads the two archives, returns values. Two archives of different scenarios are refused
(`DiffRefused`, exit 2) unless the caller asks for it.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cptest.checks.load import load_archive
from cptest.contracts.capacity import CapacityParams
from cptest.contracts.generation import GenerationParams
from cptest.contracts.graph_parity import GraphParityParams
from cptest.contracts.parity import f32_ulp
from cptest.errors import CptestError, Problem
from cptest.evidence import RankEvidence, RoleEvidence, RunnerEvidence, ranges_len, ranges_merge
from cptest.plan.model import Plan
from cptest.store import Layout, existing_file, read_file, read_manifest
from cptest.topology import PlacementMode
from cptest.verdict import ScenarioVerdict

Kind = Literal["exact", "tolerance", "measurement", "not comparable"]

DEFAULT_LOGPROB_ULPS = 8
"""|Δlogprob| allowed, in float32 ulps of the values compared, when the plan declares no logprob
bound: the CPU reference engine's batch-order noise across reruns is 1-3 ulps."""

TABLE_ROWS = 20
"""Rows of the text table before the rest is summarised as "... and N more"."""


class DiffRefused(CptestError):
    """The two archives are not runs of one scenario (and the caller did not ask to diff them
    anyway). Exit code 2: bad input."""


@dataclass(frozen=True)
class DiffEntry:
    """One compared item that differs: where, the two values, whether it counts, and why."""

    subject: str
    """What holds it: `main request`, `baseline score`, `main rank 1`, `verdict`, `control`."""
    item: int | None
    """The request index (items of one subject and field are grouped in the table), or None."""
    field: str
    """e.g. `output_ids`, `output_logprobs`, `kv_written`, `rows`, `generation`, `ttft p50 (s)`."""
    a: Any
    b: Any
    within: bool
    """True: inside the tolerance, or a measurement: reported, not counted as a difference."""
    why: str
    """Which rule judged it and how: e.g. `|Δ| 2.4e-06 at position 7 > tolerance 1.9e-06 (...)`."""
    kind: Kind = "exact"

    @property
    def what(self) -> str:
        """e.g. `main request 3 output_ids`, `main rank 1 kv_pool rows`, `verdict capacity`."""
        return " ".join(str(p) for p in (self.subject, self.item, self.field) if p is not None and p != "")

    def as_json(self) -> dict[str, Any]:
        return {"what": self.what, "subject": self.subject, "item": self.item, "field": self.field,
                "a": _jsonable(self.a), "b": _jsonable(self.b), "kind": self.kind,
                "within": self.within, "why": self.why}  # fmt: skip


@dataclass(frozen=True)
class Tolerances:
    """What the diff allows, and where each allowance comes from."""

    logprob: float | None = None
    """Largest |Δlogprob| per position that is not a difference (never below one float32 ulp of the
    values compared); None: `DEFAULT_LOGPROB_ULPS` ulps (the plan declares no logprob bound)."""
    logprob_from: str = f"no logprob bound declared: {DEFAULT_LOGPROB_ULPS} float32 ulps of the values"
    capacity: float = 0.0
    """Relative difference of a pool or capacity figure that is not a difference."""
    capacity_from: str = "no capacity tolerance declared: exact"

    def logprob_at(self, x: float, y: float) -> float:
        """The |Δlogprob| allowed between `x` and `y`."""
        ulp = f32_ulp(max(abs(x), abs(y)))
        return max(self.logprob, ulp) if self.logprob is not None else DEFAULT_LOGPROB_ULPS * ulp

    def as_json(self) -> dict[str, Any]:
        return {"logprob": self.logprob, "logprob_from": self.logprob_from, "logprob_default_ulps":
                DEFAULT_LOGPROB_ULPS, "capacity": self.capacity, "capacity_from": self.capacity_from}


@dataclass
class DiffReport:
    a: Path
    b: Path
    scenario: str = ""
    scenario_b: str = ""
    tolerances: Tolerances = field(default_factory=Tolerances)
    entries: list[DiffEntry] = field(default_factory=list)
    placement_a: PlacementMode = "physical"
    placement_b: PlacementMode = "physical"

    @property
    def differences(self) -> list[DiffEntry]:
        return [e for e in self.entries if not e.within]

    @property
    def within(self) -> list[DiffEntry]:
        """Differences inside a tolerance (not measurements): reported, not counted."""
        return [e for e in self.entries if e.within and e.kind not in ("measurement", "not comparable")]

    @property
    def measurements(self) -> list[DiffEntry]:
        return [e for e in self.entries if e.kind == "measurement"]

    @property
    def not_comparable(self) -> list[DiffEntry]:
        """Speed and memory figures of archives of different placements: shown, never compared."""
        return [e for e in self.entries if e.kind == "not comparable"]

    @property
    def same(self) -> bool:
        return not self.differences

    def placements(self) -> str:
        """`a physical, b co-located`, `both co-located`, or "" when both are physical (the text of a
        diff of physical archives reads as it always did)."""
        a, b = (_placement_words(p) for p in (self.placement_a, self.placement_b))
        if a == b:
            return "" if self.placement_a == "physical" else f"both {a}"
        return f"a {a}, b {b}"

    def as_json(self) -> dict[str, Any]:
        return {"a": str(self.a), "b": str(self.b), "scenario": self.scenario, "scenario_b": self.scenario_b,
                "placement_a": self.placement_a, "placement_b": self.placement_b,
                "same": self.same, "differences": len(self.differences), "within": len(self.within),
                "tolerances": self.tolerances.as_json(),
                "entries": [e.as_json() for e in self.entries]}  # fmt: skip

    def render(self) -> str:
        """A short table: one row per differing item (items of one subject and field grouped), then
        one line for what is inside the tolerances and one per server for the measurements (or for
        the figures that are not comparable across placements). No colour."""
        names = self.scenario if self.scenario == self.scenario_b else f"{self.scenario} vs {self.scenario_b}"
        if self.placements():
            names += f"; {self.placements()}"
        n = len(self.differences)
        if n == 0:
            lines = [f"{self.a} and {self.b} agree ({names}): no difference outside the declared tolerances"]
        else:
            lines = [f"{n} difference(s) between {self.a} and {self.b} ({names}):"]
            rows = [_row(group) for group in _groups(self.differences)]
            shown = rows[:TABLE_ROWS]
            lines += _table(("what", "a", "b", "why"), shown)
            if len(rows) > len(shown):
                lines.append(f"  ... and {len(rows) - len(shown)} more (--json lists every one)")
        if self.within:
            by_field = Counter(e.field for e in self.within)
            what = ", ".join(f"{k} {f}" for f, k in sorted(by_field.items()))
            worst = max(self.within, key=lambda e: e.kind == "tolerance")
            lines.append(f"within tolerances, not counted: {what} (e.g. {worst.what}: {worst.why})")
        for subject, figs in _figures_by_subject(self.measurements):
            lines.append(f"measured ({subject}, a / b; not compared): {figs}")
        for subject, figs in _figures_by_subject(self.not_comparable):
            lines.append(f"not comparable (co-located; {subject}, a / b; {self.placements()}): {figs}")
        return "\n".join(lines)


def _figures_by_subject(entries: list[DiffEntry]) -> list[tuple[str, str]]:
    """Per subject (a server), its entries' `field a / b` figures, in the order first seen."""
    by_subject: dict[str, list[DiffEntry]] = defaultdict(list)
    for e in entries:
        by_subject[e.subject].append(e)
    return [(subject, ", ".join(f"{e.field} {_fmt(e.a, digits=4)} / {_fmt(e.b, digits=4)}" for e in es))
            for subject, es in by_subject.items()]


def _placement_words(p: PlacementMode) -> str:
    return "co-located" if p == "colocated" else p


# ---------------------------------------------------------------- the diff
def diff(a: Path | str, b: Path | str, tolerances: dict[str, float] | None = None, *,
         other_scenario: bool = False) -> DiffReport:
    """Compare two archives' evidence (module docstring: what is exact, what within tolerance, what
    a measurement). `tolerances` overrides the plan's (`logprob`: absolute |Δlogprob|, `capacity`:
    relative). Raises DiffRefused when the archives are of different scenarios (name or canonical
    scenario sha256) and `other_scenario` is false; EvidenceError when either is unreadable."""
    a, b = Path(a), Path(b)
    A, B = load_archive(a), load_archive(b)
    (name_a, sha_a), (name_b, sha_b) = _scenario_of(a, A.plan), _scenario_of(b, B.plan)
    if (name_a, sha_a) != (name_b, sha_b) and not other_scenario:
        raise DiffRefused(Problem(
            None, f"{a} and {b} are runs of different scenarios: {name_a} (sha256 {sha_a[:12]}) and "
                  f"{name_b} (sha256 {sha_b[:12]})"
                  + ("; the scenario changed between the runs" if name_a == name_b else ""),
            expected="two archives of one scenario (manifest scenario and pins.scenario_sha256)",
            hint="pass --other-scenario to compare their evidence anyway"))  # fmt: skip
    va, vb = _verdict(a), _verdict(b)
    tol = _tolerances(A.plan, B.plan, va, vb, tolerances or {})
    rep = DiffReport(a=a, b=b, scenario=name_a, scenario_b=name_b, tolerances=tol,
                     placement_a=A.plan.placement, placement_b=B.plan.placement)
    same_placement = rep.placement_a == rep.placement_b
    for role in sorted(set(A.evidence.roles) | set(B.evidence.roles)):
        ra, rb = A.evidence.role(role), B.evidence.role(role)
        rep.entries += _role(role, ra, rb, tol, same_placement)
    rep.entries += _verdicts(va, vb)
    return rep


def _scenario_of(root: Path, plan: Plan) -> tuple[str, str]:
    """(scenario name, canonical scenario sha256) from the manifest, else from the plan."""
    m = read_manifest(Layout(root)) or {}
    pins = m.get("pins") if isinstance(m.get("pins"), dict) else {}
    return (str(m.get("scenario") or plan.scenario),
            str(pins.get("scenario_sha256") or plan.pins.scenario_sha256))  # fmt: skip


def _verdict(root: Path) -> ScenarioVerdict | None:
    p = Layout(root).verdict
    if not existing_file(p):
        return None
    try:
        return ScenarioVerdict.from_json(read_file(p))
    except ValueError:
        return None


# ---------------------------------------------------------------- tolerances from the plans
def _tolerances(pa: Plan, pb: Plan, va: ScenarioVerdict | None, vb: ScenarioVerdict | None,
                given: dict[str, float]) -> Tolerances:
    """The tightest logprob limit and capacity tolerance the two plans declare (`given` wins)."""
    limits: list[tuple[float, str]] = []
    capacity: list[tuple[float, str]] = []
    for plan in (pa, pb):
        for e in plan.expectations:
            if isinstance(e, GenerationParams | GraphParityParams):
                # graph parity's bounds are log-probability limits of the same kind
                name = e.kind.replace("_", " ")
                if isinstance(e, GenerationParams) and e.logprob_within is not None:
                    limits.append((e.logprob_within, f"generation logprob_within {e.logprob_within:g}"))
                for bound in e.bounds:
                    if bound.metric != "logprob":
                        continue
                    if not bound.relative:
                        limits.append((bound.limit, f"{name} {bound.text()}"))
                        continue
                    resolved = [x for v in (va, vb)
                                if (x := _resolved_limit(v, bound.text(), e.kind)) is not None]
                    if resolved:
                        limits.append((min(resolved), f"{name} {bound.text()}, limit "
                                                      f"{min(resolved):.4g} as its verdict resolved it"))
            elif isinstance(e, CapacityParams):
                capacity.append((e.tolerance, f"capacity within {e.tolerance:g}"))
    tol = Tolerances()
    if limits:
        lim, src = min(limits)
        tol = Tolerances(logprob=lim, logprob_from=src)
    if capacity:
        cap, src = min(capacity)
        tol = Tolerances(tol.logprob, tol.logprob_from, cap, src)
    if "logprob" in given:
        tol = Tolerances(given["logprob"], "given", tol.capacity, tol.capacity_from)
    if "capacity" in given:
        tol = Tolerances(tol.logprob, tol.logprob_from, given["capacity"], "given")
    return tol


def _resolved_limit(v: ScenarioVerdict | None, bound: str, checker: str = "generation") -> float | None:
    """The limit `checker`'s verdict computed for `bound` (a `* control` bound: X times the floor);
    the smallest where it resolved several (graph parity: one per measure)."""
    found: list[float] = []
    for x in v.verdicts if v else []:
        if x.checker != checker:
            continue
        for row in x.figures.get("bounds") or []:
            limit = row.get("limit") if isinstance(row, dict) and row.get("bound") == bound else None
            if isinstance(limit, int | float):
                found.append(float(limit))
    return min(found) if found else None


# ---------------------------------------------------------------- one server
def _role(role: str, ra: RoleEvidence, rb: RoleEvidence, tol: Tolerances,
          same_placement: bool = True) -> list[DiffEntry]:
    out: list[DiffEntry] = []
    if sorted(ra.missing) != sorted(rb.missing):
        out.append(DiffEntry(role, None, "missing evidence", sorted(ra.missing), sorted(rb.missing), False,
                             "which evidence files exist is exact"))
    xa, xb = ra.runner or RunnerEvidence(), rb.runner or RunnerEvidence()
    out += _requests(role, xa, xb, tol)
    out += _scores(role, xa, xb, tol)
    for w in sorted(set(ra.ranks) | set(rb.ranks)):
        out += _rank(f"{role} rank {w}", ra.ranks.get(w), rb.ranks.get(w), tol)
    out += _measurements(role, xa, xb, same_placement)
    return out


_INPUTS = ("prompt_len", "prompt_sha256", "max_new_tokens")


def _requests(role: str, xa: RunnerEvidence, xb: RunnerEvidence, tol: Tolerances) -> list[DiffEntry]:
    out: list[DiffEntry] = []
    subject = f"{role} request"
    qa, qb = {r.index: r for r in xa.requests}, {r.index: r for r in xb.requests}
    for i in sorted(set(qa) | set(qb)):
        x, y = qa.get(i), qb.get(i)
        if x is None or y is None:
            out.append(DiffEntry(subject, i, "record", x and x.status, y and y.status, False,
                                 "a request's record on one side only"))
            continue
        for name in _INPUTS:
            if getattr(x, name) != getattr(y, name):
                out.append(DiffEntry(subject, i, name, getattr(x, name), getattr(y, name), False,
                                     "the workload's inputs are exact"))
        if x.status != y.status:
            out.append(DiffEntry(subject, i, "status", x.status, y.status, False,
                                 "a request's status is exact"))
        agreed = _common_prefix(x.output_ids, y.output_ids)
        if x.output_ids != y.output_ids:
            first = _first_difference(x.output_ids, y.output_ids, agreed)
            out.append(DiffEntry(subject, i, "output_ids", x.output_ids, y.output_ids, False,
                                 f"token ids are exact: {first}"))
        # Past the first differing token each side is conditioned on its own history: not comparable.
        lx, ly = x.output_logprobs[:agreed], y.output_logprobs[:agreed]
        e = _logprobs(subject, i, "output_logprobs", lx, ly, tol)
        if e is not None:
            out.append(e)
    return out


def _scores(role: str, xa: RunnerEvidence, xb: RunnerEvidence, tol: Tolerances) -> list[DiffEntry]:
    out: list[DiffEntry] = []
    subject = f"{role} score"
    sa, sb = {s.index: s for s in xa.scores}, {s.index: s for s in xb.scores}
    for i in sorted(set(sa) | set(sb)):
        x, y = sa.get(i), sb.get(i)
        if x is None or y is None:
            out.append(DiffEntry(subject, i, "record", x and x.status, y and y.status, False,
                                 "a teacher-forced score on one side only"))
            continue
        exact = False
        for name in ("sequence_sha256", "start", "status"):
            if getattr(x, name) != getattr(y, name):
                exact = True
                out.append(DiffEntry(subject, i, name, getattr(x, name), getattr(y, name), False,
                                     "the scored sequence and its status are exact"))
        if len(x.token_logprobs) != len(y.token_logprobs):
            exact = True
            out.append(DiffEntry(subject, i, "positions", len(x.token_logprobs), len(y.token_logprobs), False,
                                 "the number of scored positions is exact"))
        if not exact:
            e = _logprobs(subject, i, "token_logprobs", x.token_logprobs, y.token_logprobs, tol)
            if e is not None:
                out.append(e)
    return out


def _logprobs(subject: str, i: int, name: str, xs: Sequence[float], ys: Sequence[float],
              tol: Tolerances) -> DiffEntry | None:
    """The worst position of two logprob lists against the tolerance; None when they are equal."""
    worst: tuple[float, int, float, float, float] | None = None  # (excess ratio, position, |Δ|, x, y)
    for j, (p, q) in enumerate(zip(xs, ys, strict=False)):
        if math.isnan(p) or math.isnan(q):
            if math.isnan(p) and math.isnan(q):
                continue
            return DiffEntry(subject, i, name, p, q, False,
                             f"a logprob at position {j} on one side only (NaN)", "tolerance")
        d = abs(p - q)
        if d == 0:
            continue
        limit = tol.logprob_at(p, q)
        ratio = d / limit if limit else math.inf
        if worst is None or ratio > worst[0]:
            worst = (ratio, j, d, p, q)
    if worst is None:
        return None
    ratio, j, d, p, q = worst
    limit = tol.logprob_at(p, q)
    inside = ratio <= 1
    why = f"|Δ| {d:.3g} at position {j} {'<=' if inside else '>'} tolerance {limit:.3g} ({tol.logprob_from})"
    return DiffEntry(subject, i, name, p, q, inside, why, "tolerance")


def _rank(subject: str, ka: RankEvidence | None, kb: RankEvidence | None, tol: Tolerances) -> list[DiffEntry]:
    out: list[DiffEntry] = []
    if ka is None or kb is None:
        return [DiffEntry(subject, None, "evidence", ka is not None, kb is not None, False,
                          "a rank's evidence on one side only")]
    figures: tuple[tuple[str, Callable[[RankEvidence], int | None]], ...] = (
        ("kv_pool rows", lambda r: r.kv_pools[-1].rows if r.kv_pools else None),
        ("allocator size", lambda r: r.kv_pools[-1].allocator_size if r.kv_pools else None),
        ("max_total_num_tokens", lambda r: r.capacities[-1].max_total_num_tokens if r.capacities else None),
    )
    for name, get in figures:
        x, y = get(ka), get(kb)
        if x == y:
            continue
        if x is None or y is None:
            out.append(DiffEntry(subject, None, name, x, y, False, "a capacity figure on one side only"))
            continue
        rel = abs(x - y) / max(abs(x), abs(y), 1)
        inside = rel <= tol.capacity
        op = "<=" if inside else ">"
        why = f"relative difference {rel:.3g} {op} {tol.capacity:g} ({tol.capacity_from})"
        out.append(DiffEntry(subject, None, name, x, y, inside, why, "tolerance"))
    ga = ka.geometry[-1].groups if ka.geometry else None
    gb = kb.geometry[-1].groups if kb.geometry else None
    if ga != gb:
        out.append(DiffEntry(subject, None, "geometry groups", ga, gb, False, "process groups are exact"))
    oa, ob = _kv_owned(ka), _kv_owned(kb)
    if oa != ob:
        only_a, only_b, trailing = _unpaired(oa - ob, ob - oa)
        if only_a or only_b:
            more = f" ({trailing} more differ by one trailing position)" if trailing else ""
            out.append(DiffEntry(subject, None, "kv_written", _owned_summary(oa), _owned_summary(ob), False,
                                 f"K/V positions written per request are exact: {only_a} request(s)' "
                                 f"positions only in a, {only_b} only in b{more}"))
        else:
            out.append(DiffEntry(subject, None, "kv_written", _owned_summary(oa), _owned_summary(ob), True,
                                 f"{trailing} request(s) differ by one trailing position only: a decode step "
                                 "the overlap scheduler ran past a finished request's end, as timing had it "
                                 "(the rows contract accepts either end); every other position is exact",
                                 "tolerance"))
    return out


def _unpaired(ra: Counter[tuple[tuple[int, int], ...]],
              rb: Counter[tuple[tuple[int, int], ...]]) -> tuple[int, int, int]:
    """(requests only in a, only in b, pairs that differ by one trailing position) of the requests
    the exact match left. SGLang's overlap scheduler may run one decode step past a request's last
    needed position (in a rerun, as many as a quarter of the requests); a rank that owns that
    position writes it. A pair differs that way when one side's positions are the other's plus one
    position past all of them."""
    b_left = list(rb.elements())
    only_a = trailing = 0
    for x in ra.elements():
        hit = next((i for i, y in enumerate(b_left) if _one_past(x, y) or _one_past(y, x)), None)
        if hit is None:
            only_a += 1
        else:
            trailing += 1
            del b_left[hit]
    return only_a, len(b_left), trailing


def _one_past(short: tuple[tuple[int, int], ...], long: tuple[tuple[int, int], ...]) -> bool:
    """`long` is `short` and one more position after all of `short`'s."""
    if ranges_len(list(long)) != ranges_len(list(short)) + 1 or not long:
        return False
    a, b = long[-1]
    trimmed = list(long[:-1]) + ([(a, b - 1)] if b - 1 > a else [])
    return tuple(trimmed) == short


def _kv_owned(rank: RankEvidence) -> Counter[tuple[tuple[int, int], ...]]:
    """The K/V positions this rank wrote for each request, as a multiset over requests (the engine's
    request ids are its own, so requests are matched by what was written). Health checks are left
    out: how many the server ran depends on time."""
    per_rid: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for step in rank.steps:
        for rid, ranges in step.kv_written.items():
            if not rid.startswith("HEALTH_CHECK"):
                per_rid[rid] += ranges
    return Counter(tuple(ranges_merge(r)) for r in per_rid.values())


def _owned_summary(owned: Counter[tuple[tuple[int, int], ...]]) -> str:
    positions = sum(ranges_len(r) * n for r, n in owned.items())
    return f"{positions} pos. of {sum(owned.values())} requests"


def _measurements(role: str, xa: RunnerEvidence, xb: RunnerEvidence,
                  same_placement: bool = True) -> list[DiffEntry]:
    """Timings, throughput and memory of one server: reported, never counted. Across placements the
    speed and memory figures are not comparable at all, and say so."""
    out = []
    for name, get in _MEASURES:
        x, y = get(xa), get(xb)
        if x is None and y is None:
            continue
        if same_placement or name not in PLACEMENT_BOUND:
            out.append(DiffEntry(role, None, name, x, y, True, "a measurement: varies from run to run",
                                 "measurement"))
        else:
            out.append(DiffEntry(role, None, name, x, y, True, "not comparable (co-located): one archive's "
                                 "ranks shared GPUs, so its figures are not speed or per-GPU memory "
                                 "measurements", "not comparable"))
    return out


def _median(values: Iterable[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


def _event_detail(x: RunnerEvidence, event: str, key: str) -> float | None:
    for e in x.events(event):
        v = e.detail.get(key)
        if isinstance(v, int | float):
            return float(v)
    return None


def _output_rate(x: RunnerEvidence) -> float | None:
    done = [r for r in x.requests if r.status == "ok" and r.e2e_s is not None]
    if not done:
        return None
    span = max(r.sent_at + (r.e2e_s or 0.0) for r in done) - min(r.sent_at for r in done)
    return sum(len(r.output_ids) for r in done) / span if span > 0 else None


def _gpu_peak(x: RunnerEvidence) -> float | None:
    used = [sum(s.used_mib.values()) for s in x.gpu if s.used_mib]
    return float(max(used)) if used else None


_MEASURES: tuple[tuple[str, Callable[[RunnerEvidence], float | None]], ...] = (
    ("ready (s)", lambda x: _event_detail(x, "ready", "after_s")),
    ("ttft p50 (s)", lambda x: _median(r.ttft_s for r in x.requests if r.status == "ok")),
    ("tpot p50 (s)", lambda x: _median(r.tpot_s for r in x.requests if r.status == "ok")),
    ("e2e p50 (s)", lambda x: _median(r.e2e_s for r in x.requests if r.status == "ok")),
    ("output tok/s", _output_rate),
    ("gpu peak (MiB)", _gpu_peak),
    ("shutdown (s)", lambda x: _event_detail(x, "shutdown_done", "after_s")),
)

PLACEMENT_BOUND = frozenset({"ready (s)", "ttft p50 (s)", "tpot p50 (s)", "e2e p50 (s)", "output tok/s",
                             "gpu peak (MiB)"})
"""The measurements that co-location cannot judge (`Colocation.cannot_judge`): speed (startup,
latency, throughput: ranks share one GPU's SMs, collectives go over sockets) and per-GPU memory
(device totals mix the ranks of a GPU). How long shutdown takes is judged per node process either
way, so it stays a measurement."""


def _verdicts(va: ScenarioVerdict | None, vb: ScenarioVerdict | None) -> list[DiffEntry]:
    sa, sb = checker_statuses(va), checker_statuses(vb)
    return [DiffEntry("verdict", None, name, sa.get(name), sb.get(name), False, "a checker's status is exact")
            for name in sorted(set(sa) | set(sb), key=lambda n: (n != "scenario", n))
            if sa.get(name) != sb.get(name)]  # fmt: skip


def checker_statuses(v: ScenarioVerdict | None) -> dict[str, str]:
    """`scenario` -> the overall status, then each checker -> its status (a checker judged more than
    once is named `<checker> #2`, `#3`...); empty for no verdict."""
    if v is None:
        return {}
    out = {"scenario": v.status}
    seen: Counter[str] = Counter()
    for x in v.verdicts:
        seen[x.checker] += 1
        out[x.checker if seen[x.checker] == 1 else f"{x.checker} #{seen[x.checker]}"] = x.status
    return out


# ---------------------------------------------------------------- helpers
def _common_prefix(xs: Sequence[int], ys: Sequence[int]) -> int:
    k = 0
    while k < min(len(xs), len(ys)) and xs[k] == ys[k]:
        k += 1
    return k


def _first_difference(xs: Sequence[int], ys: Sequence[int], k: int) -> str:
    if k < min(len(xs), len(ys)):
        return f"first differs at output position {k} ({xs[k]} vs {ys[k]})"
    return f"{len(xs)} vs {len(ys)} tokens, the same up to position {k}"


def _groups(entries: list[DiffEntry]) -> list[list[DiffEntry]]:
    """Entries of one subject, field and kind together (in first-seen order)."""
    out: dict[tuple[str, str, str], list[DiffEntry]] = {}
    for e in entries:
        out.setdefault((e.subject, e.field, e.kind), []).append(e)
    return list(out.values())


def _row(group: list[DiffEntry]) -> tuple[str, str, str, str]:
    first = group[0]
    if len(group) == 1:
        return (first.what, _fmt(first.a), _fmt(first.b), first.why)
    items = sorted(e.item for e in group if e.item is not None)
    what = f"{first.subject} {_spans(items)} {first.field} ({len(group)} items)"
    return (what, _fmt(first.a), _fmt(first.b), f"first: {first.why}")


def _spans(items: list[int], most: int = 3) -> str:
    """`3..17` or `0..4, 9, 12..15` (at most `most` runs, then `…`)."""
    runs: list[list[int]] = []
    for i in items:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in runs[:most])
    return text + (", …" if len(runs) > most else "")


def _fmt(v: Any, width: int = 28, digits: int = 9) -> str:
    """A cell: numbers by value (9 significant digits by default, so that float noise never prints
    as `0.0`), long lists shortened."""
    if v is None:
        return "-"
    if isinstance(v, bool | int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    if isinstance(v, list) and len(v) > 4:
        text = f"[{', '.join(_fmt(x) for x in v[:2])}, … ({len(v)})]"
    else:
        text = str(v)
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header) - 1)]
    return ["  " + "  ".join([*(r[c].ljust(widths[c]) for c in range(len(widths))), r[-1]]).rstrip()
            for r in [header, *rows]]  # fmt: skip


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else str(v)
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return v
