"""SGLang behind the engine protocol (`cptest.engines.protocol.Engine`): one object per release table."""

from __future__ import annotations

from dataclasses import dataclass

from cptest.contracts.base import EngineFacts
from cptest.engines.protocol import RENDEZVOUS_PORT_OFFSET, ColocatedLaunch, ServerLaunch, node_port
from cptest.engines.sglang.admission import Admission, launch_config, predict
from cptest.engines.sglang.argv import ServeConfig, build_argv
from cptest.engines.sglang.releases import COLOCATION_HOST_ID_VAR, COLOCATION_TRANSPORT, Release
from cptest.scenario import Scenario
from cptest.topology import Degrees

TITLE_PREFIX = "sglang::scheduler"
"""0.5.17 `managers/scheduler.py:4843-4859`: `sglang::scheduler[_DP<d>][_PP<p>][_ATTN_CP<c>][_TP<r>]`."""

CHECKED_LOG_LINES = {"kv_allocated": "kv_cache_allocated", "max_total_num_tokens": "max_total_num_tokens"}
"""The log surfaces the capacity contract compares (checker's name -> the release table's pattern)."""


def log_patterns(release: Release) -> dict[str, str]:
    """The capacity contract's log patterns of `release`: each line pattern behind the release's
    log-line prefix, whose `tp` group names the TP rank that printed it."""
    prefix = release.log_patterns["log_prefix"].regex
    out = {}
    for name, key in CHECKED_LOG_LINES.items():
        line = release.log_patterns.get(key)
        if line is not None and line.present:
            out[name] = f"{prefix}.*?{line.regex}"
    return out


@dataclass(frozen=True)
class SGLangEngine:
    table: Release
    name: str = "sglang"
    title_prefix: str = TITLE_PREFIX

    @property
    def release(self) -> str:
        return self.table.name

    @property
    def server_info_paths(self) -> tuple[str, ...]:
        return self.table.server_info_paths

    def facts(self) -> EngineFacts:
        return EngineFacts(
            release=self.table.name,
            log_patterns=log_patterns(self.table),
            sigterm_exit_statuses=self.table.sigterm_exit_statuses,
            rank_kill_exit_statuses=self.table.rank_kill_exit_statuses,
            kv_heads_rule=self.table.kv_heads_rule,
        )

    def admission(self, scenario: Scenario) -> Admission:
        return predict(self.table, launch_config(scenario))

    def unexpressible(self, degrees: Degrees) -> list[str]:
        return []  # every degree has a flag in every known release (`Release.spellings`)

    def colocated(self) -> ColocatedLaunch:
        return ColocatedLaunch(env=dict(self.table.colocation_env), host_id_var=COLOCATION_HOST_ID_VAR,
                               flags=self.table.colocation_flags, transport=COLOCATION_TRANSPORT,
                               takes_mem_fraction=True, follower_ranks_ended=self.table.follower_ranks_ended,
                               follower_ports_checked=self.table.follower_ports_checked)

    def argv(self, launch: ServerLaunch, node_rank: int, nodes: int) -> list[str]:
        serve = launch.serve
        declared = {"decode": serve.cuda_graph_decode, "prefill": serve.cuda_graph_prefill}
        # The placement's switches come first among the pass-through flags; the scenario's own copy
        # of one (`flag "--disable-custom-all-reduce"`) is then not repeated.
        passed = [f for f in serve.extra_flags if f[0] not in launch.extra_flags]
        cfg = ServeConfig(
            model_path=launch.model_path,
            degrees=launch.degrees,
            host=launch.host,
            port=node_port(launch.port, node_rank, launch.colocated),
            node_rank=node_rank,
            # Every node runs the same server with its own rank; node 0 hosts the rendezvous.
            dist_init_addr=f"{launch.host}:{launch.port + RENDEZVOUS_PORT_OFFSET}" if nodes > 1 else None,
            attention_backend=serve.attention_backend,
            cuda_graph={phase: mode for phase, mode in declared.items() if mode is not None},
            # Per-step evidence needs every phase eager: prefill graphs would hide extend steps too.
            eager=launch.eager,
            page_size=serve.page_size,
            max_total_tokens=serve.max_total_tokens,
            mem_fraction_static=launch.mem_fraction if launch.colocated else serve.mem_fraction,
            context_length=serve.context_length,
            sampling_backend=serve.sampling_backend,
            skip_tokenizer_init=serve.skip_tokenizer_init,
            forward_hooks=launch.forward_hooks,
            # Every value is passed on: build_argv refuses a count the flag cannot take.
            extra=tuple((flag, None) for flag in launch.extra_flags)
            + tuple((f[0], tuple(f[1:]) if len(f) > 2 else (f[1] if len(f) > 1 else None)) for f in passed),
        )
        return build_argv(self.table, cfg)
