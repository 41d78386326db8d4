"""What a scenario may put into an engine's environment and argv: judged against its release's table.

A scenario's `serve { env ... }` and `serve { flag ... }` reach the engine's processes. Left
unchecked they run the scenario's own code there (`env "PYTHONPATH"` to a folder with a
`sitecustomize.py`, `LD_PRELOAD`, `flag "--trust-remote-code"`, `flag "--custom-weight-loader"`),
read files cptest never archived (`flag "--config" "x.yaml"`), or undo what the GPU machine
requires (`env "NCCL_NVLS_ENABLE" "1"`). `problems(...)` judges every entry against the table of the
scenario's engine and release:

- **machine**: the settings every engine process must have on the GPU machine (`MACHINE_ENV`), the
  ones cptest owns (`CUDA_VISIBLE_DEVICES`, from the plan's placement) and the ones a co-located
  placement sets (`PLACEMENT_ENV`). Never overridable.
- **unsafe**: loads code, or reads or writes files or endpoints outside the scenario's archive.
  Rejected, unless the scenario declares `unsafe "reason"`; a run of such a scenario then also needs
  `cptest run --allow-unsafe` (the plan records the declaration and what it covers).

The environment table, and why it is shaped so. A variable is judged by its name, then its value:
1. names cptest or the machine owns, then the interpreter's and the dynamic linker's (`PYTHON*`,
   `LD_*`): code before any of SGLang's own runs;
2. `env_deny`, patterns over names with the reason each is unsafe, checked before the allow
   prefixes: a variable that names code to import (a module, package, plugin, class, cache
   manager or backend), a file or directory (read, written, or holding compiled kernels), a command
   or another host, or that weakens deserialisation (`torch.load` of full pickles, pickled IPC);
3. `env_allow`, the prefixes of the libraries a CP run tunes (`SGLANG_*`, `NCCL_*`, `TORCH_*`, ...);
   any other name is unsafe: a table of what is known to be harmless cannot list every library;
4. the value: the prefixes admit values that are words, numbers and lists (`1`, `INFO`,
   `INIT,COLL`, `expandable_segments:True`), never a path (`/`, `\\`, a leading `~`: a file
   outside the run's tree), and, for a name that picks an implementation (`CODE_NAME_SUFFIXES`),
   never a module path (`pkg.mod`, `pkg.mod:Class`). A variable the deny patterns miss therefore
   still cannot point the engine at a file or a module through an allowed prefix.
Every refusal but the machine's and cptest's own is escapable by `unsafe "reason"`: a scenario may
need one, and then says so, and whoever runs it says `--allow-unsafe`.

The per-release tables are release knowledge and live with it (`Release.safety`,
`cptest.engines.sglang.safety`); the judging lives here, in the language stage, because `cptest
validate` must refuse these entries with their position, so the language stage sits above the
engines (docs/architecture.md §2). The plan judges a scenario built in code with the same functions.
`tests/lang/test_safety.py` checks every table entry against the release's flag table. Pure data and
pure functions: no clock, no files.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass

from cptest.engines.sglang.releases import KNOWN_RELEASES
from cptest.engines.sglang.safety import CODE_WHY, CONFIG_WHY, Policy, option_like

MACHINE_ENV: Mapping[str, str] = {
    # NVLink multicast must stay off on the shared GPU hosts (the GPU machine's rules).
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""Environment the GPU machine requires of every engine process; a scenario cannot change it."""

MANAGED_ENV: Mapping[str, str] = {
    "CUDA_VISIBLE_DEVICES": "the plan's placement chooses the GPUs (cptest run --gpus)",
    "PYTHONUNBUFFERED": "cptest reads the engine's log as it is written",
}
"""Variables cptest sets itself; a scenario cannot change them."""

PLACEMENT_ENV: Mapping[str, str] = {
    name: "the co-located placement sets it on every node (docs/placement.md: ranks sharing a GPU need "
          "it, and the plan records it)"
    for name in ("NCCL_HOSTID", "NCCL_SOCKET_IFNAME", "NCCL_NET", "NCCL_IB_DISABLE", "NCCL_P2P_DISABLE",
                 "NCCL_SHM_DISABLE", "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK")
}
"""Variables a placement owns (an engine's `colocated()` may set only these; a test holds it to
that); a scenario cannot set them, on either placement: the same scenario runs both ways."""


