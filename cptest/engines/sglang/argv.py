"""Build the argv of `python3 -m sglang.launch_server` for one release. Pure; argv only, never a shell.

Every flag emitted is checked against the release's extracted flag table (`flags-<release>.json`),
so a flag the release lacks is a `PlanError` here, not a launch failure on a GPU machine. Flags
whose spelling differs by release come from `Release.spellings`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cptest.engines.sglang.flag_values import value_problem
from cptest.engines.sglang.releases import Release
from cptest.engines.sglang.safety import option_like
from cptest.errors import PlanError, Problem, did_you_mean, one_of
from cptest.topology import Degrees

LAUNCHER = ("python3", "-m", "sglang.launch_server")


@dataclass(frozen=True)
class ServeConfig:
    """One server's launch settings. None means "SGLang's default": the flag is not emitted."""

    model_path: str
    degrees: Degrees = Degrees(tp=1)
    """Parallel degrees; `degrees.nodes` is `--nnodes`."""
    host: str = "127.0.0.1"
    port: int = 30000
    node_rank: int = 0
    dist_init_addr: str | None = None
    attention_backend: str | None = None
    cuda_graph: Mapping[str, str] = field(default_factory=dict)
    """Phase ("decode", "prefill") -> backend (e.g. "full", "breakable", "disabled")."""
    eager: bool = False
    """Disable CUDA graphs in every phase (hooks do not fire on graph replay; docs/sglang.md §7)."""
    page_size: int | None = None
    max_total_tokens: int | None = None
    mem_fraction_static: float | None = None
    context_length: int | None = None
    sampling_backend: str | None = None
    skip_tokenizer_init: bool = True
    """cptest sends token ids and reads token ids; the tokenizer is not part of what is qualified."""
    random_seed: int | None = None
    enable_metrics: bool = False
    forward_hooks: tuple[Mapping[str, Any], ...] = ()
    """`--forward-hooks` specs: {"name", "target_modules", "hook_factory", "config"}."""
    extra: tuple[tuple[str, str | tuple[str, ...] | None], ...] = ()
    """Pass-through flags (flag, value, or a tuple of values, or None for a switch), checked against
    the release's table: a switch takes none, a value flag one, a list flag (`nargs` + or *) any
    number; a value the flag cannot take is an error, never dropped."""


# Flags build_argv manages itself: a pass-through must not set them behind the topology's back.
MANAGED_DESTS = frozenset(
    {
        "model_path", "host", "port", "tp_size", "dcp_size", "attn_cp_size", "dp_size", "attn_dp_size",
        "enable_dp_attention", "pp_size", "enable_prefill_cp", "cp_strategy", "nnodes", "node_rank",
        "dist_init_addr", "forward_hooks",
    }
)  # fmt: skip


