"""Reading scenario files: a regular file of bounded size, never a device, FIFO or kernel file.

`read_path` is the reader every stage uses for `.cps` text (the language's `extends` chain, the
pipeline, the archive checks), so that they all refuse the same inputs with the same reasons.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable

from cptest.lang import tables as T

Reader = Callable[[str], str]
"""Reads a file's text by path; raises OSError (or UnicodeDecodeError) when it cannot."""


_PSEUDO = ("/proc/", "/sys/", "/dev/")


def read_path(path: str) -> str:
    """A scenario file's text: a regular file of at most `MAX_SCENARIO_BYTES` (never `/dev/zero`, a
    FIFO or a huge file: reading one would never end or exhaust memory). Raises OSError naming why."""
    if "\0" in path:  # open() would raise ValueError
        raise OSError(errno.EINVAL, "a path cannot contain a NUL character")
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer before fstat can refuse it.
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if os.path.realpath(path).startswith(_PSEUDO):
            # procfs and sysfs files stat as regular files but are the kernel's live state
            # (/proc/self/environ is the process environment): never a scenario.
            raise OSError(errno.EINVAL, "a kernel pseudo-file, not a regular file")
        data = fh.read(T.MAX_SCENARIO_BYTES + 1)
    if len(data) > T.MAX_SCENARIO_BYTES:
        raise OSError(errno.EFBIG, f"larger than {T.MAX_SCENARIO_BYTES:,} bytes")
    return data.decode("utf-8")


def os_reason(err: BaseException) -> str:
    """Why a file could not be read, in a few words for a problem's message."""
    if isinstance(err, FileNotFoundError):
        return "no such file"
    if isinstance(err, IsADirectoryError):
        return "it is a directory"
    if isinstance(err, UnicodeDecodeError):
        return "not UTF-8 text"
    return getattr(err, "strerror", None) or type(err).__name__
