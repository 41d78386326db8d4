"""The reference server's command line: built by the plan (`build_argv`), read by the server (`parse`).

Flag names follow SGLang's where the meaning is the same (`--tp-size`, `--dcp-size`,
`--attn-cp-size`, `--enable-prefill-cp`, `--cp-strategy`, `--dp-size` with `--enable-dp-attention`,
`--page-size`, `--max-total-tokens`), so
that a plan reads the same for both engines; the module is `cptest.reference.server`, never sglang.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from cptest.topology import Degrees

MODULE = "cptest.reference.server"
TITLE_PREFIX = "cptest-ref::scheduler"
"""Rank process titles: `cptest-ref::scheduler_TP<r>` (SGLang's scheme, another prefix: never confused)."""
SERVER_TITLE = "cptest-ref::server"
NODE_TITLE = "cptest-ref::node"
"""The main process of node k > 0 of a multi-node server: `cptest-ref::node<k>` (it serves no HTTP)."""
DEFAULT_MAX_TOTAL_TOKENS = 32768
DEFAULT_MAX_RUNNING = 64


@dataclass(frozen=True)
class ReferenceConfig:
    model_path: str
    degrees: Degrees = Degrees(tp=1)
    host: str = "127.0.0.1"
    port: int = 30000
    page_size: int = 1
    max_total_tokens: int | None = None
    context_length: int | None = None
    max_running_requests: int = DEFAULT_MAX_RUNNING
    node_rank: int = 0
    dist_init_addr: str | None = None
    """host:port of node 0's rendezvous (torch.distributed's TCP store); needed when nodes > 1."""


def build_argv(cfg: ReferenceConfig) -> list[str]:
    """argv (no shell) that starts a reference server for `cfg`."""
    d = cfg.degrees
    argv = ["python3", "-m", MODULE, "--model-path", cfg.model_path, "--host", cfg.host,
            "--port", str(cfg.port), "--tp-size", str(d.tp), "--dcp-size", str(d.dcp),
            "--attn-cp-size", str(d.attn_cp), "--cp-strategy", d.cp_strategy or "zigzag",
            "--page-size", str(cfg.page_size), "--max-running-requests", str(cfg.max_running_requests)]
    if d.prefill_cp:
        argv.append("--enable-prefill-cp")
    if d.attn_dp > 1:
        argv += ["--dp-size", str(d.attn_dp), "--enable-dp-attention"]
    if cfg.max_total_tokens is not None:
        argv += ["--max-total-tokens", str(cfg.max_total_tokens)]
    if cfg.context_length is not None:
        argv += ["--context-length", str(cfg.context_length)]
    if d.nodes > 1:  # SGLang's flags and meaning: the launcher may set them from its job (Slurm)
        argv += ["--nnodes", str(d.nodes), "--node-rank", str(cfg.node_rank)]
        if cfg.dist_init_addr is not None:
            argv += ["--dist-init-addr", cfg.dist_init_addr]
    return argv


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python3 -m {MODULE}",
                                description="cptest CPU reference engine (not SGLang)")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--dcp-size", type=int, default=1)
    p.add_argument("--attn-cp-size", type=int, default=1)
    p.add_argument("--enable-prefill-cp", action="store_true")
    p.add_argument("--cp-strategy", choices=["zigzag", "interleave"], default="zigzag")
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=DEFAULT_MAX_RUNNING)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", default=None)
    return p


def parse(argv: list[str]) -> ReferenceConfig:
    """argv (without the program) -> ReferenceConfig; argparse exits with status 2 on bad flags."""
    p = parser()
    a = p.parse_args(argv)
    if a.dp_size > 1 and not a.enable_dp_attention:
        # SGLang's --dp-size alone runs whole data-parallel replicas, which this engine does not.
        p.error("--dp-size > 1 needs --enable-dp-attention (the reference engine runs attention DP only)")
    degrees = Degrees(tp=a.tp_size, dcp=a.dcp_size, attn_cp=a.attn_cp_size, attn_dp=a.dp_size,
                      prefill_cp=a.enable_prefill_cp, cp_strategy=a.cp_strategy, nodes=a.nnodes)
    return ReferenceConfig(model_path=a.model_path, degrees=degrees, host=a.host, port=a.port,
                           page_size=a.page_size, max_total_tokens=a.max_total_tokens,
                           context_length=a.context_length, max_running_requests=a.max_running_requests,
                           node_rank=a.node_rank, dist_init_addr=a.dist_init_addr)
