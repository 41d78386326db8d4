"""Read an archive directory into a plan and typed evidence: the only code in `checks/` that touches files.

Where the files are is `cptest.store.Layout`'s business; how a file is read is
`cptest.evidence.read_records`'. A missing file is *recorded* as missing (checkers then say
unknown); a malformed line is an `EvidenceError` naming file and line, except a truncated last line
(a rank killed mid-write), which is dropped and counted. Each role's evidence also carries what the
plan said about that server (world size, nodes, degrees, engine, placement): what the checkers
compare with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from cptest.contracts import CONTRACTS
from cptest.errors import EvidenceError, Problem, Span, did_you_mean
from cptest.evidence import Evidence, RankEvidence, RoleEvidence, RunnerEvidence, read_records
from cptest.plan.model import Plan, ServerPlan
from cptest.store import Layout, existing_file, read_bytes, read_file, require_plain


@dataclass
class Archive:
    """A loaded archive: its plan and its evidence. Pure data."""

    dir: Path
    plan: Plan
    evidence: Evidence


def load_role(layout: Layout, server: ServerPlan) -> RoleEvidence:
    role = server.role
    ev = RoleEvidence(role=role, world_size=server.world_size, nodes=[n.node_rank for n in server.nodes],
                      degrees=server.topology, engine=server.engine,
                      placement="colocated" if server.colocated else "physical")
    for world, path in layout.rank_files(role).items():
        existing_file(path)  # a folder named rank0.jsonl is an integrity error, not a traceback
        records, dropped = read_records(path)
        ev.ranks[world] = RankEvidence.of(world, records, dropped)
    for world in range(server.world_size):
        if world not in ev.ranks and server.probe:
            ev.missing.append(layout.relative(layout.rank_file(role, world)))
    runner = layout.runner_file(role)
    if existing_file(runner):
        ev.runner = RunnerEvidence.of(*read_records(runner))
    else:
        ev.missing.append(layout.relative(runner))
    ended = _follower_ranks_ended(server)
    for node in ev.nodes:
        p = layout.node_log(role, node)
        if existing_file(p):
            text = read_bytes(p).decode("utf-8", errors="replace")
            if ended is not None and node != 0:
                text, tail = split_follower_log(text, ended)
                if tail:
                    ev.follower_tails[node] = tail
            ev.logs[node] = text
        else:
            ev.missing.append(layout.relative(p))
    return ev


def _follower_ranks_ended(server: ServerPlan) -> str | None:
    """The engine's follower line, for a co-located server; None otherwise (or for an engine or
    release cptest has no table of: its logs are then judged whole)."""
    if not server.colocated:
        return None
    from cptest.engines import engine_for
    from cptest.errors import PlanError

    try:
        return engine_for(server.engine, server.release).colocated().follower_ranks_ended
    except PlanError:
        return None


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


def load_archive(dir: Path | str) -> Archive:
    """Load `dir`. Raises EvidenceError when plan.json is missing or any evidence line is malformed,
    IntegrityError (an EvidenceError) when the archive holds a link, a FIFO or a folder where a file
    belongs: nothing is read through a link."""
    root = Path(dir)
    require_plain(root)
    layout = Layout(root)
    plan = load_plan(root)
    roles = {server.role: load_role(layout, server) for server in plan.servers()}
    return Archive(dir=root, plan=plan, evidence=Evidence(roles, [r.index for r in plan.workload.requests]))
