"""What a scenario may pass to SGLang, per release: the allow/deny tables `cptest.lang.safety` judges
a scenario's `serve { env ... }` and `serve { flag ... }` with, and how SGLang's parser tells an option
from a value.

Release knowledge, as data: each table is a `Release.safety` (`releases.py`), a later release's
`replace(PREVIOUS, ...changes)`. The judging (what the machine and cptest own, the order of the
checks, a value's shape) is the language stage's and is the same for every release; how the tables
are shaped, and why, is said in `cptest.lang.safety`. `tests/lang/test_safety.py` checks every table
entry against the release's flag table. Pure data and pure functions: no clock, no files.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace


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


# Why an entry is unsafe, in the words every refusal uses (`cptest.lang.safety` says them too).
CODE_WHY = "loads code into the engine"
CONFIG_WHY = "makes the engine read a file or config cptest does not archive"
WRITES_WHY = "makes the engine write outside the run's archive"
NET_WHY = "makes the engine fetch from or talk to another host"

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
        "*PACKAGE*": f"names a package the engine imports ({CODE_WHY}: SGLANG_EXTERNAL_MODEL_PACKAGE)",
        "*_MANAGER": f"names a class the engine imports ({CODE_WHY}: TRITON_CACHE_MANAGER=module:Class)",
        "*REMOTE_CACHE*": "names a cache backend class the engine imports and a host it talks to "
                          f"({CODE_WHY})",
        "*CACHE_BACKEND*": f"names a cache backend the engine imports ({CODE_WHY})",
        "*_CLASS": f"names a class the engine imports ({CODE_WHY})",
        "*_CLS": f"names a class the engine imports ({CODE_WHY})",
        "*_CMD": "names a command the engine runs",
        "*_COMMAND": "names a command the engine runs",
        # Files the engine writes or compiles into.
        "*_OUT": f"names a file the engine writes ({WRITES_WHY}: TORCH_LOGS_OUT)",
        "*WORKSPACE_BASE": "names a directory the engine writes and loads compiled kernels from "
                           f"({WRITES_WHY})",
        # Deserialisation: a full pickle runs code when it is loaded.
        "*WEIGHTS_ONLY*": "changes how torch.load unpickles checkpoints "
                          "(TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD lets a checkpoint's pickle run code)",
        "*PICKLE*": "makes the engine unpickle what it receives (a pickle runs code when it is loaded)",
        "*TRUST_REMOTE*": f"{CODE_WHY}: Python files shipped with the model",
        # Other hosts.
        "*_URL": NET_WHY,
        "*_URI": NET_WHY,
        "*_ENDPOINT": NET_WHY,
    },
    flag_deny={
        # Code (server_args.py: each is a documented loader of user code).
        "--config": f"{CONFIG_WHY}: a YAML file of further server arguments (server_args.py:8255)",
        "--trust-remote-code": f"{CODE_WHY}: Python files shipped with the model (server_args.py, "
                               "arg_groups/arg_utils.py:25)",
        "--enable-custom-logit-processor": f"{CODE_WHY}: serialized logit processors from requests "
                                           "(server_args.py:3343)",
        "--custom-weight-loader": f"{CODE_WHY}: imports the named functions (server_args.py:3087)",
        "--forward-hooks": f"{CODE_WHY}: imports the named hook factories (cptest sets its own)",
        "--trace-modules": f"{CODE_WHY}: imports the named modules",
        "--model-config-parser": f"{CODE_WHY}: selects a config parser by name",
        "--load-format": f"{CODE_WHY}: selects a weight loader (remote, private loaders)",
        "--json-model-override-args": f"{CONFIG_WHY}: overrides the model's config.json",
        "--tokenizer-path": f"{CONFIG_WHY}: a tokenizer outside the pinned model (may carry code)",
        "--delete-ckpt-after-loading": "deletes the checkpoint the run pins",
        "--enable-trace": f"{NET_WHY}: exports traces",
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
        "--trust-request-chat-template": f"{CODE_WHY}: Jinja templates from requests",
        "--startup-weight-load-mode": f"{CODE_WHY}: selects a weight loader",
        "--enable-response-store": WRITES_WHY,
    },
)


# argparse's own test (`_negative_number_matcher`): a value that starts with "-" and is not one of
# these is read as an option by SGLang's parser, whatever flag it follows.
_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")


def option_like(value: str) -> bool:
    """True when SGLang's parser would read `value` as an option rather than as a flag's value:
    `flag "--cuda-graph-bs" "1" "--trust-remote-code"` would set `--trust-remote-code` behind every
    table here. Needs no release table, so the language stage refuses it in every scenario."""
    return value.startswith("-") and value != "-" and not _NEGATIVE_NUMBER.fullmatch(value)
