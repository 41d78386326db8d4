"""The baseline cache: a baseline server's evidence, reused by every later run that would make the same.

A scenario's baseline (the TP-only run its generation is compared with) is often the same for many
scenarios and for every rerun: same release, weights, baseline topology, serve options and requests.
Running it again costs a whole server start (about a minute on the GPU machine) and proves nothing
new. The key is the sha256 of everything that determines the baseline's evidence:

    the engine and release, the baseline's degrees, its argv (without the HTTP port, which a suite
    moves), environment and GPU count, whether the probe and eager mode are on; the model pin and
    the weights' sha256; the engine's install as the manifest records it (sglang version and wheel
    hash, torch, CUDA, driver, GPU model); the whole workload; the cptest version.

The noise-floor control (docs/language.md, "Generation parity") is cached the same way, under a key
that adds its role and the baseline's key (it scores the baseline's output).

Weights that cannot be hashed (a hub id not on disk) make no key: nothing is cached or reused.
Only a clean baseline is stored: ready, every request with an outcome, shut down. A reused baseline
is copied into the new archive (`evidence/baseline/`, `logs/baseline-*.log`), so each archive still
contains the evidence it was judged against, and the main runner file records the reuse (Lifecycle
`baseline_reused` with the key and the archive that made it); a stored one records `baseline_cached`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cptest.plan.model import Plan, ServerPlan
from cptest.store import Layout

CACHE_VERSION = 1
INSTALL_FACTS = ("sglang", "sglang_wheel_sha256", "sglang_record_sha256", "torch", "cuda", "driver", "gpus")
"""Environment facts (`cptest.run.environment`) that change what the same argv does."""


def _without_port(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--port":
            skip = True
            continue
        out.append(a)
    return out


def baseline_key(plan: Plan, environment: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(key, what it was computed from) for `plan`'s baseline; None without a baseline or without
    a weights hash."""
    return server_key(plan, plan.baseline, environment)


def control_key(plan: Plan, environment: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The control's key: its own server, and the baseline's key, since it scores the baseline's
    output (a different baseline means different sequences, hence different evidence)."""
    base = baseline_key(plan, environment)
    if base is None:
        return None
    return server_key(plan, plan.control, environment, scored_from=base[0])


def server_key(plan: Plan, server: ServerPlan | None, environment: Mapping[str, Any],
               **extra: str) -> tuple[str, dict[str, Any]] | None:
    weights = environment.get("weights_sha256")
    if server is None or not weights:
        return None
    material = {
        "cache_version": CACHE_VERSION,
        "engine": server.engine,
        "release": server.release,
        "topology": server.topology.model_dump(mode="json"),
        "probe": server.probe,
        "eager": server.eager,
        "nodes": [{"argv": _without_port(n.argv), "env": n.env, "gpus": len(n.gpu_ids), "image": n.image}
                  for n in server.nodes],
        "model": plan.pins.model.model_dump(mode="json"),
        "weights_sha256": weights,
        "install": {k: environment.get(k) for k in INSTALL_FACTS},
        "workload_sha256": hashlib.sha256(plan.workload.model_dump_json().encode()).hexdigest(),
        "cptest": plan.pins.cptest_version,
        **extra,
    }
    if server.role != "baseline":
        material["role"] = server.role
    text = json.dumps(material, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest(), material


@dataclass(frozen=True)
class BaselineCache:
    root: Path

    def entry(self, key: str) -> Path:
        return self.root / key

    def lookup(self, key: str) -> dict[str, Any] | None:
        """The stored entry's key.json, or None (absent, or a half-written entry)."""
        try:
            return json.loads((self.entry(key) / "key.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def restore(self, key: str, layout: Layout, role: str = "baseline") -> None:
        """Copy the entry's evidence and logs into the archive at `layout`."""
        src = self.entry(key)
        shutil.copytree(src / "evidence", layout.role_dir(role), dirs_exist_ok=True)
        for log in sorted((src / "logs").glob("*.log")):
            shutil.copy2(log, layout.logs_dir / log.name)

    def store(self, key: str, material: dict[str, Any], layout: Layout, role: str = "baseline") -> bool:
        """Keep the archive's baseline evidence under `key` (written aside, then renamed, so a reader
        never sees half an entry). False when another run stored it first or the disk refused."""
        if self.lookup(key) is not None:
            return False
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=self.root))
        try:
            shutil.copytree(layout.role_dir(role), tmp / "evidence")
            (tmp / "logs").mkdir()
            for log in sorted(layout.logs_dir.glob(f"{role}-node*.log")):
                shutil.copy2(log, tmp / "logs" / log.name)
            (tmp / "key.json").write_text(json.dumps({
                "key": key, "material": material, "archive": str(layout.root),
                "stored": datetime.now(UTC).isoformat(timespec="seconds")}, indent=2, sort_keys=True) + "\n",
                encoding="utf-8")  # fmt: skip
            os.rename(tmp, self.entry(key))
            return True
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp)