def build_argv(release: Release, cfg: ServeConfig) -> list[str]:
    """argv for `cfg` under `release`. Raises `PlanError` listing every bad flag or value at once."""
    out: list[str] = list(LAUNCHER)
    problems: list[str] = []

    def emit(flag: str, value: Any = None) -> None:
        entry = release.flags.get(flag)
        if entry is None:
            problems.append(f"SGLang {release.name} has no flag {flag}")
            return
        if value is None:
            out.append(flag)
            return
        text = value if isinstance(value, str) else str(value)
        if entry["choices"] is not None and text not in [str(c) for c in entry["choices"]]:
            problems.append(f"{flag} {text}: expected {one_of(str(c) for c in entry['choices'])}")
            return
        out.extend([flag, text])

    def spelled(concept: str, n: Any) -> None:
        parts = release.spellings[concept]
        i = 0
        while i < len(parts):
            flag = parts[i]
            if i + 1 < len(parts) and parts[i + 1] == "{n}":
                emit(flag, n)
                i += 2
            else:
                emit(flag)
                i += 1

    d = cfg.degrees
    emit("--model-path", cfg.model_path)
    emit("--host", cfg.host)
    emit("--port", cfg.port)
    emit("--tp-size", d.tp)
    if d.pp != 1:
        emit("--pp-size", d.pp)
    if d.dcp != 1:
        spelled("dcp", d.dcp)
    if d.attn_cp != 1:
        spelled("attn_cp", d.attn_cp)
    if d.prefill_cp:
        spelled("prefill_cp", None)
    if d.cp_strategy is not None:
        spelled("cp_strategy", d.cp_strategy)
    if d.attn_dp != 1:
        spelled("attn_dp", d.attn_dp)
    if d.nodes != 1:
        emit("--nnodes", d.nodes)
        emit("--node-rank", cfg.node_rank)
        if cfg.dist_init_addr is None:
            problems.append("nnodes > 1 needs dist_init_addr (host:port of node 0)")
        else:
            emit("--dist-init-addr", cfg.dist_init_addr)
    if cfg.attention_backend is not None:
        emit("--attention-backend", cfg.attention_backend)
    phases = dict(cfg.cuda_graph)
    if cfg.eager:
        phases = {phase: "disabled" for phase in release.graph_phases}
    for phase, backend in sorted(phases.items()):
        flag = release.graph_phases.get(phase)
        if flag is None:
            problems.append(f"unknown CUDA-graph phase {phase!r}: expected {one_of(release.graph_phases)}")
            continue
        emit(flag, backend)
    for flag, value in (
        ("--page-size", cfg.page_size),
        ("--max-total-tokens", cfg.max_total_tokens),
        ("--mem-fraction-static", cfg.mem_fraction_static),
        ("--context-length", cfg.context_length),
        ("--sampling-backend", cfg.sampling_backend),
        ("--random-seed", cfg.random_seed),
    ):
        if value is not None:
            emit(flag, value)
    if cfg.skip_tokenizer_init:
        emit("--skip-tokenizer-init")
    if cfg.enable_metrics:
        emit("--enable-metrics")
    if cfg.forward_hooks:
        emit("--forward-hooks", json.dumps([dict(h) for h in cfg.forward_hooks], separators=(",", ":")))
    for flag, value in cfg.extra:
        values = value if isinstance(value, tuple) else (() if value is None else (value,))
        if not _passthrough_ok(release, flag, values, problems):
            continue
        if release.flags[flag]["arity"] == "list":
            out.extend([flag, *values])
        else:
            emit(flag, values[0] if values else None)
    if problems:
        raise PlanError([Problem(None, m) for m in dict.fromkeys(problems)])
    return out


@dataclass(frozen=True)
class FlagProblem:
    """What is wrong with one pass-through flag, and which part of its statement to point at."""

    part: int
    """0: the flag itself (unknown, managed, too few values); k: its k-th value."""
    message: str


def passthrough_problems(release: Release, flag: str, values: tuple[str, ...]) -> list[FlagProblem]:
    """What is wrong with passing `flag values...` through to `release`: an unknown flag, a flag
    cptest manages, a value SGLang's parser would read as an option, a count of values the flag
    cannot take, a value not of the flag's type or choices. Empty when nothing is. Validate, lint and
    plan report these at the part of the `flag` statement they name."""
    entry = release.flags.get(flag)
    if entry is None:
        guess = did_you_mean(flag, release.flags)
        hint = f"; did you mean {guess}?" if guess else ""
        return [FlagProblem(0, f"{flag}: SGLang {release.name} has no such flag{hint}")]
    if entry["dest"] in MANAGED_DESTS:
        return [FlagProblem(0, f"{flag}: cptest sets it from the scenario's topology/serve block")]
    smuggled = [FlagProblem(k, f"{flag}: the value {v!r} would be read as an option, not as a value "
                               "(give each flag its own flag statement)")
                for k, v in enumerate(values, 1) if option_like(v)]
    if smuggled:
        return smuggled
    arity, n = entry["arity"], len(values)
    if arity == "flag" and n:
        found = ", ".join(map(repr, values))
        return [FlagProblem(1, f"{flag}: is a switch and takes no value (found {found})")]
    if arity == "value" and n != 1:
        return [FlagProblem(2, f"{flag}: takes exactly one value (found {n})") if n
                else FlagProblem(0, f"{flag}: takes a value")]
    if arity == "optional" and n > 1:
        return [FlagProblem(2, f"{flag}: takes at most one value (found {n})")]
    if arity == "list" and entry["nargs"] == "+" and not n:
        return [FlagProblem(0, f"{flag}: takes one or more values")]
    return [FlagProblem(k, m) for k, v in enumerate(values, 1) if (m := value_problem(flag, entry, v))]


def _passthrough_ok(release: Release, flag: str, values: tuple[str, ...], problems: list[str]) -> bool:
    """False (with the problems added) when `passthrough_problems` finds any."""
    found = passthrough_problems(release, flag, values)
    problems.extend(p.message for p in found)
    return not found
