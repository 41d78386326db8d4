"""Specifications of cptest/run/environment.py: the machine facts every manifest carries."""

from __future__ import annotations

from pathlib import Path

from cptest.run.environment import collect_environment


def test_collect_environment_gives_null_with_a_reason_for_absent_facts(tmp_path: Path) -> None:
    env = collect_environment(repo_root=tmp_path)
    assert env["cptest"] and env["python"]
    assert env["flake_lock_sha256"] is None and "no flake.lock" in env["reasons"]["flake_lock_sha256"]
    for key in ("torch", "cuda", "gpus", "driver", "sglang"):
        assert env[key] is not None or key in env["reasons"]
