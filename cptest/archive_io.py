"""The bytes of an archive's files: regular files only, never through a link, never blocking on a
FIFO, packed or not, and never more of them than `cptest.bounds` allows.

`cptest.store` knows where an archive's files are and re-exports what is here; this module knows
how one is opened. Every read streams: a plain file's size is known before it is read, a packed
file (`<name>.xz`) is unpacked a block at a time and stops one byte past its bound, a JSON-lines
file is read one bounded line at a time (`read_lines`), and a hash is taken a MiB at a time. What
is over a bound is an `OverBound` naming the file (and the line), never a file read whole first.

Depends on nothing of cptest above `errors` and `bounds`.
"""

from __future__ import annotations

import hashlib
import itertools
import lzma
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from cptest import bounds
from cptest.bounds import Bound, bound_for, size_text
from cptest.errors import EvidenceError, Problem, Span

PACKED = bounds.PACKED_SUFFIX
"""The suffix of an archive file stored xz-compressed (`pack_large_files`)."""
PACK_FROM_BYTES = 64 << 10
"""Evidence files and engine logs this large or larger are stored packed: they are most of an
archive's bytes and shrink 6 to 20 times, and every GPU call sends the published archives along."""
CHUNK = 1 << 20
"""What one read takes of a file being hashed or packed."""


class IntegrityError(EvidenceError):
    """An archive is not what cptest wrote: a link, a FIFO or a folder where a file belongs, a
    malformed manifest, or a plan that its scenario does not compile to. Exit code 3."""


class OverBound(IntegrityError):
    """A file, one record of it, or an archive's evidence in all is larger than `cptest.bounds`
    allows: refused, and what was read of it dropped. Exit code 3; a check that meets one in the
    evidence judges every expectation unknown (`checks.check_loaded`).

    Its message is `<name> <detail>` about a whole file (`rank0.jsonl is 2,048 MiB, larger than ...`)
    and `<name>:<line>: <detail>` about one of its lines; `named` says it with the path the archive
    knows the file by, which is what a verdict may hold (never a directory of this machine)."""

    def __init__(self, path: Path, detail: str, *, line: int | None = None, name: str | None = None,
                 hint: str | None = None):
        self.path, self.detail, self.line = path, detail, line
        self.name = name or path.name
        where = f"{self.name}:{line}: " if line else f"{self.name} "
        super().__init__(Problem(Span(str(path), line or 1, 1), where + detail, hint=hint))

    def named(self, root: Path) -> str:
        """The refusal with the file named by its path under `root`: `evidence/main/rank0.jsonl:2: ...`."""
        file = self.path.with_name(self.name)
        rel = file.relative_to(root).as_posix() if file.is_relative_to(root) else self.name
        return f"{rel}:{self.line}: {self.detail}" if self.line else f"{rel} {self.detail}"


def _hint(bound: Bound) -> str:
    why = (f"cptest reads at most {size_text(bound.bytes)} of {bound.what} (cptest/bounds.py), so that "
           "checking any archive stays within a stated memory figure")
    if bound.grows_with_the_workload:
        return (f"{why}; a longer workload makes a larger one: shorten the scenario's workload, or raise "
                "the figure there with its memory cost (or was the archive edited: `cptest verify DIR`?)")
    return (f"{why}; no run of today's scenarios comes near it: was the archive edited or made elsewhere "
            "(`cptest verify DIR`)?")


