"""`cptest.paths`: the named roots that keep a machine's directories out of what cptest writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from cptest import paths


def test_portable_names_each_root_by_its_token_longest_first() -> None:
    roots = {"<checkout>": "/work/main", "<archive>": "/work/main/results/s/run", "~": "/root"}
    text = 'see /work/main/results/s/run/logs/x.log, code at /work/main/cptest/x.py, "/root/.triton"'
    got = paths.portable(text, roots)
    assert got == 'see <archive>/logs/x.log, code at <checkout>/cptest/x.py, "~/.triton"'



def test_a_root_matches_only_whole_path_components() -> None:
    roots = {"<checkout>": "/work/main"}
    got = paths.portable("/work/mainline/x /work/main2 /work/main", roots)
    assert got == "/work/mainline/x /work/main2 <checkout>"


def test_portable_value_rewrites_strings_inside_json_values() -> None:
    roots = {"<models>": "/m"}
    value = {"a": ["/m/llama-1", 3, None], "b": {"c": "/mx"}}
    assert paths.portable_value(value, roots) == {"a": ["<models>/llama-1", 3, None], "b": {"c": "/mx"}}


def test_materialize_replaces_a_leading_token_and_names_a_missing_root() -> None:
    roots = {"<models>": Path("/store"), "<scenario>": "/s"}
    assert paths.materialize("<models>/llama-1", roots) == "/store/llama-1"
    assert paths.materialize("<scenario>", roots) == "/s"
    assert paths.materialize("org/name", roots) == "org/name"  # a hub id: not a token
    assert paths.materialize("x/<models>/y", roots) == "x/<models>/y"  # only a leading token
    with pytest.raises(KeyError, match="<models>"):
        paths.materialize("<models>/x", {})


def test_rooted_sets_the_run_roots_for_the_block_only(tmp_path: Path) -> None:
    outside = paths.portable(str(tmp_path / "a"))
    with paths.rooted({paths.ARCHIVE: tmp_path}):
        assert paths.portable(str(tmp_path / "a")) == "<archive>/a"
        assert paths.portable(str(Path.home() / ".cache")) == "~/.cache"
    assert paths.portable(str(tmp_path / "a")) == outside
