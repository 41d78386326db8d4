"""Where a server's startup time goes, from SGLang's own log lines and cptest's outline log.

The pinned SGLang release stamps each line with its wall time to the second
(`[YYYY-MM-DD HH:MM:SS TP0] ...`, the machine's local time; UTC on the GPU machine), and cptest's
`evidence/cptest.jsonl` stamps the launch and the moment `/health_generate` first answered.
Between them, the phases:

    imports      launch -> the first line SGLang writes (Python imports, argument parsing)
    spawn        -> the first `Init torch distributed begin` (scheduler processes start, import)
    dist_init    -> the last `Init torch distributed ends`
    weights      -> the last `Load weight end`
    kv_pool      -> the last `KV Cache is allocated` / `max_total_num_tokens=`
    graphs       -> the last `Capture cuda graph end` (0 with CUDA graphs disabled)
    http         -> `Uvicorn running`
    warmup       -> `The server is fired up and ready to roll!` (the first forward: JIT kernel builds
                    on a cold cache)
    ready        -> cptest's readiness poll saw 200

A phase whose closing line is missing is None (the next phase then starts where the last known one
ended). One-second resolution: a phase of 0 s took less than a second.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cptest.errors import EvidenceError, Problem, Span
from cptest.report.text import md_inline
from cptest.store import Layout, existing_file, read_bytes, read_lines, require_plain

STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?: [^\]]*)?\] (.*)$")
PHASES: tuple[tuple[str, str, bool], ...] = (
    # name, pattern of the line that ends it, whether the *last* such line ends it (all ranks)
    ("spawn", "Init torch distributed begin", False),
    ("dist_init", "Init torch distributed ends", True),
    ("weights", "Load weight end", True),
    ("kv_pool", "KV Cache is allocated|max_total_num_tokens=", True),
    ("graphs", "Capture cuda graph end", True),
    ("http", "Uvicorn running", False),
    ("warmup", "The server is fired up and ready to roll", False),
)
ORDER = ("imports",) + tuple(p[0] for p in PHASES) + ("ready",)


@dataclass(frozen=True)
class Startup:
    archive: Path
    scenario: str
    role: str
    phases: dict[str, float | None]
    total_s: float | None

    def as_json(self) -> dict[str, object]:
        return {"archive": str(self.archive), "scenario": self.scenario, "role": self.role,
                "phases": self.phases, "total_s": self.total_s}


def _malformed(path: Path, line: int, what: str) -> EvidenceError:
    return EvidenceError(Problem(Span(str(path), line, 1), f"{path.name}:{line}: {what}",
                                 hint="the archive is damaged or was edited (`cptest verify DIR` names "
                                 "what changed)"))


def _parse(stamp: str, path: Path, line: int) -> float:
    try:
        return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise _malformed(path, line, f"the time stamp {stamp!r} is no date") from None


def _wall(value: object, path: Path, line: int) -> float:
    try:
        if not isinstance(value, str):
            raise ValueError
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise _malformed(path, line, f"`wall` {str(value)[:80]!r} is not an ISO time") from None


def _outline_times(layout: Layout, role: str) -> tuple[float | None, float | None]:
    """(launch, ready) wall times of `role` from cptest's outline log. A line that is not a JSON
    object is an EvidenceError naming it (exit 3), except a truncated last line: cptest killed
    mid-write, as `evidence.read_records` forgives it."""
    launch = ready = None
    path = layout.cptest_log
    if not existing_file(path):  # a link, a FIFO or a folder there: IntegrityError naming it
        return None, None
    cut: int | None = None  # a line that is no JSON and may be the last, cut short
    for n, raw in read_lines(path):  # bounded: a line or a file too long is an OverBound naming it
        if cut is not None:
            raise _malformed(path, cut, "not a JSON line")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise EvidenceError(Problem(Span(str(path), n, 1), f"{path.name} is not UTF-8 text "
                                        f"({e.reason} at byte {e.start} of line {n})")) from None
        try:
            r = json.loads(line)
        except ValueError:
            if line.rstrip().endswith("}"):
                raise _malformed(path, n, "not a JSON line") from None
            cut = n
            continue
        if not isinstance(r, dict):
            raise _malformed(path, n, f"a JSON {type(r).__name__}, not an object")
        title, wall = r.get("title", ""), r.get("wall")
        if not wall or not isinstance(title, str):
            continue
        if r.get("kind") == "step_start" and title == f"launching {role} server":
            launch = _wall(wall, path, n)
        if r.get("kind") == "step_end" and title.startswith(f"waiting for {role} server readiness") \
                and r.get("status") == "ok":
            ready = _wall(wall, path, n)
    return launch, ready


def startup(archive: Path, role: str = "main") -> Startup | None:
    """The startup phases of `role`'s node 0 in `archive`; None when it has no such log.

    The archive is read as `check` reads it: one holding a link, a FIFO or a folder where a
    file belongs, or a log whose time stamps or outline lines are malformed, is an EvidenceError
    (exit 3) naming the file, never a traceback. The engine's log is its own bytes: read without a
    decoding error (undecodable bytes replaced)."""
    require_plain(archive)
    layout = Layout(archive)
    log = layout.node_log(role, 0)
    if not existing_file(log):
        return None
    stamped = []
    text = read_bytes(log).decode("utf-8", errors="replace")
    for n, line in enumerate(text.splitlines(), 1):
        m = STAMP.match(line)
        if m:
            stamped.append((_parse(m.group(1), log, n), m.group(2)))
    launch, ready = _outline_times(layout, role)
    phases: dict[str, float | None] = {}
    start = launch
    if stamped and launch is not None:
        phases["imports"] = round(max(0.0, stamped[0][0] - launch), 1)
        start = stamped[0][0]
    else:
        phases["imports"] = None
        start = stamped[0][0] if stamped else None
    for name, pattern, last in PHASES:
        hits = [t for t, msg in stamped if re.search(pattern, msg)]
        if not hits or start is None:
            phases[name] = 0.0 if name == "graphs" and start is not None else None
            continue
        end = max(hits) if last else min(hits)
        phases[name] = round(max(0.0, end - start), 1)
        start = end
    phases["ready"] = round(max(0.0, ready - start), 1) if ready is not None and start is not None else None
    total = round(ready - launch, 1) if ready is not None and launch is not None else None
    scenario = archive.parent.name
    return Startup(archive, scenario, role, phases, total)


def render_table(rows: list[Startup]) -> str:
    head = "| scenario | role | " + " | ".join(ORDER) + " | total (s) |"
    lines = [head, "|" + "---|" * (len(ORDER) + 3)]
    for r in rows:
        cells = ["" if r.phases.get(k) is None else f"{r.phases[k]:g}" for k in ORDER]
        total = "" if r.total_s is None else f"{r.total_s:g}"
        name = f"| {md_inline(r.scenario)} | {md_inline(r.role)} | "  # folder names: any text
        lines.append(name + " | ".join(cells) + f" | {total} |")
    return "\n".join(lines) + "\n"
