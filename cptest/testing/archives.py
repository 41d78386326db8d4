"""Synthetic plans and evidence that satisfy the CP contracts, for tests and the checks benchmark.

Everything here builds *correct* evidence (the layout the pinned SGLang release should produce); a test breaks
one record to show a checker notices. Writers follow the archive layout of `cptest.store.Layout`.
Pure except `write_archive`, which writes the files it is given and nothing else. Not used by any
stage of cptest: this package (`cptest.testing`) serves the tests and the benchmarks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from cptest.contracts import Expectation, LogPatterns
from cptest.contracts.capacity import log_patterns_of
from cptest.contracts.groups import zigzag_blocks
from cptest.engines.sglang.engine import SGLangEngine
from cptest.engines.sglang.releases import PINNED_RELEASE
from cptest.evidence import RankId, Step, dump_record, ranges_from, ranges_merge
from cptest.plan.model import (
    Colocation,
    ModelPin,
    NodeLaunch,
    Pins,
    Plan,
    PlannedRequest,
    ServerPlan,
    WorkloadPlan,
)
from cptest.request_ids import workload_rid
from cptest.store import Layout
from cptest.topology import Degrees, dcp_owner, titled_geometry

PINNED_LOG_PATTERNS: LogPatterns = log_patterns_of("sglang", SGLangEngine(PINNED_RELEASE).facts())
"""The capacity contract's log patterns for the pinned SGLang release, as a plan carries them."""


def rid(index: int) -> str:
    """The request id the workload driver sends for the workload's request `index`."""
    return workload_rid(index)