def kind_of(mode: int) -> str:
    """What a file of `mode` is, for messages: `a symbolic link`, `a FIFO`..."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def entries_problem(root: Path) -> Problem | None:
    """A problem when `root` holds more than `bounds.ARCHIVE_ENTRIES` files and folders, counted
    one directory entry at a time (never a whole listing of a folder of millions), without
    following links; None otherwise."""
    count = 0
    folders = [root]
    while folders:
        try:
            with os.scandir(folders.pop()) as it:
                for entry in it:
                    count += 1
                    if count > bounds.ARCHIVE_ENTRIES:
                        return Problem(Span(str(root), 1, 1), f"the archive holds more than "
                                       f"{bounds.ARCHIVE_ENTRIES:,} files and folders; not read",
                                       hint="an archive of a run holds a few dozen (cptest/bounds.py)")
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(Path(entry.path))
        except OSError:
            continue  # named by `foreign_entries`, which reads each entry's kind
    return None


def foreign_entries(root: Path) -> list[Problem]:
    """Everything under `root` that cptest never writes into an archive: a symbolic link (to a file
    or a folder, inside or outside the archive), a FIFO, a socket, a device. Walks without following
    links; `root` itself may be a link to an archive. An archive with any of these is refused whole:
    reading through a link could judge or hash another file, opening a FIFO blocks for ever. An
    archive of more entries than `bounds.ARCHIVE_ENTRIES` is that one problem, and not walked."""
    too_many = entries_problem(root)
    if too_many is not None:
        return [too_many]
    problems = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            try:
                mode = path.lstat().st_mode
            except OSError as e:
                problems.append(Problem(Span(str(path), 1, 1), f"cannot read {name}: {e.strerror}"))
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                rel = path.relative_to(root).as_posix()
                problems.append(Problem(Span(str(path), 1, 1), f"{rel} is {kind_of(mode)}, not a regular "
                                        "file", hint="an archive holds only the files cptest wrote; restore "
                                        "it from a copy you trust"))
    return problems


def require_plain(root: Path) -> None:
    """Raise IntegrityError (exit 3) naming every link, FIFO or other special file under `root`,
    when `root` is not a directory, and when it holds more entries than an archive may."""
    if not root.is_dir():
        raise IntegrityError(Problem(Span(str(root), 1, 1), "not an archive directory",
                                     hint="give a folder results/<scenario>/<time>-<hash>/"))
    problems = foreign_entries(root)
    if problems:
        raise IntegrityError(problems)


def integrity_error(path: Path, message: str, hint: str | None = None) -> IntegrityError:
    """An IntegrityError about the file `path`."""
    return IntegrityError(Problem(Span(str(path), 1, 1), message, hint=hint))


def regular_file(path: Path) -> bool:
    """Whether `path` is a regular file: False when nothing is there; IntegrityError (exit 3) when
    something else is (a folder, a link, a FIFO)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    except OSError as e:
        raise integrity_error(path, f"cannot read {path.name}: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise integrity_error(path, f"{path.name} is {kind_of(mode)}, not a regular file",
                              hint="an archive holds only the files cptest wrote; restore it from a copy "
                              "you trust")
    return True


def packed(path: Path) -> Path:
    """Where `path` lies when it is stored packed (`<name>.xz`)."""
    return path.with_name(path.name + PACKED)


def existing_file(path: Path) -> bool:
    """Whether the archive holds `path` as a regular file, as it is or packed: False when neither is
    there; IntegrityError (exit 3) when something else is (a folder, a link, a FIFO) or both are."""
    plain = regular_file(path)
    twin = not path.name.endswith(PACKED) and regular_file(packed(path))
    if plain and twin:
        raise integrity_error(path, f"{path.name} is stored both as it is and packed ({packed(path).name})",
                              hint="an archive holds each file once; restore it from a copy you trust")
    return plain or twin


@contextmanager
def _opened(path: Path) -> Iterator[BinaryIO]:
    """`path` open for reading, never through a link and never blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise integrity_error(path, f"cannot read {path.name}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        yield f


@contextmanager
def _stream(path: Path, bound: Bound) -> Iterator[BinaryIO]:
    """The bytes of an archive's file as cptest wrote them: `path` itself, refused when it is larger
    than `bound`, or its packed twin unpacked as it is read (the reader counts what comes out)."""
    if not existing_file(path):
        raise integrity_error(path, f"{path.name} is missing",
                              hint="is this an archive directory (results/<scenario>/<time>-<hash>/)?")
    if regular_file(path):
        with _opened(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > bound.bytes:
                raise OverBound(path, f"is {size_text(size)}, larger than {bound.what} may be "
                                f"({size_text(bound.bytes)}); not read", hint=_hint(bound))
            yield f
        return
    with _opened(packed(path)) as raw, lzma.LZMAFile(raw, "rb", format=lzma.FORMAT_XZ) as f:
        yield f  # type: ignore[misc]


def _unpack_error(path: Path, e: Exception) -> IntegrityError:
    twin = packed(path)
    what = "is cut short" if isinstance(e, EOFError) else f"is not an xz file cptest wrote ({e})"
    return integrity_error(twin, f"{twin.name} {what}; not read")


def _unpacked_over(path: Path, bound: Bound) -> OverBound:
    stored = packed(path) if not path.exists() else path
    verb = "unpacks to" if stored != path else "is"
    return OverBound(path, f"{verb} more than {bound.what} may be ({size_text(bound.bytes)}); not read",
                     name=stored.name, hint=_hint(bound))


def read_bytes(path: Path) -> bytes:
    """The bytes of an archive's file, unpacked where it is stored packed, never through a link and
    never blocking on a FIFO: anything but a regular file is an IntegrityError (exit 3) naming it,
    as is a packed file that is not xz; one larger than its `bounds.bound_for` is an OverBound,
    refused before it is read (a packed one as soon as it unpacks past it). For the engine's logs,
    whose bytes are the engine's and need not be UTF-8; cptest's own files are read with `read_file`."""
    bound = bound_for(path.name)
    with _stream(path, bound) as f:
        try:
            data = f.read(bound.bytes + 1)
        except (lzma.LZMAError, EOFError) as e:
            raise _unpack_error(path, e) from None
    if len(data) > bound.bytes:
        raise _unpacked_over(path, bound)
    return data


def read_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, the line without its newline) of an archive's JSON-lines file, one line
    in memory at a time; a line longer than its bound's `line` is an OverBound naming the file and
    the line, as is a file whose lines come to more than its bound's `bytes`. Otherwise as
    `read_bytes`."""
    bound = bound_for(path.name)
    longest = bound.line or bound.bytes
    total = 0
    with _stream(path, bound) as f:
        for number in itertools.count(1):
            try:
                line = f.readline(longest + 2)  # the longest line and its newline, and one byte more
            except (lzma.LZMAError, EOFError) as e:
                raise _unpack_error(path, e) from None
            if not line:
                return
            total += len(line)
            if total > bound.bytes:
                raise _unpacked_over(path, bound)
            body = line[:-1] if line.endswith(b"\n") else line
            if len(body) > longest:
                raise OverBound(path, f"a record longer than a line of {bound.what} may be "
                                f"({size_text(longest)}); not read", line=number, hint=_hint(bound))
            yield number, body


