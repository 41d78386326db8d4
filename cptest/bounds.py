"""How much of an archive cptest reads: the largest file of each kind, the longest record of a
JSON-lines file, the most evidence one check holds, and the most entries an archive may have.

An archive may come from anywhere (a published result, a GPU machine, a copy mailed around), so
nothing in it is read whole before its size is known: `cptest.archive_io` checks every figure
here while it streams (a file's size before it is read, a packed file's bytes as they unpack, a
record's length as its line is read), and what is over a bound is refused unread, naming the file
and the line. Checking then stays within a memory figure for any input (`benchmarks/check_memory.py`
measures it); an archive whose evidence is refused this way is judged `unknown`, never pass or fail.

Every figure is the largest such file among the archives of `results/` (measured unpacked; the
figure in each comment) times a margin, rounded up to a power of two: a margin that keeps a run
several times the size of today's qualification runs readable, and small enough that the memory
a check needs stays a figure one can state. A run that outgrows one is judged `unknown` with the
file named; raise the figure here, with its memory cost, rather than anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

KiB = 1 << 10
MiB = 1 << 20


@dataclass(frozen=True)
class Bound:
    """The most cptest reads of one kind of archived file."""

    what: str
    """The kind, for messages: `an evidence file`."""
    bytes: int
    """The file's size as it is read (unpacked, where it is stored packed)."""
    line: int | None = None
    """For a JSON-lines file: the longest record (one line, without its newline)."""
    grows_with_the_workload: bool = False
    """A run of cptest's own makes this kind larger the longer its workload (the evidence, the
    engine's logs), so a file over the bound need not be an edited one."""


EVIDENCE = Bound("an evidence file", 16 * MiB, line=4 * MiB, grows_with_the_workload=True)
"""`evidence/**/*.jsonl`, the probe's, the runner's and cptest's own outline log. The largest:
340 KB (dcp4_llama's main runner.jsonl), 48x under; the longest line: 37 KB (an extend step of
capacity_transitions_dcp2_llama_kv1, its `kv_written` one range per owned row), 110x under, room
for the extend step of a prompt 100x longer. A line is parsed whole, into up to 40x its bytes."""
LOG = Bound("an engine log", 8 * MiB, grows_with_the_workload=True)
"""`logs/*.log`, the engine's stdout and stderr: 53 KB at most (dcp4_llama's main-node0.log), 150x."""
PLAN = Bound("a plan", 16 * MiB)
"""`plan.json`: 154 KB at most (dcp4_llama, a version 2 plan, which stores its prompts' token ids at
5.3 bytes each), 100x. A plan of today names its synthetic prompts by seed (about 18 KiB) and
stores only a dataset's, so about 3 million dataset prompt tokens fit. Planning refuses a scenario
whose plan would be larger (`pipeline.prepare`), so cptest never writes an archive it refuses to
read."""
MANIFEST = Bound("a manifest", 1 * MiB)
"""`manifest.json`, the seal's and each re-analysis's: 5.3 KB at most (30 files), 190x."""
VERDICT = Bound("a verdict", 4 * MiB)
"""`verdict.json`: 19 KB at most (graph_parity_dcp2_llama_kv1), 200x."""
REPORT = Bound("a report", 4 * MiB)
"""`report.md` and `junit.xml`: 18 KB and 13 KB at most, 200x."""
REPORT_HTML = Bound("an HTML report", 32 * MiB)
"""`report.html`, plots inline: 253 KB at most (dcp4_llama), 130x. Hashed, never parsed."""
SCENARIO = Bound("a scenario file", 1 * MiB)
"""`scenario.cps` and its includes: the language's own limit (`lang.tables.MAX_SCENARIO_BYTES`)."""
OTHER = Bound("an archived file", 1 * MiB)
"""Anything else: `logs/cptest-crash.txt` (a traceback), a suite's `suite.json`, a model's
config.json an archived scenario names."""

BY_NAME: dict[str, Bound] = {
    "plan.json": PLAN, "manifest.json": MANIFEST, "verdict.json": VERDICT, "report.md": REPORT,
    "junit.xml": REPORT, "report.html": REPORT_HTML,
}  # fmt: skip
BY_SUFFIX: dict[str, Bound] = {".jsonl": EVIDENCE, ".log": LOG, ".cps": SCENARIO}

PACKED_SUFFIX = ".xz"

ARCHIVE_EVIDENCE_BYTES = 32 * MiB
"""The evidence and logs one check reads of one archive, in all, as charged (below): 3.4 MB at
most (graph_parity_dcp2_llama_kv1: five servers' 2.4 MB of evidence and logs), 10x. What a check
holds grows with it, so this, not the count of files, is what bounds a check's memory."""

# What the budget charges a record: its line's bytes, and no less than these, each the memory a
# shape holds once parsed divided by 20 (`evidence.line_cost`, `evidence.held_cost`), so that what a
# budget admits holds about 20x its figure at most, whatever its shape (`benchmarks/check_memory.py`).
RECORD_BYTES = 64
"""A record: a parsed one holds about 700 bytes, the shortest line is 34 (today's are 66 or more)."""
LIST_BYTES = 6
"""A `[` of a line: a list of one item holds 100 bytes and takes two (`[[[...]]]`)."""
DICT_BYTES = 12
"""A `{` of a line: an object of one item holds 184 bytes and takes seven (`{"a":0}`)."""
ENTRY_BYTES = 16
"""A (request, positions) entry of a step's maps: about 300 bytes (its key, a list, a range); a
compact decode row, a short id and a packed position, is two of them from 13 bytes of its line."""
CHECK_RSS = 1024 * MiB
"""The stated figure: the most resident memory `cptest check` takes, whatever the archive. It adds
up the interpreter and cptest (45 MiB); what one budget of evidence holds once parsed (32 MiB at
about 20x); one line being parsed (4 MiB, up to 40x while pydantic holds its parse); the plan (a
real one holds about twice its bytes; a forged one, up to 26x its bound, is refused by the
scenario compiled again before any evidence is read); and the checkers' own maps.
`benchmarks/check_memory.py` measures it on hostile archives: 651 MiB at most."""
ARCHIVE_ENTRIES = 4096
"""Files and folders of one archive, its re-analyses included: 37 at most (pcp2_zigzag_qwen3_moe_kv1), 110x.
Walking, listing and hashing an archive holds one entry per file."""


def bound_for(name: str) -> Bound:
    """The bound of an archived file by its name (packed or not): `rank0.jsonl.xz` is evidence."""
    name = name.removesuffix(PACKED_SUFFIX)
    if name in BY_NAME:
        return BY_NAME[name]
    dot = name.rfind(".")
    return BY_SUFFIX.get(name[dot:], OTHER) if dot > 0 else OTHER


def size_text(n: int) -> str:
    """`16 MiB`, `2,048 MiB`, `16,777,217 bytes`: a size as messages give it, exact."""
    if n and n % MiB == 0:
        return f"{n // MiB:,} MiB"
    if n and n % KiB == 0:
        return f"{n // KiB:,} KiB"
    return f"{n:,} bytes"
