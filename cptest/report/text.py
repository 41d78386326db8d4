"""Untrusted text made safe for report.md and junit.xml (report.html relies on jinja's autoescape).

Everything a report prints from an archive is untrusted: a reason quotes an engine log line or a
request's error, names come from plan.json and verdict.json, which anyone can edit. Rendered
markdown must keep its table and show such text as text (no HTML, no link, no emphasis, no new
block); XML must stay well-formed and mean what it says.

Markdown (CommonMark with GitHub's tables): every ASCII punctuation character may be escaped with a
backslash, and an escaped one is literal. `md_inline` escapes those that open inline syntax anywhere
(`\\`, backtick, `*`, `_` where it could open emphasis, `~`, `[`, `]`, `<`, `>`, `&`, `|`, `!`,
`#`)
and turns every line break into a space, for a table cell or a heading. `md_block` keeps the lines
of a paragraph, escapes the same and, per line, whatever would start a block there (`#`, `+`, `-`,
`=`, `:`, a list number's `.` or `)`, leading spaces that would make code). Line breaks are every
character `str.splitlines` knows, a superset of CommonMark's (`\\n`, `\\r`); other control characters
become `\\xNN` text, so a terminal printing report.md is not driven by them either.

XML 1.0 allows no control character but tab, newline and carriage return, and no surrogate or
U+FFFE/U+FFFF: `xml_text` writes them as `\\xNN`/`\\uNNNN` text instead (a parser would reject the
file). Escaping `<`, `&`, `>` and quotes is jinja's autoescape; `>` is always `&gt;`, so `]]>`
never appears in content. `xml_attr` also writes tab, newline and carriage return as character
references, which attribute-value normalisation would otherwise turn into spaces.
"""

from __future__ import annotations

import re

from markupsafe import Markup, escape

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
"""C0 and C1 controls (and DEL) but tab, newline, carriage return: shown as `\\xNN` in markdown."""
_MD_INLINE = re.compile(r"[\\`*~\[\]<>&|!#]")
_MD_LINE_START = re.compile(r"^(\d{1,9})([.)])|^([#+\-=:])")
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _visible(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _escape_underscores(text: str) -> str:
    # An `_` between two letters or digits can neither open nor close emphasis (CommonMark's
    # flanking rules): `dcp2_llama` stays readable; any other `_` is escaped.
    out = []
    for i, ch in enumerate(text):
        if ch == "_" and not (0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()):
            out.append("\\_")
        else:
            out.append(ch)
    return "".join(out)


def _md_line(line: str) -> str:
    line = _CONTROL.sub(lambda m: _visible(m.group()), line)
    line = _MD_INLINE.sub(lambda m: "\\" + m.group(), line)
    return _escape_underscores(line)


def _escape_start(m: re.Match[str]) -> str:
    # `1.` / `1)` would open an ordered list, `#`, `+`, `-`, `=`, `:` a heading, list, break or table.
    return f"{m.group(1)}\\{m.group(2)}" if m.group(1) else "\\" + m.group(3)


def md_inline(value: object) -> str:
    """`value` as text for one markdown table cell or heading: one line, nothing interpreted."""
    return " ".join(_md_line(part.replace("\t", " ")) for part in str(value).splitlines()).strip()


def md_block(value: object) -> str:
    """`value` as a markdown paragraph: its lines kept, each shown as text, none starting a block
    (a heading, list, quote, table, fence, setext underline or indented code)."""
    lines = []
    for part in str(value).splitlines():
        # Leading spaces would make indented code, trailing ones a hard break (`<br>`).
        line = _md_line(part.replace("\t", " ").strip(" "))
        lines.append(_MD_LINE_START.sub(_escape_start, line))
    # Blank lines dropped: the text stays one paragraph, so nothing after one can open a block.
    return "\n".join(line for line in lines if line.strip())


def plain_text(value: object) -> str:
    """`value` for a terminal: control characters but tab and newline shown as `\\xNN` text, so that
    an engine's log line quoted in a reason cannot move the cursor, recolour or retitle it."""
    return _CONTROL.sub(lambda m: _visible(m.group()), str(value).replace("\r", "\\r"))


def xml_text(value: object) -> str:
    """`value` with every character XML 1.0 forbids written as `\\xNN`/`\\uNNNN` text (escaping of
    markup is autoescape's)."""
    return _XML_INVALID.sub(lambda m: _visible(m.group()), str(value))


def xml_attr(value: object) -> Markup:
    """`value` escaped for an attribute in double quotes, its tabs and line breaks kept as
    character references."""
    escaped = str(escape(xml_text(value)))
    return Markup(escaped.replace("\t", "&#9;").replace("\n", "&#10;").replace("\r", "&#13;"))