LATEST: Policy = list(KNOWN_RELEASES.values())[-1].safety
"""An engine or release without a table (the plan rejects unknown releases) gets the newest one."""

POLICIES: Mapping[tuple[str, str], Policy] = {
    **{("sglang", name): release.safety for name, release in KNOWN_RELEASES.items()},
    # The CPU reference engine is cptest's own Python: the same environment rules; it takes no flags.
    ("reference", "builtin"): LATEST,
}


def policy_for(engine: str, release: str) -> Policy:
    return POLICIES.get((engine, release), LATEST)


@dataclass(frozen=True)
class Verdict:
    """Why one entry may not be set: `escapable` when `unsafe "reason"` plus `--allow-unsafe` allow it."""

    reason: str
    escapable: bool


CODE_NAME_SUFFIXES = ("_BACKEND", "_IMPL", "_FACTORY", "_LOADER", "_HANDLER", "_PROVIDER", "_FN", "_FUNC",
                      "_CALLBACK", "_BASE")
"""Name endings of variables that pick an implementation or a location by name: their value is a
word (`triton`, `fa3`, a number), never a module path that something would import."""

_MODULE_VALUE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_][\w.]*)?|[A-Za-z_]\w*:[A-Za-z_][\w.]*")


def env_value_problem(name: str, value: str) -> str | None:
    """Why an allowed variable may not have `value`; None when it may (step 4 of the table above)."""
    if "/" in value or "\\" in value or value.startswith("~"):
        return f"{name}={value!r} names a file or directory, outside the run's archive"
    if name.endswith(CODE_NAME_SUFFIXES) and _MODULE_VALUE.fullmatch(value.strip()):
        return f"{name}={value!r} names a module or class the engine would import ({CODE_WHY})"
    return None


def env_verdict(policy: Policy, name: str, value: str | None = None) -> Verdict | None:
    """None when the scenario may set `name` (to `value`, when given); else why not."""
    if name in MACHINE_ENV:
        return Verdict(f"the GPU machine requires {name}={MACHINE_ENV[name]} of every engine process",
                       escapable=False)
    if name in MANAGED_ENV:
        return Verdict(f"cptest sets {name}: {MANAGED_ENV[name]}", escapable=False)
    if name in PLACEMENT_ENV:
        return Verdict(f"cptest sets {name}: {PLACEMENT_ENV[name]}", escapable=False)
    if name.startswith("PYTHON"):
        return Verdict(f"{name} is read by the Python interpreter at start-up (PYTHONPATH, PYTHONSTARTUP: "
                       "code)", escapable=True)
    if name.startswith(("LD_", "DYLD_")):
        return Verdict(f"{name} is read by the dynamic linker (LD_PRELOAD, LD_LIBRARY_PATH: libraries)",
                       escapable=True)
    for pattern, why in policy.env_deny.items():
        if fnmatch.fnmatchcase(name, pattern):
            return Verdict(f"{name} {why}", escapable=True)
    if any(fnmatch.fnmatchcase(name, p) for p in policy.env_allow):
        problem = None if value is None else env_value_problem(name, value)
        return None if problem is None else Verdict(problem, escapable=True)
    why = "is not in the release's allow table (" + ", ".join(policy.env_allow[:6]) + ", ...)"
    return Verdict(f"{name} {why}", escapable=True)


def flag_verdict(policy: Policy, flag: str) -> Verdict | None:
    """None when the scenario may pass `flag` through; else why not (always escapable: the plan's
    flag table refuses flags cptest manages itself)."""
    if flag in policy.flag_deny:
        return Verdict(f"{flag} {policy.flag_deny[flag]}", escapable=True)
    if flag in policy.flag_allow:
        return None
    if re.search(policy.flag_name_deny, flag):
        return Verdict(f"{flag} names a file, directory, config, loader or endpoint: {CONFIG_WHY}",
                       escapable=True)
    return None


__all__ = ["MACHINE_ENV", "MANAGED_ENV", "PLACEMENT_ENV", "POLICIES", "Policy", "Verdict",
           "env_value_problem", "env_verdict", "flag_verdict", "option_like", "policy_for"]
