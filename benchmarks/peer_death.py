"""SIGKILL one of two gloo ranks at a random moment; count how often the other one never ends.

The reference engine's ranks step in lockstep: rank 0 broadcasts each step (`broadcast_object_list`)
and the ranks all-reduce inside it, over gloo with a collective timeout of a day. A rank killed on
another node is seen only through gloo, unless the ranks hold lifelines (cptest/reference/lifeline.py).
Each trial forks two ranks that loop on exactly those two collectives, kills rank 1 after a random
delay, and waits `--wait` seconds for rank 0 to end:

- `gloo`: rank 0 ended by the collective's error;
- `lifeline`: rank 0 ended by its lifeline (only with `--lifelines`);
- `hang`: rank 0 still ran after `--wait` seconds (then it is killed).

    python benchmarks/peer_death.py --trials 200              # gloo alone
    python benchmarks/peer_death.py --trials 200 --lifelines  # the reference engine's ranks

Prints one summary line; exit 1 when a trial hung with `--lifelines`.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _rank(rank: int, port: int, lifelines: bool, events: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    day = timedelta(days=1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=day)
    group = dist.new_group([0, 1], backend="gloo", timeout=day)
    if lifelines:
        from cptest.reference.lifeline import Lifelines

        def exchange(box: list[Any]) -> list[Any]:
            dist.broadcast_object_list(box, src=0)
            return box

        def died(line: str) -> None:
            events.put(("lifeline", rank))
            time.sleep(0.2)  # the queue's feeder thread sends it before the process ends
            os._exit(1)

        Lifelines.join(rank, 2, f"tcp://127.0.0.1:{port}", exchange, on_death=died)
    events.put(("ready", rank))
    t = torch.zeros(256)
    try:
        while True:
            box = [{"step": list(range(random.randint(1, 2000)))}] if rank == 0 else [None]
            dist.broadcast_object_list(box, src=0)
            dist.all_reduce(t, group=group)
            if rank == 0 and random.random() < 0.3:
                time.sleep(random.random() * 0.01)  # an idle moment, as between a server's steps
    except RuntimeError:
        events.put(("gloo", rank))
        time.sleep(0.2)
        os._exit(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def trial(ctx: Any, lifelines: bool, wait_s: float, rng: random.Random) -> str:
    """One kill: how rank 0 ended (`gloo`, `lifeline`) or `hang`."""
    events = ctx.Queue()
    port = _free_port()
    ranks = [ctx.Process(target=_rank, args=(r, port, lifelines, events)) for r in range(2)]
    for p in ranks:
        p.start()
    ready = 0
    while ready < 2:
        kind, _ = events.get(timeout=60)
        ready += kind == "ready"
    time.sleep(rng.random() * 0.5)
    os.kill(ranks[1].pid, signal.SIGKILL)
    ranks[0].join(timeout=wait_s)
    how = "hang"
    if ranks[0].exitcode is None:
        ranks[0].kill()
        ranks[0].join()
    else:
        while not events.empty():
            kind, rank = events.get()
            if rank == 0 and kind in ("gloo", "lifeline"):
                how = kind
        if how == "hang":
            how = "gloo"  # it ended, and its message was lost with it
    ranks[1].join()
    return how


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--lifelines", action="store_true",
                    help="the ranks hold lifelines, as the reference engine's do")
    ap.add_argument("--wait", type=float, default=10.0, help="seconds rank 0 has to end after the kill")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    ctx = mp.get_context("fork")
    rng = random.Random(a.seed)
    counts = {"gloo": 0, "lifeline": 0, "hang": 0}
    t0 = time.monotonic()
    for i in range(a.trials):
        counts[trial(ctx, a.lifelines, a.wait, rng)] += 1
        if (i + 1) % 50 == 0:
            print(f"  {i + 1}/{a.trials} trials", file=sys.stderr, flush=True)
    took = time.monotonic() - t0
    print(f"peer death, {'with' if a.lifelines else 'without'} lifelines: {a.trials} trials in {took:.0f} s; "
          f"rank 0 ended by gloo {counts['gloo']}, by its lifeline {counts['lifeline']}, "
          f"hung {counts['hang']} (still running {a.wait:.0f} s after the kill)")
    return 1 if a.lifelines and counts["hang"] else 0


if __name__ == "__main__":
    sys.exit(main())
