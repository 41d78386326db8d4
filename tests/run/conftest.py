"""Shared helpers for runner tests: the fake engine as a planned node, free ports, a small Plan."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from cptest.plan.model import (
    FaultPlan,
    ModelPin,
    NodeLaunch,
    Pins,
    Plan,
    PlannedRequest,
    ServerPlan,
    WorkloadPlan,
)
from cptest.testing.ports import free_port

HERE = Path(__file__).parent
FAKE_ENGINE = HERE / "fake_engine.py"
PARENT = HERE / "parent_script.py"


def fake_node(port: int, *args: str, node_rank: int = 0, env: dict[str, str] | None = None) -> NodeLaunch:
    return NodeLaunch(node_rank=node_rank, gpu_ids=[0, 1], env=env or {}, port=port,
                      argv=[sys.executable, str(FAKE_ENGINE), "--port", str(port), *args])


def fake_server(role: str, port: int, *args: str, **kw: Any) -> ServerPlan:
    return ServerPlan(role=role, engine="reference", release="fake", nodes=[fake_node(port, *args)],
                      base_url=f"http://127.0.0.1:{port}", world_size=2, topology={"tp": 2},
                      geometry=[], **kw)


def requests(n: int, max_new: int = 4, prompt: list[int] | None = None) -> list[PlannedRequest]:
    """`n` greedy requests; `prompt` replaces the default `[i + 1, 2, 3, 4]` (the fake engine's
    knobs, `fake_engine.SLOW` and `FAIL`, travel in it)."""
    return [PlannedRequest(index=i, input_ids=prompt or [i + 1, 2, 3, 4], max_new_tokens=max_new,
                           sampling={"temperature": 0.0})
            for i in range(n)]


def make_plan(main: ServerPlan, *, baseline: ServerPlan | None = None, n: int = 6,
              faults: list[FaultPlan] | None = None, concurrency: int = 2, timeout_s: float = 10.0,
              reqs: list[PlannedRequest] | None = None) -> Plan:
    return Plan(scenario="fake_scenario", main=main, baseline=baseline,
                workload=WorkloadPlan(seed=1, concurrency=concurrency, rate_per_s=None, timeout_s=timeout_s,
                                      requests=reqs if reqs is not None else requests(n)),
                faults=faults or [],
                pins=Pins(engine="reference", release="fake",
                          model=ModelPin(kind="local", path="fake", architecture="FakeForCausalLM"),
                          cptest_version="0",
                          scenario_sha256="ab" * 32))


def wait_until(pred: Any, timeout_s: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pids: list[int], created: dict[int, float] | None = None) -> list[int]:
    """The pids that still run (not zombies; same process when create times are given)."""
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if created and abs(p.create_time() - created[pid]) > 0.01:
                continue
            out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.fixture
def port() -> int:
    return free_port()
