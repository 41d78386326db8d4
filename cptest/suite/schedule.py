"""The packing: which waiting scenario may start now, and on which GPUs, CPUs and ports. Pure.

Rules, in order:
- A scenario declared `exclusive` starts only on an idle machine, and nothing starts beside it.
  While one waits at the head of the queue nothing else starts, so it is not starved.
- Otherwise the queue is taken in order and any scenario that fits starts (later small ones fill
  the gaps an earlier large one leaves).
- A scenario fits when it gets its own CPUs (`Demand.cpus`, never shared), a free port slot, and
  `Demand.gpus` GPUs that each have `Demand.gpu_mib` unreserved; among the GPUs that fit, the ones
  with the fewest servers on them are taken (then the most memory left), to spread the work. A
  co-located scenario is packed the same way: its demand already counts every rank sharing a GPU,
  and its placement says `colocated`, so its ranks go onto the GPUs granted.
- `jobs` caps how many run at once (`--jobs 1`: one at a time, the way to measure what sharing saves).
- With `claim` (the suite passes `cptest.suite.port_claims.try_claim`), a slot is taken only once it is
  claimed host-wide: a slot another cptest process holds, or whose ports are in use, is passed over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from cptest.plan.model import Placement
from cptest.suite.demand import Demand
from cptest.suite.machine import Machine


class HeldSlot(Protocol):
    def release(self) -> None: ...


@dataclass(frozen=True)
class Granted:
    placement: Placement
    slot: int
    gpus: tuple[int, ...]
    cpus: tuple[int, ...]


@dataclass
class Pool:
    machine: Machine
    jobs: int | None = None
    claim: Callable[[int, int], HeldSlot | None] | None = None
    """(main port, baseline port) -> the slot's host-wide claim, or None when it is not to be had."""
    free_mib: dict[int, int] = field(init=False)
    load: dict[int, int] = field(init=False)
    free_cpus: list[int] = field(init=False)
    free_slots: list[int] = field(init=False)
    running: dict[str, tuple[Demand, Granted]] = field(default_factory=dict)
    held: dict[str, HeldSlot] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.free_mib = dict(self.machine.gpus)
        self.load = {g: 0 for g in self.machine.gpus}
        self.free_cpus = list(self.machine.cpus)
        self.free_slots = list(range(self.machine.slots))

    def never_fits(self, d: Demand) -> str | None:
        """Why `d` cannot run on this machine even when it is idle, or None."""
        if d.cannot_run:
            return d.cannot_run
        if d.gpus > len(self.machine.gpus):
            return f"needs {d.gpus} GPU(s), the suite has {len(self.machine.gpus)}"
        roomy = [g for g, m in self.machine.gpus.items() if m >= d.gpu_mib]
        if len(roomy) < d.gpus:
            return (f"needs {d.gpu_mib} MiB on each of {d.gpus} GPU(s); "
                    f"only {len(roomy)} GPU(s) have that free")
        if d.cpus > len(self.machine.cpus):
            return f"needs {d.cpus} CPUs, the suite has {len(self.machine.cpus)} for servers"
        return None

    def place(self, key: str, d: Demand) -> Granted | None:
        """Reserve what `d` needs and return where it runs, or None if it does not fit now."""
        if self.jobs is not None and len(self.running) >= self.jobs:
            return None
        if any(rd.exclusive for rd, _ in self.running.values()):
            return None
        if d.exclusive and self.running:
            return None
        if len(self.free_cpus) < d.cpus or not self.free_slots:
            return None
        fits = [g for g in self.machine.gpus if self.free_mib[g] >= d.gpu_mib]
        if len(fits) < d.gpus:
            return None
        gpus = tuple(sorted(sorted(fits, key=lambda g: (self.load[g], -self.free_mib[g], g))[:d.gpus]))
        cpus = tuple(self.free_cpus[:d.cpus])
        taken = self._take_slot()
        if taken is None:
            return None
        slot, hold = taken
        if hold is not None:
            self.held[key] = hold
        main, baseline = self.machine.ports(slot)
        placement = Placement(main_port=main, baseline_port=baseline, mode=d.placement,
                              gpus=list(gpus) if d.gpus else None, cpus=list(cpus) if cpus else None)
        granted = Granted(placement, slot, gpus, cpus)
        for g in gpus:
            self.free_mib[g] -= d.gpu_mib
            self.load[g] += 1
        self.free_cpus = self.free_cpus[d.cpus:]
        self.free_slots.remove(slot)
        self.running[key] = (d, granted)
        return granted

    def _take_slot(self) -> tuple[int, HeldSlot | None] | None:
        """The first free slot (claimed host-wide when `claim` is set), or None."""
        if self.claim is None:
            return (self.free_slots[0], None) if self.free_slots else None
        for slot in self.free_slots:
            hold = self.claim(*self.machine.ports(slot))
            if hold is not None:
                return slot, hold
        return None

    def release(self, key: str) -> None:
        d, granted = self.running.pop(key)
        hold = self.held.pop(key, None)
        if hold is not None:
            hold.release()
        for g in granted.gpus:
            self.free_mib[g] += d.gpu_mib
            self.load[g] -= 1
        self.free_cpus = sorted(self.free_cpus + list(granted.cpus))
        self.free_slots = sorted(self.free_slots + [granted.slot])


def next_to_start(pool: Pool, waiting: list[tuple[str, Demand]]) -> list[tuple[str, Demand, Granted]]:
    """Place as many waiting scenarios as fit now, in queue order (see the module's rules); the
    placed ones are reserved in `pool` and returned."""
    started = []
    for key, d in waiting:
        granted = pool.place(key, d)
        if granted is not None:
            started.append((key, d, granted))
        elif d.exclusive:
            break  # it waits at the head: start nothing after it, or it could wait forever
    return started
