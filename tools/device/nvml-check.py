"""nvml-check.py: can NVML attribute GPU memory to processes on this machine (gVisor)?

Starts a child that allocates 1 GiB on GPU 0 and 2 GiB on GPU 1 (if present), then lists what
nvmlDeviceGetComputeRunningProcesses says per device, next to the device totals and the child's pid.
"""
import json
import os
import subprocess
import sys
import time

import pynvml

CHILD = r"""
import os, sys, time, torch
xs = [torch.empty(((i + 1) << 30,), dtype=torch.uint8, device=f"cuda:{i}")
      for i in range(torch.cuda.device_count())]
torch.cuda.synchronize(); print("ready", os.getpid(), flush=True); time.sleep(30)
"""
pynvml.nvmlInit()
n = pynvml.nvmlDeviceGetCount()
def snap():
    out = {}
    for i in range(n):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        procs = []
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                for p in getattr(pynvml, fn)(h):
                    procs.append({"fn": fn[-20:], "pid": p.pid, "used": p.usedGpuMemory})
            except pynvml.NVMLError as e:
                procs.append({"fn": fn, "error": str(e)})
        try:
            acct = pynvml.nvmlDeviceGetAccountingMode(h)
        except pynvml.NVMLError as e:
            acct = str(e)
        out[i] = {"used_mib": mem.used >> 20, "total_mib": mem.total >> 20, "procs": procs,
                  "accounting": acct,
                  "uuid": pynvml.nvmlDeviceGetUUID(h)}
    return out
print("before", json.dumps(snap()))
child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
line = child.stdout.readline().strip()
print("child says", line, "popen pid", child.pid, "my pid", os.getpid())
time.sleep(1)
print("during", json.dumps(snap()))
child.kill()
child.wait()
time.sleep(2)
print("after", json.dumps(snap()))
print("driver", pynvml.nvmlSystemGetDriverVersion(), "nvml", pynvml.nvmlSystemGetNVMLVersion())
print("cpus", os.cpu_count(), len(os.sched_getaffinity(0)))
