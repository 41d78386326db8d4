"""Benchmark of what `cptest check` and `cptest verify` cost in memory, whatever an archive holds.

Copies the largest published archive of results/ into a temporary folder, makes variants of it
that are each hostile in one way, and runs `cptest check` and `cptest verify` on each in a child
process, measuring the child's peak resident memory: its VmHWM, which Linux keeps from the child's
exec on (ru_maxrss would start from this process's own peak, which a fork hands down):

    as published        the archive untouched
    huge evidence       evidence/main/rank0.jsonl a sparse file of --huge MiB (refused by its size)
    huge packed         evidence/main/runner.jsonl.xz unpacking to --huge MiB of small records
                        (concatenated xz streams: refused as it unpacks past its bound)
    huge line           evidence/main/runner.jsonl.xz one line of half --huge MiB (refused at its bound)
    huge plan           plan.json a sparse file of --huge MiB
    plan lists          plan.json just under its bound, of a list of two-letter words (refused once
                        the archived scenario, compiled again, plans otherwise)
    huge manifest       manifest.json a sparse file of --huge MiB
    many entries        one empty file more than an archive may hold
    small records, step rows, steps blocks, process lists, nested lists, objects
                        main's rank files filled with --fill MiB of valid records of one shape (small
                        ones, or lines at the line bound of the shapes that parse largest), each file
                        up to its bound, past the evidence one check reads (`bounds.ARCHIVE_EVIDENCE_BYTES`)

Each line prints the command, its exit code, the peak RSS and the stated figure
(`bounds.CHECK_RSS`), and the first line of what the command said; the benchmark exits 1 when a
figure is over it. Target: every figure under `bounds.CHECK_RSS`.

    python benchmarks/check_memory.py [--huge MIB] [--fill MIB] [--keep DIR]
"""

from __future__ import annotations

import argparse
import array
import base64
import json
import lzma
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from cptest import bounds, store

ROOT = Path(__file__).resolve().parent.parent
MiB = bounds.MiB
RANK = '{"world":0}'


def largest_archive(results: Path) -> Path:
    """The published archive of `results` with the most bytes: the most a real check reads."""
    archives = store.archives_under(results)
    if not archives:
        sys.exit(f"no archive under {results}: this benchmark copies a published one")
    return max(archives, key=lambda a: sum(p.stat().st_size for p in a.rglob("*") if p.is_file()))


def _drop(path: Path) -> None:
    """Remove the archive's file at `path`, stored as it is or packed."""
    path.unlink(missing_ok=True)
    store.packed(path).unlink(missing_ok=True)


def sparse(path: Path, size: int) -> None:
    """`path` a file of `size` zero bytes that takes no disk (a hole)."""
    _drop(path)
    with path.open("wb") as f:
        f.truncate(size)