def server_plan(
    role: str = "main",
    *,
    world: int = 1,
    tp: int | None = None,
    dcp: int = 1,
    attn_cp: int = 1,
    attn_dp: int = 1,
    engine: str = "sglang",
    release: str = PINNED_RELEASE.name,
    nodes: int = 1,
    cp_strategy: str | None = None,
) -> ServerPlan:
    tp = tp or world
    per_node = max(world // nodes, 1)
    degrees = Degrees(tp=tp, pp=max(world // tp, 1), dcp=dcp, attn_cp=attn_cp, attn_dp=attn_dp,
                      cp_strategy=cp_strategy, prefill_cp=cp_strategy is not None and attn_cp > 1,
                      nodes=nodes)
    return ServerPlan(
        role=role,  # type: ignore[arg-type]
        engine=engine,  # type: ignore[arg-type]
        release=release,
        nodes=[
            NodeLaunch(
                node_rank=k,
                gpu_ids=list(range(per_node)),
                env={},
                argv=["python3", "-m", "sglang"],
                port=30000 + k,
            )
            for k in range(nodes)
        ],
        base_url="http://127.0.0.1:30000",
        world_size=world,
        topology=degrees,
        geometry=titled_geometry(degrees),
    )


def colocate(server: ServerPlan, *, gpus: list[int] | None = None, mem_fraction: float = 0.5) -> ServerPlan:
    """`server` with its ranks co-located as the planner does it for SGLang: one local node process
    per world rank on `gpus` (contiguous blocks; all on GPU 0 by default), NCCL over loopback
    sockets, custom all-reduce off, the scenario's `mem_fraction` divided among the ranks of a GPU."""
    from cptest.plan.build import rank_gpus as planned_rank_gpus

    world = server.world_size
    rank_gpus = planned_rank_gpus(world, gpus)
    sharing = max(rank_gpus.count(g) for g in rank_gpus)
    colocation = Colocation(
        rank_gpus=rank_gpus,
        ranks_per_gpu=sharing,
        transport="NCCL over sockets on loopback (no P2P, SHM, IB, custom all-reduce)",
        env={"NCCL_SOCKET_IFNAME": "lo", "NCCL_NET": "Socket", "NCCL_P2P_DISABLE": "1"},
        node_env=[{"NCCL_HOSTID": f"cptest-node{n}"} for n in range(world)],
        flags=["--disable-custom-all-reduce"],
        mem_fraction=round(mem_fraction / sharing, 6),
        mem_fraction_basis=f"the scenario's mem_fraction {mem_fraction:g} / {sharing} rank(s) per GPU",
    )
    nodes = [NodeLaunch(node_rank=k, gpu_ids=[rank_gpus[k]], env={}, argv=["python3", "-m", "sglang"],
                        port=30000 + k) for k in range(world)]
    launched = server.topology.model_copy(update={"nodes": world})
    return server.model_copy(update={"colocation": colocation, "nodes": nodes,
                                     "geometry": titled_geometry(launched)})


def make_plan(
    main: ServerPlan,
    expectations: Iterable[Expectation] = (),
    *,
    baseline: ServerPlan | None = None,
    requests: int = 4,
    prompt_len: int = 16,
    max_new_tokens: int = 4,
    scenario: str = "synthetic",
) -> Plan:
    return Plan(
        scenario=scenario,
        main=main,
        baseline=baseline,
        workload=WorkloadPlan(
            seed=0,
            concurrency=requests,
            rate_per_s=None,
            timeout_s=60.0,
            requests=[
                PlannedRequest(
                    index=i,
                    input_ids=[1] * prompt_len,
                    max_new_tokens=max_new_tokens,
                    sampling={"temperature": 0.0},
                )
                for i in range(requests)
            ],
        ),
        expectations=list(expectations),
        pins=Pins(
            engine=main.engine,
            release=main.release,
            model=ModelPin(kind="local", path="synthetic", architecture="LlamaForCausalLM"),
            cptest_version="0.1.0",
            scenario_sha256="0" * 64,
        ),
    )


def rank_id(world: int, *, dcp: int = 1, cp: int = 1, tp: int | None = None) -> RankId:
    return RankId(
        world=world, tp=world if tp is None else tp, dcp=world % dcp, attn_cp=world % cp if cp > 1 else 0
    )


def dcp_steps(
    world: int,
    dcp: int,
    prompts: dict[str, int],
    decode_steps: int,
    *,
    batch: int | None = None,
    first_step: int = 0,
) -> Iterator[Step]:
    """Correct Step records of one DCP rank (DCP group = world ranks 0..dcp-1, interleave 1): one
    extend step of all prompts, then `decode_steps` decode steps; K/V of position p written by the rank
    with p % dcp == its DCP rank; queries not split."""
    d = world % dcp
    rank = rank_id(world, dcp=dcp)
    n = len(prompts)
    kv = {r: ranges_from(range(d, plen, dcp)) for r, plen in prompts.items()}
    total = sum(prompts.values())
    yield Step(
        rank=rank,
        step=first_step,
        mode="extend",
        batch_size=n,
        rows_in=total,
        attn_rows=total,
        kv_written={r: v for r, v in kv.items() if v},
        extend_lens=list(prompts.values()),
        prefix_lens=[0] * n,
    )
    for k in range(decode_steps):
        written = {}
        for r, plen in prompts.items():
            pos = plen + k
            if dcp_owner(pos, dcp) == d:
                written[r] = [(pos, pos + 1)]
        yield Step(
            rank=rank,
            step=first_step + 1 + k,
            mode="decode",
            batch_size=batch or n,
            rows_in=n,
            attn_rows=n,
            kv_written=written,
        )


def zigzag_steps(
    world: int,
    cp: int,
    prompts: dict[str, int],
    *,
    step: int = 0,
    ffn: str = "local",
    prefix: dict[str, int] | None = None,
) -> Step:
    """The correct extend Step record of CP rank `world % cp` (ATTN_CP group = 0..cp-1) under zigzag."""
    c = world % cp
    seq: dict[str, list[tuple[int, int]]] = {}
    for r, n in prompts.items():
        lo = (prefix or {}).get(r, 0)
        seq[r] = ranges_merge((lo + a, lo + b) for a, b in zigzag_blocks(n, cp, c))
    mine = sum(b - a for v in seq.values() for a, b in v)
    total = sum(prompts.values())
    return Step(
        rank=rank_id(world, cp=cp),
        step=step,
        mode="extend",
        batch_size=len(prompts),
        rows_in=total,
        attn_rows=mine,
        ffn_rows=mine if ffn == "local" else total,
        cp_active=True,
        seq_positions=seq,
        extend_lens=list(prompts.values()),
        prefix_lens=[(prefix or {}).get(r, 0) for r in prompts],
    )


def write_jsonl(path: Path, records: Iterable[BaseModel | str]) -> int:
    """Write records (or pre-dumped lines) one per line; returns the count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(r if isinstance(r, str) else dump_record(r))
            f.write("\n")
            n += 1
    return n


def write_archive(
    dir: Path,
    plan: Plan,
    *,
    ranks: dict[str, dict[int, Iterable[BaseModel | str]]] | None = None,
    runner: dict[str, Iterable[BaseModel]] | None = None,
    logs: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write plan.json, the probe and runner evidence of each role and the logs, where
    `cptest.store.Layout` puts them. `logs` maps a file name (`main-node0.log`) to its text."""
    layout = Layout(dir)
    dir.mkdir(parents=True, exist_ok=True)
    layout.plan.write_text(plan.model_dump_json(indent=2), encoding="utf-8")
    for role, per_rank in (ranks or {}).items():
        for world, recs in per_rank.items():
            write_jsonl(layout.rank_file(role, world), recs)
    for role, recs in (runner or {}).items():
        write_jsonl(layout.runner_file(role), recs)
    for name, text in (logs or {}).items():
        layout.logs_dir.mkdir(exist_ok=True)
        (layout.logs_dir / name).write_text(text, encoding="utf-8")
    for name, value in (extra or {}).items():
        (dir / name).write_text(json.dumps(value) if not isinstance(value, str) else value, encoding="utf-8")
    return dir


def archived_text(path: Path) -> str:
    """The text of an archive's file as cptest reads it: packed (`<name>.xz`) or not."""
    from cptest.store import read_bytes

    return read_bytes(path).decode("utf-8", errors="replace")
