"""What a scenario may put into an engine's environment and argv: per-release allow/deny tables.

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

The tables live here, in the language stage, because `cptest validate` must refuse these entries
with their position and the language stage sits below the engines (docs/architecture.md §2); the
engines read them from here (`cptest.engines.sglang.argv` refuses an unsafe flag a plan was not
allowed). `tests/lang/test_safety.py` checks every table entry against the release's flag table.
Pure data and pure functions: no clock, no files.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

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


@dataclass(frozen=True)
class Policy:
    """One release's table. Patterns are `fnmatch` patterns over names (case-sensitive)."""

    env_allow: tuple[str, ...]
    """Variables a scenario may set (prefix patterns); anything else is unsafe."""
    env_deny: Mapping[str, str]
    """Pattern -> why, checked first: unsafe even where `env_allow` matches."""
    flag_deny: Mapping[str, str]
    """Flag -> why it is unsafe (loads code or config, reads or writes files outside the archive)."""
    flag_name_deny: str
    """A regex over flag names: a flag of the release whose name says it takes a file, directory,
    config, loader, plugin, module or endpoint is unsafe unless `flag_allow` lists it."""
    flag_allow: frozenset[str] = field(default_factory=frozenset)
    """Flags whose names match `flag_name_deny` but that name no file and load nothing."""


_CODE = "loads code into the engine"
_CONFIG = "makes the engine read a file or config cptest does not archive"
_WRITES = "makes the engine write outside the run's archive"
_NET = "makes the engine fetch from or talk to another host"

POLICY_0_5_17 = Policy(
    env_allow=(
        "SGLANG_*", "SGL_*", "NCCL_*", "TORCH_*", "PYTORCH_*", "CUDA_*", "CUBLAS_*", "CUBLASLT_*",
        "CUDNN_*", "TRITON_*", "NVSHMEM_*", "NVTE_*", "FLASHINFER_*", "GLOO_*", "OMP_NUM_THREADS",
        "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
    ),
    env_deny={
        # Names that point at files or load libraries: a path is a way to run code or read config.
        "*PLUGIN*": "names a library or module the engine loads (NCCL_NET_PLUGIN, NCCL_TUNER_PLUGIN, ...)",
        "*HOOK*": "names code the engine runs",
        "*MODULE*": "names a module the engine imports",
        "*_PATH": "points the engine at files (code, libraries or config)",
        "*_PATHS": "points the engine at files (code, libraries or config)",
        "*_DIR": "points the engine at a directory of files it loads or writes (caches hold compiled code)",
        "*_FILE": "points the engine at a file it reads or writes",
        "*_HOME": "points the engine at an installation it loads code from",
        "*_CONFIG*": "points the engine at a config",
        "*_LIB*": "names libraries the engine loads",
        "*_SO": "names a shared object the engine loads",
        "*SYS_PATH*": "adds to the engine's import path",
        # Names that import code by name.
        "*PACKAGE*": f"names a package the engine imports ({_CODE}: SGLANG_EXTERNAL_MODEL_PACKAGE)",
        "*_MANAGER": f"names a class the engine imports ({_CODE}: TRITON_CACHE_MANAGER=module:Class)",
        "*REMOTE_CACHE*": f"names a cache backend class the engine imports and a host it talks to ({_CODE})",
        "*CACHE_BACKEND*": f"names a cache backend the engine imports ({_CODE})",
        "*_CLASS": f"names a class the engine imports ({_CODE})",
        "*_CLS": f"names a class the engine imports ({_CODE})",
        "*_CMD": "names a command the engine runs",
        "*_COMMAND": "names a command the engine runs",
        # Files the engine writes or compiles into.
        "*_OUT": f"names a file the engine writes ({_WRITES}: TORCH_LOGS_OUT)",
        "*WORKSPACE_BASE": f"names a directory the engine writes and loads compiled kernels from ({_WRITES})",
        # Deserialisation: a full pickle runs code when it is loaded.
        "*WEIGHTS_ONLY*": "changes how torch.load unpickles checkpoints "
                          "(TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD lets a checkpoint's pickle run code)",
        "*PICKLE*": "makes the engine unpickle what it receives (a pickle runs code when it is loaded)",
        "*TRUST_REMOTE*": f"{_CODE}: Python files shipped with the model",
        # Other hosts.
        "*_URL": _NET,
        "*_URI": _NET,
        "*_ENDPOINT": _NET,
    },
    flag_deny={
        # Code (the pinned release's server_args.py: each is a documented loader of user code).
        "--config": f"{_CONFIG}: a YAML file of further server arguments (server_args.py:8255)",
        "--trust-remote-code": f"{_CODE}: Python files shipped with the model (server_args.py, "
                               "arg_groups/arg_utils.py:25)",
        "--enable-custom-logit-processor": f"{_CODE}: serialized logit processors from requests "
                                           "(server_args.py:3343)",
        "--custom-weight-loader": f"{_CODE}: imports the named functions (server_args.py:3087)",
        "--forward-hooks": f"{_CODE}: imports the named hook factories (cptest sets its own)",
        "--trace-modules": f"{_CODE}: imports the named modules",
        "--model-config-parser": f"{_CODE}: selects a config parser by name",
        "--load-format": f"{_CODE}: selects a weight loader (remote, private loaders)",
        "--json-model-override-args": f"{_CONFIG}: overrides the model's config.json",
        "--tokenizer-path": f"{_CONFIG}: a tokenizer outside the pinned model (may carry code)",
        "--delete-ckpt-after-loading": "deletes the checkpoint the run pins",
        "--enable-trace": f"{_NET}: exports traces",
    },
    flag_name_deny=r"(path|file|dir|folder|config|loader|plugin|hook|module|remote|endpoint|url|ssl"
                   r"|-ip$|-host$|-addr$|export)",
    flag_allow=frozenset({
        # Names that match the pattern but take no file and load nothing.
        "--disable-custom-all-reduce", "--mamba-max-states-per-path", "--weight-loader-disable-mmap",
        "--weight-loader-drop-cache-after-load", "--weight-loader-prefetch-checkpoints",
        "--weight-loader-prefetch-num-threads", "--fastapi-root-path", "--media-url-max-file-size-mb",
        "--lora-strict-loading",
    }),
)  # fmt: skip

