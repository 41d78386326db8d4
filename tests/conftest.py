"""Session-wide test setup."""

from __future__ import annotations

import os
import tempfile


def pytest_configure(config: object) -> None:
    # Every `cptest run` a test starts (in process or as a child) keeps and reuses baselines in a
    # cache that lives as long as this session, never in the user's ~/.cache: a test must not be
    # answered from a baseline that an earlier session or another checkout stored.
    os.environ["CPTEST_BASELINE_CACHE"] = tempfile.mkdtemp(prefix="cptest-baselines-")
