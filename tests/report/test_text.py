"""Untrusted text in report.md and junit.xml (cptest/report/text.py), judged by real parsers: the
markdown rendered by markdown-it (CommonMark with GitHub's tables, raw HTML allowed as GitHub and
most viewers allow it), the XML parsed by xml.etree. Hypothesis feeds hostile strings: markdown
and HTML syntax, `]]>`, line breaks of every kind, control characters."""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from cptest.report import render, render_junit
from cptest.report.text import md_block, md_inline, xml_text
from cptest.verdict import Verdict, scenario_verdict

MD = MarkdownIt("commonmark").enable(["table", "strikethrough"])
PIECES = [
    "a", "b c", " ", "  ", "\t", "_", "*", "`", "```", "~~", "[", "]", "(", ")", "<", ">", "&", "|", "!",
    "#", "\\", "-", "+", "=", ":", ".", "1", "1. ", "- ", "# ", "> ", "    ", "---", "===", "| x |", "|---|",
    "<script>alert(1)</script>", "<!--", "<b>", "]]>", "&amp;", "&#x3c;", "![i](http://t/x.png)",
    "[l](javascript:alert(1))", "<http://x>", "_em_", "**b**", "~~s~~", "dcp2_llama", "\n", "\r", "\r\n",
    "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\x00", "\x1b[31m", "\x7f", "é_é",
]  # fmt: skip
hostile = st.lists(st.sampled_from(PIECES), max_size=30).map("".join)


class Parsed(HTMLParser):
    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def visible(s: str) -> str:
    """What the reader must see of `s`: its lines (every break Python knows), each control character
    in them as `\\xNN` text; whitespace aside."""
    return " ".join(re.sub(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]", lambda m: f"\\x{ord(m.group()):02x}", line)
                    for line in s.splitlines())


def words(s: str) -> list[str]:
    return s.split()


@settings(max_examples=400, deadline=None)
@given(hostile)
def test_a_cell_is_one_cell_of_one_row_and_shows_its_text(s: str) -> None:
    page = MD.render(f"| a | b |\n|---|---|\n| x | {md_inline(s)} |\n")
    p = Parsed(page)
    assert p.tags == ["table", "thead", "tr", "th", "th", "tbody", "tr", "td", "td"], page
    cell = page.split("<td>")[2].split("</td>")[0]
    assert words(html.unescape(cell)) == words(visible(s)), page


@settings(max_examples=400, deadline=None)
@given(hostile)
def test_a_paragraph_opens_no_block_and_no_markup_and_shows_its_text(s: str) -> None:
    page = MD.render(f"before\n\n{md_block(s)}\n\nafter\n")
    p = Parsed(page)
    expected = ["p", "p", "p"] if words(visible(s)) else ["p", "p"]
    assert p.tags == expected, page
    assert words("".join(p.text)) == ["before", *words(visible(s)), "after"], page


@settings(max_examples=300, deadline=None)
@given(hostile | st.text(), hostile | st.text())
def test_junit_parses_and_carries_the_text_as_written(reason: str, name: str) -> None:
    verdicts = [Verdict(checker="log", status="fail", reason=reason, figures={"line": reason}),
                Verdict(checker=name, status="unknown", reason=name)]
    root = ET.fromstring(render_junit(scenario_verdict(name, name, name, verdicts)).encode())
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == 2
    failure = cases[0].find("failure")
    assert failure is not None and failure.get("message") == xml_text(reason)
    assert json.loads(failure.text or "") == {"line": reason}
    assert root.find("testsuite").get("name") == xml_text(name)  # type: ignore[union-attr]
    assert cases[1].get("name") == f"2-{xml_text(name)}"


def test_xml_text_shows_what_xml_forbids_and_keeps_the_rest() -> None:
    assert xml_text("a\x00b\x1bc\ud800d\ufffe\te\nf\rg]]>") == "a\\x00b\\x1bc\\ud800d\\ufffe\te\nf\rg]]>"
    junit = render_junit(scenario_verdict("s", "sglang", "0.5.17", [
        Verdict(checker="log", status="fail", reason="x]]><![CDATA[<script>\ud800")]))  # fmt: skip
    assert "]]>" not in junit and "<script>" not in junit
    failure = ET.fromstring(junit.encode()).find("./testsuite/testcase/failure")
    assert failure is not None and failure.get("message") == "x]]><![CDATA[<script>\\ud800"


def test_report_md_keeps_its_table_with_hostile_reasons_and_names() -> None:
    reason = "Traceback | a | b |`code` <script>alert(1)</script>\r# heading\x0b| fake | row |\n- item ]]>"
    verdicts = [Verdict(checker="log", status="fail", reason=reason, source="x|y.cps:1:1"),
                Verdict(checker="launch", status="pass", reason="ok")]
    md = render(scenario_verdict("s</h1><script>", "evil`engine", "0.5|17", verdicts))
    page = MD.render(md)
    p = Parsed(page)
    assert "script" not in p.tags and p.tags.count("h1") == 1 and "h2" in p.tags
    # Two tables: the summary (an empty header, engine, status) and the verdicts (a header, two
    # rows of four cells): a pipe, line break or fence in the text added no row and no cell.
    assert (p.tags.count("table"), p.tags.count("tr"), p.tags.count("td")) == (2, 3 + 3, 2 * 2 + 2 * 4)
    assert "<script>alert(1)</script>" in "".join(p.text)
