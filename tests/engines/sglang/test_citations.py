"""The citation registries and the `path:line` text of docs and code (cptest/engines/sglang/citations.py).

Every SGLang range a doc or module cites is a registry entry; the check against the real wheel is
tests/test_sources_cli.py."""

from __future__ import annotations

import re

import pytest

from cptest.engines.sglang import citations
from cptest.engines.sglang.citations import Citation, Reference, cites, parse, references

REGISTRIES = [citations.load(r) for r in citations.RELEASES]


def test_every_range_the_docs_and_code_cite_is_registered():
    missing = citations.unregistered(citations.scan(), REGISTRIES)
    assert not missing, "cited but not in any citations_<release>.toml: " + ", ".join(
        f"{r.source} {r.path}:{r.start}-{r.end}" for r in missing)


@pytest.mark.parametrize("registry", REGISTRIES, ids=lambda r: r.release)
def test_every_registered_range_is_cited_somewhere(registry: citations.Registry):
    """An entry nothing cites checks nothing a reader meets: it goes with the text that cited it."""
    refs = citations.scan()
    assert [c.where for c in registry.citations if not citations.cited_by(c, refs)] == []


def test_the_scan_reads_the_docs_the_scenarios_the_code_and_its_tests_but_not_made_up_inputs():
    sources = {r.source.split(":")[0] for r in citations.scan()}
    assert {"docs/sglang.md", "docs/target-plan.md", "docs/support-matrix.md",
            "cptest/engines/sglang/rules_0_5_17.py", "cptest/engines/sglang/releases.py",
            "scenarios/baselines/README.md", "scenarios/rules/dcp_disables_prefill_graph.cps",
            "tests/sglang_src/driver.py", "tools/device/README.md"} <= sources
    assert not sources & set(citations.NOT_CITING)


@pytest.mark.parametrize("registry", REGISTRIES, ids=lambda r: r.release)
def test_keys_are_unique_and_every_entry_is_well_formed(registry: citations.Registry):
    keys = [c.key for c in registry.citations]
    assert len(keys) == len(set(keys))
    assert all(c.start <= c.end and c.anchor.strip() for c in registry.citations)
    assert registry.wheel.requirement == f"sglang=={registry.release}"
    assert len(registry.wheel.sha256) == 64 and registry.wheel.filename.endswith(".whl")


def test_the_pinned_0_5_17_wheel_is_the_gpu_machines_cp312_build():
    pin = citations.load("0.5.17").wheel
    assert pin.filename == "sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl"
    assert pin.sha256 == "fb4cba478a5dca5ee146550b39f33add1c4e475d21ee11810b86ed1c58068093"


def test_a_range_list_a_wrapped_line_and_a_prefixed_path_are_each_read():
    text = ("see `triton_backend.py:182-187, 1228-1240` and `arg_groups/overrides.py:\n  1374-1396`;\n"
            "`sglang/srt/models/llama.py:158` and cptest's own `cptest/cli.py:12`; 3 ranks.py: 2 x")
    got = [(r.path, r.start, r.end, r.source) for r in references(text, "d.md")]
    assert got == [("triton_backend.py", 182, 187, "d.md:1"), ("triton_backend.py", 1228, 1240, "d.md:1"),
                   ("arg_groups/overrides.py", 1374, 1396, "d.md:1"),
                   ("sglang/srt/models/llama.py", 158, 158, "d.md:3"), ("ranks.py", 2, 2, "d.md:3")]


def test_a_reference_names_a_citation_by_a_path_suffix_and_the_exact_range():
    c = Citation("k", "0.5.17", "layers/attention/triton_backend.py", 182, 187, "dcp_size")
    assert cites(Reference("triton_backend.py", 182, 187, "x:1"), c)
    assert cites(Reference("sglang/srt/layers/attention/triton_backend.py", 182, 187, "x:1"), c)
    assert not cites(Reference("triton_backend.py", 182, 188, "x:1"), c)
    assert not cites(Reference("lora/backend/triton_backend.py", 182, 187, "x:1"), c)
    assert not cites(Reference("on_backend.py", 182, 187, "x:1"), c)


def test_a_malformed_entry_is_refused_with_its_key():
    head = '[wheel]\nrequirement = "sglang==9"\nfile = "w.whl"\nsha256 = "0"\n'
    with pytest.raises(ValueError, match="'bad'"):
        parse(head + '[citations.bad]\nfile = "a.py"\nlines = "9-3"\nanchor = "x"\n', "9")
    with pytest.raises(ValueError, match="'empty'"):
        parse(head + '[citations.empty]\nfile = "a.py"\nlines = "3"\nanchor = " "\n', "9")


def test_an_unknown_release_names_the_known_ones():
    with pytest.raises(KeyError, match="0.5.17, 0.5.23"):
        citations.load("0.5.71")


def test_the_sglang_note_cites_no_bare_line_number_a_check_could_not_tie_to_a_file():
    text = (citations.ROOT / "docs" / "sglang.md").read_text(encoding="utf-8")
    bare = re.findall(r"`:?\d+(?:-\d+)?(?:, ?\d+(?:-\d+)?)*`", text)
    assert bare == [], "name the file: `path.py:LINES`"


@pytest.mark.parametrize("release", citations.RELEASES)
def test_every_flag_of_the_table_is_a_declaration_anchored_by_its_field_or_its_literal(release: str):
    from cptest.engines.sglang.releases import get_release
    from cptest.engines.sglang.sources import Source, check

    declared = {c.key: c for c in citations.flag_declarations(release)}
    table = {name for name, e in get_release(release).flags.items() if e.get("source")}
    assert {k.removeprefix("flag:") for k in declared} <= table
    dcp = declared["flag:--dcp-size"]
    assert dcp.anchor == "dcp_size: A[" and '"--dcp-size"' in dcp.also
    # Either way of declaring a flag holds the citation; a line with only the flag's dest does not.
    ok_field = Source("t", lambda _n: "\n" * (dcp.start - 1) + "    dcp_size: A[\n")
    ok_literal = Source("t", lambda _n: "\n" * (dcp.start - 1) + '    "--dcp-size",\n')
    prose = Source("t", lambda _n: "\n" * (dcp.start - 1) + "    # dcp_size is the degree\n")
    assert check([dcp], ok_field) == [] and check([dcp], ok_literal) == []
    assert [f.status for f in check([dcp], prose)] == ["not_found"]


def test_the_flag_extractor_puts_a_field_below_a_blank_line_on_the_fields_own_line():
    import importlib.util

    spec = importlib.util.spec_from_file_location("extract", citations.ROOT / "tools/extract_sglang_flags.py")
    assert spec and spec.loader
    extract = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extract)
    text = "class A:\n    x: A[int] = 0\n\n    dcp_size: A[\n        int,\n    ] = 1\n"
    assert extract.locate({"server_args.py": text}, "dcp_size", ["--dcp-size"]) == "server_args.py:4"