@dataclass
class Budget:
    """What one check may still read of one archive's evidence and logs (`bounds.ARCHIVE_EVIDENCE_BYTES`):
    each reader charges what it reads before it parses it; past the budget, OverBound."""

    left: int = field(default_factory=lambda: bounds.ARCHIVE_EVIDENCE_BYTES)

    def charge(self, path: Path, size: int, line: int | None = None) -> None:
        """Take `size` bytes for what line `line` of `path` (the whole file: None) holds."""
        self.left -= size
        if self.left < 0:
            total = size_text(bounds.ARCHIVE_EVIDENCE_BYTES)
            detail = (f"the archive's evidence and logs come to more than one check reads ({total} in all); "
                      "not read") if line else (f"brings the archive's evidence and logs to more than one "
                                                f"check reads ({total} in all); not read")
            raise OverBound(path, detail, line=line, hint="cptest/bounds.py says why; a run this large is "
                            "judged unknown")


def size_problems(root: Path, names: Iterable[str]) -> list[Problem]:
    """A problem for each file of `names` (POSIX paths under `root`) stored larger than cptest reads
    of its kind (`bounds.bound_for`): such an archive cannot be checked. By the sizes stored, so
    nothing is read (a packed file is held to the bound of the file it unpacks to)."""
    out = []
    for name in names:
        path = root / name
        bound = bound_for(path.name)
        size = path.lstat().st_size
        if size > bound.bytes:
            out.append(Problem(Span(str(path), 1, 1), f"{name} is {size_text(size)}, larger than "
                               f"{bound.what} may be ({size_text(bound.bytes)})", hint=_hint(bound)))
    return out


def packable(rel: str) -> bool:
    """Whether the archive file at POSIX path `rel` is of the kinds `pack_large_files` packs: the
    evidence (`evidence/**/*.jsonl`) and the engine's logs (`logs/*.log`)."""
    parts = rel.split("/")
    return ((parts[0] == "evidence" and rel.endswith(".jsonl"))
            or (parts[0] == "logs" and len(parts) == 2 and rel.endswith(".log")))


def pack_large_files(root: Path) -> list[str]:
    """Store every `packable` file of `PACK_FROM_BYTES` or more as `<name>.xz` (written beside it,
    a MiB at a time, then the original removed), and return their paths. Never through a link: an
    archive holding one is refused first by `finish`."""
    done = []
    for dirpath, _, filenames in os.walk(root, followlinks=False):
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if not packable(rel) or not regular_file(path) or path.stat().st_size < PACK_FROM_BYTES:
                continue
            tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            try:
                with os.fdopen(fd, "wb") as out, _opened(path) as f:
                    packer = lzma.LZMACompressor(format=lzma.FORMAT_XZ, preset=6)
                    while chunk := f.read(CHUNK):
                        out.write(packer.compress(chunk))
                    out.write(packer.flush())
                os.replace(tmp, packed(path))
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            path.unlink()
            done.append(rel)
    return done


def read_file(path: Path) -> str:
    """The text of an archive's file, never through a link and never blocking on a FIFO: anything
    but a regular UTF-8 file within its bound is an IntegrityError (exit 3) naming it."""
    data = read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise integrity_error(path, f"{path.name} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def write_file(root: Path, path: Path, text: str) -> None:
    """Write `text` to `path` inside the archive `root` atomically (a temporary file beside it, then
    a rename), never through a link: a link in the way is replaced, not followed, and a folder on
    the way that is a link is an IntegrityError."""
    rel = path.relative_to(root)
    here = root
    for part in rel.parts[:-1]:
        here = here / part
        if here.is_symlink() or (here.exists() and not here.is_dir()):
            raise integrity_error(here, f"{here.relative_to(root).as_posix()} is not a folder of the archive "
                                  "(a link?); nothing written")
    if path.exists() and path.is_dir() and not path.is_symlink():
        raise integrity_error(path, f"{rel.as_posix()} is a directory, not a file; nothing written")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sha256_file(path: Path) -> str:
    """The sha256 of the file at `path`, read a MiB at a time."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()
