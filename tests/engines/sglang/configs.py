"""Test helpers: SGLang launch and admission configs from flat keywords, as the tests write them."""

from __future__ import annotations

from typing import Any

from cptest.engines.sglang.admission import LaunchConfig
from cptest.engines.sglang.argv import ServeConfig
from cptest.topology import Degrees


def _degrees(kw: dict[str, Any], **defaults: Any) -> Degrees:
    """Pop the degrees' keywords out of `kw` (`nnodes` is `nodes`, as SGLang spells it)."""
    if "nnodes" in kw:
        kw["nodes"] = kw.pop("nnodes")
    return Degrees(**{**defaults, **{k: kw.pop(k) for k in list(kw) if k in Degrees.model_fields}})


def launch(**kw: Any) -> LaunchConfig:
    """A LaunchConfig: the degrees among the keywords go into its `Degrees`, the rest are facts."""
    return LaunchConfig(degrees=_degrees(kw), **kw)


def serve_config(model_path: str, **kw: Any) -> ServeConfig:
    """A ServeConfig: the degrees among the keywords (tp 1 unless given) go into its `Degrees`."""
    return ServeConfig(model_path, degrees=_degrees(kw, tp=1), **kw)
