"""The probe the hook tests drive (a module that needs another kind defines its own `probe`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cptest.probe import runtime
from cptest.probe.runtime import Probe


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Probe]:
    """A probe writing into `tmp_path`, installed as the process's probe while the test runs, its
    graph counts flushed at every chance. It runs on the real clock, so its time bounds are far off:
    a slow test machine neither closes a copy batch early nor looks like a stalled engine (the tests
    of those bounds move a clock of their own)."""
    monkeypatch.setattr(runtime, "IDLE_S", 60.0)
    p = Probe(tmp_path, graph_flush_s=0.0, copy_within_s=60.0)
    runtime.set_probe(p)
    yield p
    runtime.set_probe(None)
    p.close()
