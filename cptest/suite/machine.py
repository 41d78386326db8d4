"""What the machine offers a suite: GPUs (with their memory), CPUs and a range of ports."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from cptest.errors import RunError

PORT_BASE = 30000
PORT_BLOCK = 100
"""The ports one server may hold, from its HTTP port up: a co-located server's node k listens on
port + k (at most `MAX_COLOCATED_RANKS` of them) and node 0 hosts the rendezvous at port +
`RENDEZVOUS_PORT_OFFSET` (50), both inside the block. A scenario's baseline, control and eager twin
share the baseline port (they run one after the other), so a scenario holds two blocks."""
SLOT_STRIDE = 2 * PORT_BLOCK
"""Slot k's main port is PORT_BASE + SLOT_STRIDE * k, its baseline port main + PORT_BLOCK: slot 0 is
a lone run's 30000/30100, and no port of one slot's servers is another slot's. The pinned SGLang release
takes its other ports itself: nccl and the rendezvous of a one-node server from the OS (`get_free_port`),
IPC through files; only DP attention derives one (HTTP port + 233, `ZMQ_TCP_PORT_DELTA`), which
lands 33 above the next block's start: past its node ports, below its rendezvous."""
CLIENT_CPUS = 2
"""CPUs left to cptest itself (the suite, each run's client and sampler threads): not given to servers."""


@dataclass(frozen=True)
class Machine:
    gpus: dict[int, int]
    """Physical GPU id -> memory (MiB) a suite may hand out on it."""
    cpus: tuple[int, ...]
    """Host CPUs the servers may be pinned to (the client CPUs already taken out)."""
    slots: int = 64
    """How many port slots there are, two blocks each (an upper bound on concurrent scenarios)."""
    port_base: int = PORT_BASE
    client_cpus: tuple[int, ...] = field(default_factory=tuple)

    def ports(self, slot: int) -> tuple[int, int]:
        """Slot `slot`'s main and baseline HTTP ports (`SLOT_STRIDE`, `PORT_BLOCK`)."""
        main = self.port_base + SLOT_STRIDE * slot
        return main, main + PORT_BLOCK

    def describe(self) -> str:
        gpus = ", ".join(f"GPU {g} {m} MiB" for g, m in sorted(self.gpus.items())) or "no GPU"
        return f"{gpus}; {len(self.cpus)} CPUs for servers, {len(self.client_cpus)} for cptest"


def parse_ids(text: str, what: str) -> list[int]:
    """`0,1` or `4-7,9` -> sorted ids. Raises RunError naming `what` on anything else."""
    out: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise ValueError
                out.update(range(lo, hi + 1))
            elif part:
                out.add(int(part))
        except ValueError:
            raise RunError(f"{what}: {text!r} is not a list of ids such as 0,1 or 4-7") from None
    return sorted(out)


def discover(*, gpus: list[int] | None = None, cpus: list[int] | None = None,
             gpu_totals: dict[str, int] | None = None, reserve_mib: int = 0,
             port_base: int = PORT_BASE) -> Machine:
    """This machine: the GPUs that NVML or nvidia-smi report (or only `gpus`), their memory less what
    is in use now and `reserve_mib`, the CPUs this process may use (or only `cpus`) less
    CLIENT_CPUS for cptest itself."""
    if gpu_totals is None:
        from cptest.run.gpu import gpu_totals_mib

        gpu_totals = gpu_totals_mib()
    free = _free_now(gpu_totals)
    present = {int(g): max(0, free.get(g, m) - reserve_mib) for g, m in gpu_totals.items()}
    if gpus is not None:
        missing = [g for g in gpus if g not in present]
        if missing and present:
            raise RunError(f"--gpus names GPU(s) {missing} that this machine does not have "
                           f"(it has {sorted(present)})")
        present = {g: present.get(g, 0) for g in gpus}
    usable = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(usable) <= 2 * CLIENT_CPUS:  # a small machine: cptest's own threads float over all of them
        return Machine(present, tuple(usable), port_base=port_base)
    return Machine(present, tuple(usable[CLIENT_CPUS:]), port_base=port_base,
                   client_cpus=tuple(usable[:CLIENT_CPUS]))


def _free_now(totals: dict[str, int]) -> dict[str, int]:
    """GPU -> MiB free now (total less what is in use), where a reading is possible."""
    from cptest.run.gpu import GpuQueryUnavailable, read_gpus

    try:
        used = read_gpus().used_mib
    except GpuQueryUnavailable:
        return dict(totals)
    return {g: m - used.get(g, 0) for g, m in totals.items()}
