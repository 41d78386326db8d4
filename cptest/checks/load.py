"""Read an archive directory into a plan and typed evidence: the only code in `checks/` that touches files.

Where the files are is `cptest.store.Layout`'s business; how a file is read is
`cptest.evidence.read_records`'. A missing file is *recorded* as missing (checkers then say
unknown); a malformed line is an `EvidenceError` naming file and line, except a truncated last line
(a rank killed mid-write), which is dropped and counted. Evidence larger than cptest reads
(`cptest.bounds`: a file, a line, or one archive's evidence and logs in all) is *recorded* as
refused, unread, and the checks then judge nothing (`checks.check_loaded`). Each role's evidence
also carries what the plan said about that server (world size, nodes, degrees, engine, placement):
what the checkers compare with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from cptest.contracts import CONTRACTS
from cptest.errors import EvidenceError, Problem, Span, did_you_mean
from cptest.evidence import Evidence, RankEvidence, RoleEvidence, RunnerEvidence, read_records
from cptest.plan.model import Plan, ServerPlan
from cptest.store import Budget, Layout, OverBound, existing_file, read_bytes, read_file, require_plain


@dataclass
class Archive:
    """A loaded archive: its plan and its evidence. Pure data."""

    dir: Path
    plan: Plan
    evidence: Evidence


def load_role(layout: Layout, server: ServerPlan, budget: Budget | None = None,
              refused: list[str] | None = None) -> RoleEvidence:
    """The evidence of one server. Each file read is charged to `budget` (a fresh one by default);
    one that is over a bound is left out and its reason appended to `refused`."""
    budget = budget if budget is not None else Budget()
    refused = refused if refused is not None else []
    role = server.role
    ev = RoleEvidence(role=role, world_size=server.world_size, nodes=[n.node_rank for n in server.nodes],
                      degrees=server.topology, engine=server.engine,
                      placement="colocated" if server.colocated else "physical")
    for world, path in layout.rank_files(role).items():
        existing_file(path)  # a folder named rank0.jsonl is an integrity error, not a traceback
        read = _bounded(refused, read_records, layout, path, budget)
        if read is not None:
            ev.ranks[world] = RankEvidence.of(world, *read)
    for world in range(server.world_size):
        if world not in ev.ranks and server.probe:
            ev.missing.append(layout.relative(layout.rank_file(role, world)))
    runner = layout.runner_file(role)
    if existing_file(runner):
        read = _bounded(refused, read_records, layout, runner, budget)
        if read is not None:
            ev.runner = RunnerEvidence.of(*read)
    else:
        ev.missing.append(layout.relative(runner))
    ended = _follower_ranks_ended(server)
    for node in ev.nodes:
        p = layout.node_log(role, node)
        if existing_file(p):
            data = _bounded(refused, _charged_bytes, layout, p, budget)
            if data is None:
                continue
            text = data.decode("utf-8", errors="replace")
            if ended is not None and node != 0:
                text, tail = split_follower_log(text, ended)
                if tail:
                    ev.follower_tails[node] = tail
            ev.logs[node] = text
            ev.log_files[node] = layout.relative(p)
        else:
            ev.missing.append(layout.relative(p))
    return ev


T = TypeVar("T")


def _bounded(refused: list[str], read: Callable[[Path, Budget], T], layout: Layout, path: Path,
             budget: Budget) -> T | None:
    """`read(path, budget)`, or None with the reason appended to `refused` when it is over a bound
    (the file named as the archive names it: the verdict says it on any machine)."""
    try:
        return read(path, budget)
    except OverBound as e:
        refused.append(e.named(layout.root))
        return None


def _charged_bytes(path: Path, budget: Budget) -> bytes:
    """A whole file's bytes (an engine log), charged to `budget` once read."""
    data = read_bytes(path)
    budget.charge(path, len(data))
    return data


def _follower_ranks_ended(server: ServerPlan) -> str | None:
    """The engine's follower line, for a co-located server; None otherwise (or for an engine or
    release cptest has no table of: its logs are then judged whole)."""
    if not server.colocated:
        return None
    from cptest.engines import colocated_launch

    recipe = colocated_launch(server.engine, server.release)
    return recipe.follower_ranks_ended if recipe is not None else None


def split_follower_log(text: str, ended: str) -> tuple[str, int]:
    """A follower node's log up to the end of the first line matching `ended`, and how many lines
    come after it (0, the whole log kept, where no line matches)."""
    import re

    m = re.search(ended, text)
    if m is None:
        return text, 0
    cut = text.find("\n", m.end())
    if cut < 0:
        return text, 0
    tail = text[cut + 1:]
    return text[: cut + 1], len(tail.splitlines())


def load_plan(root: Path) -> Plan:
    """The archive's plan.json (a version 1 plan is upgraded). Raises EvidenceError naming what is wrong."""
    path = Layout(root).plan
    if not existing_file(path):
        raise EvidenceError(Problem(Span(str(path), 1, 1), "archive has no plan.json",
                                    hint="is this an archive directory (results/<scenario>/<time>-<hash>/)?"))
    try:
        return Plan.model_validate_json(read_file(path))
    except ValidationError as e:
        if not e.errors():
            raise EvidenceError(Problem(Span(str(path), 1, 1), f"bad plan: {e}")) from None
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        hint = None
        if first["type"] == "union_tag_invalid":
            near = did_you_mean(str(first.get("ctx", {}).get("tag", "")), CONTRACTS)
            hint = f"did you mean {near!r}?" if near else None
        raise EvidenceError(Problem(Span(str(path), 1, 1), f"bad plan at {loc}: {first['msg']}",
                                    hint=hint)) from None


def load_archive(dir: Path | str, budget: Budget | None = None) -> Archive:
    """Load `dir`. Raises EvidenceError when plan.json is missing or any evidence line is malformed,
    IntegrityError (an EvidenceError) when the archive holds a link, a FIFO or a folder where a file
    belongs: nothing is read through a link. What the evidence and logs read cost is charged to
    `budget` (a fresh `bounds.ARCHIVE_EVIDENCE_BYTES` by default); what is over a bound is left
    out and named in `evidence.refused`."""
    root = Path(dir)
    require_plain(root)
    layout = Layout(root)
    plan = load_plan(root)
    budget = budget if budget is not None else Budget()
    refused: list[str] = []
    roles = {server.role: load_role(layout, server, budget, refused) for server in plan.servers()}
    return Archive(dir=root, plan=plan, evidence=Evidence(roles, [r.index for r in plan.workload.requests],
                                                          refused=refused))
