"""plan: Scenario -> Plan, pure and deterministic, and the checks made before spending GPU time.

`plan(scenario)` (`build.py`) decides everything a run needs; `model.py` is the Plan's type (what
`plan.json` holds); `workload.py` turns the workload's distributions into concrete token ids;
`lint.py` compares what a scenario expects with what its pinned SGLang release is known to do.
"""

from cptest.plan.build import canonical_sha256, plan
from cptest.plan.model import Plan

__all__ = ["Plan", "canonical_sha256", "plan"]
