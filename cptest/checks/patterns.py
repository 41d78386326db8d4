"""Log-line patterns the checkers read, as data (style.md rule 5).

These are the fallback table for SGLang 0.5.17, kept in `checks/` until the per-release tables of
`cptest.engines.sglang.releases` carry them; `log_patterns(release)` prefers those when the module
exists and has an entry for the release. Sources: shared/reference/sglang-cp.md §4.3, checked
against the 0.5.17 wheel:

- `kv_allocated`: `mem_cache/memory_pool.py:1655-1681` (`_finalize_allocation_log`); a label may
  prefix "KV Cache"; MHA prints "K size/V size", MLA "KV size". Printed by every rank, physical rows.
- `max_total_num_tokens`: `managers/scheduler.py:1067-1076`, TP rank 0 only, logical capacity.
- `dcp_enabled`: `distributed/parallel_state.py:2354`.
- Log prefix `[<time> DP<d> ATTN_CP<c> MOE_DP<m> TP<r>]`, parts only when their size > 1
  (`managers/scheduler.py:4846-4859`); no DCP rank in it (dcp_rank = tp_rank % dcp).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

PATTERNS_0_5_17: dict[str, str] = {
    "kv_allocated": r"^\[[^\]]*?(?:\bTP(?P<tp>\d+))?\]\s.*?KV Cache is allocated\. dtype: (?P<dtype>\S+), "
    r"#tokens: (?P<tokens>\d+)",
    "max_total_num_tokens": r"^\[[^\]]*?(?:\bTP(?P<tp>\d+))?\]\s.*?max_total_num_tokens=(?P<tokens>\d+),",
    "dcp_enabled": r"DCP enabled, dcp_size=(?P<dcp>\d+), tp_size=(?P<tp_size>\d+)",
}

FALLBACK: dict[str, dict[str, str]] = {"0.5.17": PATTERNS_0_5_17}


def log_patterns(release: str) -> tuple[dict[str, str], str]:
    """Patterns for `release` and where they came from ("engines.sglang.releases" or "checks")."""
    try:
        mod: Any = importlib.import_module("cptest.engines.sglang.releases")
    except ImportError:
        mod = None
    table = _from_releases(mod, release) if mod is not None else None
    if table:
        return {**PATTERNS_0_5_17, **table}, "engines.sglang.releases"
    return FALLBACK.get(release, PATTERNS_0_5_17), "checks"


def _from_releases(mod: Any, release: str) -> dict[str, str] | None:
    """Best effort over the shapes the releases module may take: a `log_patterns(release)` function,
    or a `RELEASES` mapping whose entry has `log_patterns` (as a key or attribute)."""
    fn = getattr(mod, "log_patterns", None)
    if callable(fn):
        try:
            got = fn(release)
        except Exception:
            got = None
        if isinstance(got, dict):
            return _only_ours(got)
    releases = getattr(mod, "RELEASES", None)
    if isinstance(releases, dict) and release in releases:
        entry = releases[release]
        got = entry.get("log_patterns") if isinstance(entry, dict) else getattr(entry, "log_patterns", None)
        if isinstance(got, dict):
            return _only_ours(got)
    return None


def _only_ours(table: dict) -> dict[str, str]:
    out = {}
    for k in PATTERNS_0_5_17:
        v = table.get(k)
        pattern = getattr(v, "pattern", v)
        if isinstance(pattern, str):
            out[k] = pattern
    return out


def find_all(pattern: str, text: str) -> list[dict[str, Any]]:
    """Every match of `pattern` over the lines of `text`: named groups plus the matched line."""
    rx = re.compile(pattern, re.MULTILINE)
    out = []
    for m in rx.finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        end = text.find("\n", m.end())
        out.append(
            {**{k: v for k, v in m.groupdict().items()}, "line": text[start : end if end >= 0 else len(text)]}
        )
    return out
