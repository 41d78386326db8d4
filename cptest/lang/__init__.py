"""The scenario language: `.cps` text -> typed `Scenario` (parse), and canonical text (fmt).

Lark is used only inside this package.  Entry points: `parse_text`, `parse_file`, `format_text`.
"""

from cptest.lang.fmt import format_text
from cptest.lang.parse import parse_file, parse_text

__all__ = ["format_text", "parse_file", "parse_text"]
