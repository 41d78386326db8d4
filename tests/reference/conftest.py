"""Fixtures of the reference-engine tests: the tiny checkpoints and a running reference server."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cptest.testing.ports import free_port

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / ".cptest" / "test-models"


def ensure_tiny_models() -> Path:
    """A model store holding the suite's tiny checkpoints, each linked by its name (`TINY/llama-kv1`),
    made on first use by `cptest models make` (about 2 s)."""
    names = ("llama-kv1", "llama-kv2", "llama-kv4", "qwen3-kv2")
    if not all((TINY / n / "model.safetensors").exists() for n in names):
        subprocess.run([sys.executable, "-m", "cptest", "models", "make", *names, "--models", str(TINY)],
                       check=True, capture_output=True, cwd=REPO)
    return TINY


@pytest.fixture(scope="session")
def tiny_models() -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    return ensure_tiny_models()


@contextlib.contextmanager
def reference_server(args: list[str], env: dict[str, str] | None = None,
                     ready_s: float = 60.0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A reference server on a free port (in its own session); killed with its ranks on exit."""
    port = free_port()
    argv = [sys.executable, "-m", "cptest.reference.server", "--port", str(port), *args]
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_s
        while True:
            if proc.poll() is not None:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                raise AssertionError(f"reference server exited with {proc.returncode}:\n{out}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health_generate", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError("reference server not ready")
            time.sleep(0.2)
        yield url, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