POLICY_0_5_23 = replace(
    POLICY_0_5_17,
    flag_deny={
        **POLICY_0_5_17.flag_deny,
        "--trust-request-chat-template": f"{_CODE}: Jinja templates from requests",
        "--startup-weight-load-mode": f"{_CODE}: selects a weight loader",
        "--enable-response-store": _WRITES,
    },
)

POLICIES: Mapping[tuple[str, str], Policy] = {
    ("sglang", "0.5.17"): POLICY_0_5_17,
    ("sglang", "0.5.23"): POLICY_0_5_23,
    # The CPU reference engine is cptest's own Python: the same environment rules; it takes no flags.
    ("reference", "builtin"): POLICY_0_5_23,
}
LATEST = POLICY_0_5_23
"""An engine or release without a table (the plan rejects unknown releases) gets the newest one."""


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
        return f"{name}={value!r} names a module or class the engine would import ({_CODE})"
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


# argparse's own test (`_negative_number_matcher`): a value that starts with "-" and is not one of
# these is read as an option by SGLang's parser, whatever flag it follows.
_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")


def option_like(value: str) -> bool:
    """True when SGLang's parser would read `value` as an option rather than as a flag's value:
    `flag "--cuda-graph-bs" "1" "--trust-remote-code"` would set `--trust-remote-code` behind every
    table here. Needs no release table, so the language stage refuses it in every scenario."""
    return value.startswith("-") and value != "-" and not _NEGATIVE_NUMBER.fullmatch(value)


def flag_verdict(policy: Policy, flag: str) -> Verdict | None:
    """None when the scenario may pass `flag` through; else why not (always escapable: the plan's
    flag table refuses flags cptest manages itself)."""
    if flag in policy.flag_deny:
        return Verdict(f"{flag} {policy.flag_deny[flag]}", escapable=True)
    if flag in policy.flag_allow:
        return None
    if re.search(policy.flag_name_deny, flag):
        return Verdict(f"{flag} names a file, directory, config, loader or endpoint: {_CONFIG}",
                       escapable=True)
    return None


__all__ = ["MACHINE_ENV", "MANAGED_ENV", "PLACEMENT_ENV", "POLICIES", "Policy", "Verdict",
           "env_value_problem", "env_verdict", "flag_verdict", "option_like", "policy_for"]
