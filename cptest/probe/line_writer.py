"""The rank file's writer process: it makes the lines of finished copy batches and writes them.

Making a batch's `steps` lines and pool-sample lines is most of finishing it (`CopyBatch.run`), and
the probe finishes batches on the engine's thread: a writer thread would take the GIL from the
engine instead (docs/architecture.md, "Evidence"). A process of its own takes nothing from it.
The probe sends each batch's items as they are (`records.item_line`: lines made already, `steps`
fields with their arrays, pool samples) in one pickled message down a pipe, and every other line
it writes down the same pipe, so the file's lines keep their order. The process makes the lines
with the same functions the probe would use and appends them to the rank file: the file is byte
for byte what the probe writes itself (`Probe.write_items`, which it does when no writer process
runs).

The process stays in the engine's process group, so that a kill of the group ends it with the
engine: nothing reaches the rank file after the runner has stopped the server and sealed its
archive. It ignores SIGINT and SIGTERM, which the engine answers by shutting down and flushing the
probe (`Probe.flush` waits until the file holds everything): it then writes what it has received
and ends at the pipe's end, or within a second of finding its parent gone. A message is an 8-byte
little-endian length and a pickle: a list of items, or None, which asks for one byte back once
everything before it is in the file (`LineWriter.sync`).

    python -m cptest.probe.line_writer RANK_FILE T0 RANK_JSON
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HEADER = struct.Struct("<Q")
PIPE_BYTES = 1 << 20
"""The pipe's buffer, asked of the kernel (Linux allows a process up to /proc/sys/fs/pipe-max-size,
1 MiB by default): several batches' messages, so that the engine's thread does not wait on a writer
that is a batch behind."""
READY = b"r"
SYNCED = b"s"
START_S = 10.0
"""How long the probe waits for the process to say it is ready (its imports) before it writes
the file itself."""


class LineWriter:
    """The probe's end of a writer process: `send` a batch's items, `sync`, `close`."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        assert proc.stdin is not None and proc.stdout is not None
        self._out = proc.stdin.fileno()
        self._back = proc.stdout.fileno()

    @classmethod
    def start(cls, path: Path, t0: float, rank_json: str) -> tuple[LineWriter | None, str | None]:
        """A writer process appending to `path`, ready; or None and why it could not start (the
        probe then writes the file itself)."""
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cptest.probe.line_writer", str(path), repr(t0), rank_json],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                close_fds=True)
        except OSError as e:
            return None, f"{type(e).__name__}: {e}"
        writer = cls(proc)
        with contextlib.suppress(OSError):  # a smaller buffer only makes the engine wait sooner
            fcntl.fcntl(writer._out, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        if writer._reply(START_S) != READY:
            writer.kill()
            return None, f"it did not start within {START_S:.0f} s (exit status {proc.poll()})"
        return writer, None

    def send(self, items: list[Any]) -> bool:
        """Hand the process `items` to write after everything sent before; False when it is gone
        (what it had not written is lost)."""
        return self._message(pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL))

    def sync(self, timeout: float) -> bool:
        """Whether everything sent so far is in the file within `timeout` seconds."""
        return self._message(pickle.dumps(None)) and self._reply(timeout) == SYNCED

    def close(self, timeout: float) -> bool:
        """End the pipe and wait for the process to write what it has and exit; False when it
        did not within `timeout` (it is then killed)."""
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return False
        finally:
            with contextlib.suppress(OSError):
                assert self.proc.stdout is not None
                self.proc.stdout.close()
        return self.proc.returncode == 0

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5.0)

    def _message(self, payload: bytes) -> bool:
        header = HEADER.pack(len(payload))
        try:
            done = os.writev(self._out, (header, payload))
            data = memoryview(header + payload)[done:] if done < len(header) + len(payload) else b""
            while data:
                data = data[os.write(self._out, data):]
        except OSError:  # BrokenPipeError: the process is gone
            return False
        return True

    def _reply(self, timeout: float) -> bytes:
        """One byte from the process within `timeout`, or b"" (none, or it ended)."""
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            ready, _, _ = select.select([self._back], [], [], left)
            if ready:
                try:
                    return os.read(self._back, 1)
                except OSError:
                    return b""
        return b""


POLL_S = 0.01
"""How often the process looks for messages. It never waits on the pipe itself: a write that has
to wake a reader waiting on it cost the engine's thread 50-200 us (a wake-up, then the two sides
taking turns page by page), where a write into a pipe nobody waits on is a copy."""


def _read_exactly(fd: int, n: int, parent: int) -> bytes | None:
    """`n` bytes from the non-blocking `fd`, looking every POLL_S; None at the pipe's end (or once
    the parent is gone and nothing comes: a process forked from the engine may hold the pipe open
    after it)."""
    chunks: list[bytes] = []
    idle = 0.0
    while n:
        try:
            chunk = os.read(fd, min(n, 1 << 20))
        except BlockingIOError:
            time.sleep(POLL_S)
            idle += POLL_S
            if idle >= 1.0:
                idle = 0.0
                if os.getppid() != parent:
                    return None
            continue
        if not chunk:
            return None
        idle = 0.0
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def serve(path: Path, t0: float, rank_json: str, inp: int, out: int, parent: int) -> None:
    """Write the lines of every message from `inp` to `path` until the pipe ends."""
    from cptest.evidence import ProbeNote, RankId, dump_record
    from cptest.probe.records import item_line

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.set_blocking(inp, False)
    os.write(out, READY)
    errors = 0
    while (header := _read_exactly(inp, HEADER.size, parent)) is not None:
        (size,) = HEADER.unpack(header)
        payload = _read_exactly(inp, size, parent)
        if payload is None:
            break
        items = pickle.loads(payload)
        if items is None:
            os.write(out, SYNCED)
            continue
        chunks: list[bytes] = []
        for item in items:
            if item.__class__ is bytes:  # lines the probe made and encoded
                chunks.append(item)
                continue
            try:
                chunks.append((item_line(item, t0) + "\n").encode())
            except Exception as e:  # the line is lost; the file says so, as the probe's own errors do
                errors += 1
                if errors <= 5:
                    note = ProbeNote(t=round(time.monotonic() - t0, 6), rank=RankId.model_validate_json(
                        rank_json), level="error", message=f"writer: {type(e).__name__}: {e}"[:2000])
                    chunks.append((dump_record(note) + "\n").encode())
        os.write(fd, b"".join(chunks))
    os.close(fd)


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):  # the engine shuts down and ends the pipe (see the module)
        signal.signal(sig, signal.SIG_IGN)
    path, t0, rank_json = Path(argv[0]), float(argv[1]), argv[2]
    serve(path, t0, rank_json, sys.stdin.fileno(), sys.stdout.fileno(), os.getppid())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
