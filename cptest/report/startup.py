"""Where a server's startup time goes, from SGLang's own log lines and cptest's outline log.

SGLang 0.5.17 stamps each line with its wall time to the second (`[2026-11-30 17:00:13 TP0] ...`, the
machine's local time; UTC on the GPU machine), and cptest's `evidence/cptest.jsonl` stamps the
launch and the moment `/health_generate` first answered. Between them, the phases:

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

from cptest.store import Layout

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


def _parse(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def _wall(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _outline_times(layout: Layout, role: str) -> tuple[float | None, float | None]:
    """(launch, ready) wall times of `role` from cptest's outline log."""
    launch = ready = None
    try:
        lines = layout.cptest_log.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None, None
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        title, wall = r.get("title", ""), r.get("wall")
        if not wall:
            continue
        if r.get("kind") == "step_start" and title == f"launching {role} server":
            launch = _wall(wall)
        if r.get("kind") == "step_end" and title.startswith(f"waiting for {role} server readiness") \
                and r.get("status") == "ok":
            ready = _wall(wall)
    return launch, ready


def startup(archive: Path, role: str = "main") -> Startup | None:
    """The startup phases of `role`'s node 0 in `archive`; None when it has no such log."""
    layout = Layout(archive)
    log = layout.node_log(role, 0)
    if not log.is_file():
        return None
    stamped = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        m = STAMP.match(line)
        if m:
            stamped.append((_parse(m.group(1)), m.group(2)))
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
        lines.append(f"| {r.scenario} | {r.role} | " + " | ".join(cells) + f" | {total} |")
    return "\n".join(lines) + "\n"
