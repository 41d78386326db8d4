"""Print N CPU sets, comma-separated CPU ids each, space between sets: whole physical cores only.

    read -r -a SETS < <(python3 tools/device/cpusets.py N)

Each of the first N-1 sets gets len(cores) // N physical cores (with their hyperthread siblings),
the last the rest (the client). Busy scheduler threads of servers sharing cores slowed whole
batches by a third in the first probe-overhead runs, so servers never share. With fewer physical
cores than N, every set is every CPU this process may use.
"""

from __future__ import annotations

import glob
import os
import sys


def main(n: int) -> str:
    cores: dict[str, list[int]] = {}
    for f in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology/thread_siblings_list"):
        cpu = int(f.split("/")[5][3:])
        if cpu in os.sched_getaffinity(0):
            with open(f) as fh:
                cores.setdefault(fh.read().strip(), []).append(cpu)
    phys = sorted(cores.values())
    if len(phys) < n:
        phys = [sorted(c for p in phys for c in p)] * n
    per = max(1, len(phys) // n)
    sets = [sorted(c for p in phys[i * per:(i + 1) * per] for c in p) for i in range(n - 1)]
    sets.append(sorted(c for p in phys[(n - 1) * per:] for c in p) or sets[-1])
    return " ".join(",".join(map(str, s)) for s in sets)


if __name__ == "__main__":
    print(main(int(sys.argv[1])))