def packed_repeats(path: Path, chunk: bytes, size: int) -> None:
    """`path` stored packed (`<name>.xz`), unpacking to `chunk` repeated up to `size` bytes: one xz
    stream of the chunk, written once per repeat (a valid file of concatenated streams)."""
    _drop(path)
    stream = lzma.compress(chunk, format=lzma.FORMAT_XZ, preset=1)
    with store.packed(path).open("wb") as f:
        for _ in range(max(size // len(chunk), 1)):
            f.write(stream)


def lines_up_to(size: int, line: Callable[[int], str]) -> Iterator[str]:
    """Lines `line(i)` (newline included) while they total at most `size` bytes."""
    total, i = 0, 0
    while True:
        text = line(i) + "\n"
        if total + len(text) > size:
            return
        total += len(text)
        yield text
        i += 1


def write_lines(path: Path, size: int, line: Callable[[int], str]) -> None:
    """`path` (stored as it is) holding `line` records up to `size` bytes; each line within the bound."""
    _drop(path)
    longest = bounds.EVIDENCE.line or bounds.EVIDENCE.bytes
    with path.open("w") as f:
        for text in lines_up_to(size, line):
            assert len(text) <= longest + 1, f"a line of {len(text)} bytes is over the line bound"
            f.write(text)


def small_record(i: int) -> str:
    """A probe note of the fewest bytes a record can have: the most records per byte."""
    return '{"kind":"probe_note","message":""}'


def _filled(width: int, per: int) -> int:
    """How many items of `per` bytes fit in a line of `width` bytes."""
    return max((width - 200) // per, 1)


def step_rows(width: int) -> Callable[[int], str]:
    """Decode steps in their compact form, one row per request, as many rows as a line holds: each
    row becomes a request's entry in two maps of position ranges."""

    def line(i: int) -> str:
        n = _filled(width, 15)  # a row: its id (up to 5 hex digits, quoted) and 4 bytes of base64
        rids = ",".join(f'"{k:x}"' for k in range(n))
        pos = base64.b64encode(array.array("i", range(n)).tobytes()).decode()
        return (f'{{"kind":"step","rank":{RANK},"step":{i},"mode":"decode","batch_size":{n},"rows_in":{n},'
                f'"rows":{{"rids":[{rids}],"pos":"{pos}","kv":"all"}}}}')

    return line


def steps_blocks(width: int) -> Callable[[int], str]:
    """`steps` lines of two steps over as many requests as a line holds: each expands into two
    Step records, every row in two maps."""

    def line(i: int) -> str:
        n = _filled(width, 20)  # a row: its id and 2 x 4 bytes of base64
        rids = ",".join(f'"{k:x}"' for k in range(n))
        pos = base64.b64encode(array.array("i", range(2 * n)).tobytes()).decode()
        two = "0,0"
        return (f'{{"kind":"steps","t":[{two}],"rank":{RANK},"rids":[{rids}],"step":[{2 * i},{2 * i + 1}],'
                f'"rows_in":[{n},{n}],"attn_rows":[{two}],"ffn_rows":[{two}],"logits_rows":[{two}],'
                f'"pos":"{pos}","kv":"all"}}')

    return line


def process_lists(width: int) -> Callable[[int], str]:
    """Process samples of as many empty process entries as a line holds: one dict each."""

    def line(i: int) -> str:
        return '{"kind":"processes","phase":"x","procs":[' + ",".join(["{}"] * _filled(width, 3)) + "]}"

    return line


def nested_lists(width: int) -> Callable[[int], str]:
    """Server infos of lists nested 100 deep, as many as a line holds: one list per two bytes."""

    def line(i: int) -> str:
        nest = "[" * 100 + "]" * 100
        return '{"kind":"server_info","info":{"x":[' + ",".join([nest] * _filled(width, 201)) + "]}}"

    return line


def objects(width: int) -> Callable[[int], str]:
    """Server infos of one-item objects, as many as a line holds: one dict per 8 bytes."""

    def line(i: int) -> str:
        return '{"kind":"server_info","info":{"x":[' + ",".join(['{"a":0}'] * _filled(width, 8)) + "]}}"

    return line


def fill_ranks(archive: Path, size: int, line: Callable[[int], str]) -> None:
    """main's rank files filled with `size` bytes of `line` records in all, each up to its bound."""
    ranks = store.Layout(archive).rank_files("main")
    left = size
    for world in sorted(ranks):
        part = min(left, bounds.EVIDENCE.bytes)
        write_lines(ranks[world], part, line)
        left -= part
        if left <= 0:
            break


def plan_lists(archive: Path, size: int) -> None:
    """plan.json just under its bound, main node 0's argv a list of two-letter words: what the
    largest plan cptest reads holds before the scenario compiled again shows it is not the plan."""
    path = store.Layout(archive).plan
    plan = json.loads(path.read_text())
    n = (size - path.stat().st_size) // 5
    plan["main"]["nodes"][0]["argv"] += ["ab"] * n
    path.write_text(json.dumps(plan, separators=(",", ":")))


def variants(big: int, fill: int) -> dict[str, Callable[[Path], None]]:
    """Name -> how to make the variant from a copy of the archive: oversized files of `big` bytes,
    rank files of `fill` bytes of records."""
    width = bounds.EVIDENCE.line or MiB
    small_lines = "".join(lines_up_to(MiB, small_record)).encode()

    def main(archive: Path) -> store.Layout:
        return store.Layout(archive)

    return {
        "as published": lambda a: None,
        "huge evidence": lambda a: sparse(main(a).rank_file("main", 0), big),
        "huge packed": lambda a: packed_repeats(main(a).runner_file("main"), small_lines, big),
        "huge line": lambda a: packed_repeats(main(a).runner_file("main"), b"x" * (16 * MiB), big // 2),
        "huge plan": lambda a: sparse(main(a).plan, big),
        "plan lists": lambda a: plan_lists(a, bounds.PLAN.bytes - 64 * bounds.KiB),
        "huge manifest": lambda a: sparse(main(a).manifest, big),
        "many entries": lambda a: [(a / "logs" / f"extra{k}").touch() for k in range(bounds.ARCHIVE_ENTRIES)],
        "small records": lambda a: fill_ranks(a, fill, small_record),
        "step rows": lambda a: fill_ranks(a, fill, step_rows(width)),
        "steps blocks": lambda a: fill_ranks(a, fill, steps_blocks(width)),
        "process lists": lambda a: fill_ranks(a, fill, process_lists(width)),
        "nested lists": lambda a: fill_ranks(a, fill, nested_lists(width)),
        "objects": lambda a: fill_ranks(a, fill, objects(width)),
    }


MEASURED = """
import atexit, sys

def peak():
    with open("/proc/self/status") as f:
        kib = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    sys.stderr.write(f"\\nVmHWM {kib}\\n")

atexit.register(peak)
from cptest.cli import main
sys.argv[0] = "cptest"
main()
"""
"""`python -m cptest`, saying at exit its peak resident memory since it began (VmHWM, in KiB)."""


def peak_rss(*argv: str | Path) -> tuple[int, int, str]:
    """Run `cptest ARGV` in a child and return its exit code, its peak RSS in bytes and why it said
    what it said: the evidence verdict's reason, else the first problem it named."""
    done = subprocess.run([sys.executable, "-c", MEASURED, *map(str, argv)], cwd=ROOT, capture_output=True,
                          text=True, errors="replace")
    lines = (done.stdout + done.stderr).splitlines()
    kib = next(int(x.split()[1]) for x in reversed(lines) if x.startswith("VmHWM "))
    said = [x.split(REFUSED, 1)[-1] for x in lines if REFUSED in x]
    said += [WHERE.sub("", x) for x in lines if x.startswith("/")]
    said.sort(key=lambda x: not any(w in x for w in ("larger than", "longer than", "more than", "differs")))
    return done.returncode, kib * 1024, (said[0] if said else "")


REFUSED = "evidence larger than cptest reads was not read: "
"""What the verdict of an archive whose evidence was refused says before the files it names."""
WHERE = re.compile(r"^.*?:\d+:\d+: ")
"""What a message says before the problem itself: the file and line it is about."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--huge", type=int, default=2048, help="MiB of the oversized files (default 2048)")
    ap.add_argument("--fill", type=float, default=bounds.ARCHIVE_EVIDENCE_BYTES / MiB + 1,
                    help="MiB of records the large-record variants write (default: past the evidence budget)")
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--keep", type=Path, default=None, help="make the variants here and keep them")
    args = ap.parse_args()
    source = largest_archive(args.results)
    root = args.keep or Path(tempfile.mkdtemp(prefix="cptest-check-memory-"))
    stated = bounds.CHECK_RSS
    print(f"archive {source.relative_to(ROOT) if source.is_relative_to(ROOT) else source}; stated figure "
          f"{stated // MiB} MiB (bounds.CHECK_RSS)")
    over = []
    try:
        for name, make in variants(args.huge * MiB, int(args.fill * MiB)).items():
            copy = root / name.replace(" ", "-") / source.name
            shutil.copytree(source, copy)
            make(copy)
            for command in ("check", "verify"):
                code, rss, said = peak_rss(command, copy)
                ok = rss <= stated
                if not ok:
                    over.append(f"{name}: {command}")
                print(f"{name:14} cptest {command:6} exit {code}  peak RSS {rss / MiB:6.0f} MiB "
                      f"{'<=' if ok else '> '} {stated // MiB} MiB  {said[:110]}")
            if args.keep is None:
                shutil.rmtree(copy.parent)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print("every figure within the stated bound" if not over else f"OVER the stated bound: {', '.join(over)}")
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
