"""The facts that pin a result to the machine that made it: python, torch, CUDA, driver, GPUs, SGLang.

`collect_environment` runs programs (nvidia-smi, a torch probe in a subprocess; argv only, short
timeouts) and is therefore part of the run stage; the store only writes what it returns into the
archive's manifest. An absent fact is null, with its reason under `reasons`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from cptest import __version__
from cptest.store import sha256_file

TOOL_TIMEOUT_S = 20.0
"""nvidia-smi and the torch probe get this long; a hung driver must not hang `cptest run`."""


def _run_tool(argv: list[str]) -> tuple[str | None, str]:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except FileNotFoundError:
        return None, f"{argv[0]} not found"
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer in {TOOL_TIMEOUT_S:g} s"
    if out.returncode != 0:
        return None, f"{argv[0]} exited {out.returncode}: {out.stderr.strip()[:200]}"
    return out.stdout.strip(), ""


def _dist(name: str) -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _wheel_sha256(dist: importlib.metadata.Distribution) -> tuple[str | None, str]:
    """pip records the wheel's hash in direct_url.json when installed from a file or URL."""
    text = dist.read_text("direct_url.json")
    if text:
        try:
            info = json.loads(text).get("archive_info", {})
        except json.JSONDecodeError:
            info = {}
        h = (info.get("hashes") or {}).get("sha256") or str(info.get("hash", "")).removeprefix("sha256=")
        if h:
            return h, ""
    return None, "installed from an index: no wheel hash recorded (direct_url.json has none)"


JIT_CACHES: dict[str, tuple[str, str]] = {
    # name: (variable that moves it, where it is otherwise). Kept between launches on one machine
    # (cptest never clears them): a warm cache turns minutes of kernel builds into loads.
    "triton": ("TRITON_CACHE_DIR", "~/.triton/cache"),
    "torchinductor": ("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_{user}"),
    "flashinfer": ("FLASHINFER_WORKSPACE_BASE", "~/.cache/flashinfer"),
    "deep_gemm": ("SGLANG_DG_CACHE_DIR", "~/.cache/deep_gemm"),
    "tvm_ffi": ("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi"),
}
MAX_CACHE_FILES = 200_000
"""Counting stops here: a cache that large is warm, and the manifest must not take minutes."""


def jit_caches(environ: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Where each JIT/compile cache the engine uses is, and how full it was when the run began
    (files, bytes): the manifest says whether a run's startup built kernels or loaded them."""
    import getpass
    import os

    env = os.environ if environ is None else environ
    out: dict[str, dict[str, Any]] = {}
    for name, (var, default) in JIT_CACHES.items():
        path = Path(os.path.expanduser(env.get(var) or default.format(user=getpass.getuser())))
        files = size = 0
        for root, _, names in os.walk(path):
            for n in names:
                files += 1
                try:
                    size += os.lstat(os.path.join(root, n)).st_size
                except OSError:
                    continue
            if files >= MAX_CACHE_FILES:
                break
        out[name] = {"path": str(path), "set_by": var if env.get(var) else "default", "files": files,
                     "bytes": size}
    return out


def collect_environment(repo_root: Path | None = None) -> dict[str, Any]:
    """Facts that pin a result: python, torch, CUDA, driver, GPU model, sglang version and wheel hash,
    cptest version, flake.lock sha256. An absent fact is null, with its reason under `reasons`."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cptest": __version__,
    }
    reasons: dict[str, str] = {}
    env["jit_caches"] = jit_caches()
    torch = _dist("torch")
    env["torch"] = torch.version if torch else None
    if torch is None:
        reasons["torch"] = reasons["cuda"] = "torch is not installed"
        env["cuda"] = None
    else:
        out, why = _run_tool([sys.executable, "-c", "import torch; print(torch.version.cuda or '')"])
        env["cuda"] = out or None
        if not out:
            reasons["cuda"] = why or "torch built without CUDA"
    smi, why = _run_tool(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if smi:
        rows = [[c.strip() for c in line.split(",")] for line in smi.splitlines() if line.strip()]
        env["gpus"] = [r[0] for r in rows]
        env["driver"] = rows[0][1] if rows and len(rows[0]) > 1 else None
    else:
        env["gpus"] = env["driver"] = None
        reasons["gpus"] = reasons["driver"] = why
    sgl = _dist("sglang")
    env["sglang"] = sgl.version if sgl else None
    env["sglang_wheel_sha256"] = None
    env["sglang_record_sha256"] = None
    if sgl is None:
        reasons["sglang"] = reasons["sglang_wheel_sha256"] = (
            "sglang is not installed here (container launcher?)"
        )
    else:
        env["sglang_wheel_sha256"], why = _wheel_sha256(sgl)
        if why:
            reasons["sglang_wheel_sha256"] = why
        record = sgl.read_text("RECORD")
        # The RECORD lists every installed file with its hash: its own hash fingerprints the install.
        env["sglang_record_sha256"] = hashlib.sha256(record.encode()).hexdigest() if record else None
    root = repo_root or Path(__file__).resolve().parent.parent
    lock = root / "flake.lock"
    env["flake_lock_sha256"] = sha256_file(lock) if lock.is_file() else None
    if not lock.is_file():
        reasons["flake_lock_sha256"] = f"no flake.lock in {root}"
    env["reasons"] = reasons
    return env
