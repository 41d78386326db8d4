"""GPU memory readings: per device, and per process where the machine can say which process holds what.

Runs that share GPUs (a suite packing several servers onto one machine) cannot be judged by the
device total: another run's server starting or stopping moves it. NVML (NVIDIA's management
library, through the `nvidia-ml-py` bindings) lists the processes holding memory on each device with
their pids, which the supervisor sorts into this run's and other runs' (`cptest.run.supervisor`).
Seen on the 2 x H200 machine under gVisor (tools/device/nvml-check.py): a child holding 1.5 and
2.5 GiB appeared under its own pid on each device and was gone from the list after it died.

`read_gpus()` tries NVML, then nvidia-smi (device totals only), then raises GpuQueryUnavailable.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from dataclasses import dataclass
from typing import Any

NVIDIA_SMI_ARGV: list[str] = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
MIB = 1 << 20


class GpuQueryUnavailable(Exception):
    """GPU memory cannot be read here (no NVML, no nvidia-smi, no driver). Recorded as a note."""


@dataclass(frozen=True)
class GpuReading:
    """One reading of every GPU: MiB in use per device, and per process where known."""

    used_mib: dict[str, int]
    """GPU index -> MiB in use on the device (every process, ours or not)."""
    processes: dict[str, dict[int, int]] | None = None
    """GPU index -> pid -> MiB that process holds; None where the machine cannot attribute memory."""


def query_gpu_memory(argv: list[str] | None = None, timeout_s: float = 10.0) -> dict[str, int]:
    """GPU index -> MiB in use, from nvidia-smi (argv list, no shell).

    Raises GpuQueryUnavailable when nvidia-smi is absent or fails.
    """
    argv = list(argv or NVIDIA_SMI_ARGV)
    if shutil.which(argv[0]) is None:
        raise GpuQueryUnavailable(f"{argv[0]} not found on PATH; GPU memory not sampled")
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    except (subprocess.SubprocessError, OSError) as e:
        raise GpuQueryUnavailable(f"{argv[0]} failed: {e}") from None
    return parse_gpu_memory(out)


def parse_gpu_memory(text: str) -> dict[str, int]:
    """`0, 1234` lines -> {"0": 1234}. Lines that are not `index, number` are skipped."""
    used: dict[str, int] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            used[parts[0]] = int(parts[1])
    return used


_nvml_lock = threading.Lock()
_nvml_state: dict[str, Any] = {}


def _nvml() -> Any:
    """The initialised pynvml module, or raise GpuQueryUnavailable (the reason is kept: NVML is
    initialised once per process, and a machine without a driver stays without one)."""
    with _nvml_lock:
        if "module" in _nvml_state:
            return _nvml_state["module"]
        if "error" in _nvml_state:
            raise GpuQueryUnavailable(_nvml_state["error"])
        try:
            import pynvml

            pynvml.nvmlInit()
        except ImportError:
            _nvml_state["error"] = "nvidia-ml-py is not installed; per-process GPU memory not read"
        except Exception as e:  # pynvml.NVMLError and its many subclasses: no driver, no library
            _nvml_state["error"] = f"NVML unavailable: {e}"
        else:
            _nvml_state["module"] = pynvml
            return pynvml
        raise GpuQueryUnavailable(_nvml_state["error"])


def nvml_reading(nvml: Any) -> GpuReading:
    """Every device's used memory and its compute processes through an initialised pynvml module."""
    used: dict[str, int] = {}
    procs: dict[str, dict[int, int]] = {}
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        used[str(i)] = int(nvml.nvmlDeviceGetMemoryInfo(handle).used // MIB)
        held: dict[int, int] = {}
        for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            # usedGpuMemory is None where the driver will not say (some virtualised setups)
            mib = int((p.usedGpuMemory or 0) // MIB)
            held[int(p.pid)] = held.get(int(p.pid), 0) + mib
        procs[str(i)] = held
    return GpuReading(used, procs)


def read_gpus() -> GpuReading:
    """The GPUs now: through NVML where it works, else nvidia-smi's device totals (no processes).
    Raises GpuQueryUnavailable when neither can read them."""
    try:
        nvml = _nvml()
    except GpuQueryUnavailable as nvml_unavailable:
        try:
            return GpuReading(query_gpu_memory())
        except GpuQueryUnavailable as e:
            raise GpuQueryUnavailable(f"{e} ({nvml_unavailable})") from None
    try:
        return nvml_reading(nvml)
    except Exception as e:  # a driver error mid-run: say so; the caller records it as a note
        raise GpuQueryUnavailable(f"NVML query failed: {e}") from None


def gpu_totals_mib() -> dict[str, int]:
    """GPU index -> total memory in MiB (NVML, else nvidia-smi); {} where no GPU can be read."""
    try:
        nvml = _nvml()
        return {str(i): int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i)).total // MIB)
                for i in range(nvml.nvmlDeviceGetCount())}
    except Exception:
        pass
    try:
        return parse_gpu_memory(subprocess.run(
            ["nvidia-smi", "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True).stdout)
    except (subprocess.SubprocessError, OSError):
        return {}


def minor_numbers(gpu_ids: list[int]) -> tuple[dict[int, int], str]:
    """Each GPU index's device minor number (its `/dev/nvidia<minor>`) from NVML, and where the
    figures came from; the index itself, said so, where NVML cannot answer."""
    try:
        nvml = _nvml()
        return ({g: int(nvml.nvmlDeviceGetMinorNumber(nvml.nvmlDeviceGetHandleByIndex(g))) for g in gpu_ids},
                "NVML minor numbers")
    except GpuQueryUnavailable as e:
        return {g: g for g in gpu_ids}, f"the GPU index as minor number ({e})"
    except Exception as e:  # noqa: BLE001 - pynvml.NVMLError and its many subclasses
        return {g: g for g in gpu_ids}, f"the GPU index as minor number (NVML: {e})"
