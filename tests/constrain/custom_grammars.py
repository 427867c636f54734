"""Custom-tool grammars for the tests, with independent oracles (Python ``re`` / the ``lark`` package)."""

from __future__ import annotations

import re
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def apply_patch_lark() -> str:
    """Codex's apply_patch grammar as Codex sends it (the fixture's licence header stripped)."""
    lines = (FIXTURES / "apply_patch.lark").read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("//"))


# apply_patch is regular: the same language as a Python regex (the lark package cannot load the
# grammar itself: it refuses the zero-width terminal /(.*)/)
APPLY_PATCH_RE = re.compile(
    r"\*\*\* Begin Patch\n"
    r"(?:\*\*\* Add File: .+\n(?:\+.*\n)+"
    r"|\*\*\* Delete File: .+\n"
    r"|\*\*\* Update File: .+\n(?:\*\*\* Move to: .+\n)?"
    r"(?:(?:(?:@@|@@ .+)\n|[-+ ].*\n)+(?:\*\*\* End of File\n)?)?"
    r")+\*\*\* End Patch\n?"
)

# a small context-free grammar the lark package parses too (nested, recursive)
CALC_LARK = r"""
start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: NUMBER | "(" expr ")" | NAME "(" expr ")"
NUMBER: /[0-9]{1,3}/
NAME: /[a-z]{1,4}/
"""

# a regex with quotes, backslashes, newlines and non-ASCII in its language
TRICKY_REGEX = r'(?:[a-c"\\\n é]|\t|€){1,12}'


def apply_patch_ok(text: str) -> bool:
    return APPLY_PATCH_RE.fullmatch(text) is not None


def calc_ok(text: str) -> bool:
    import lark

    try:
        lark.Lark(CALC_LARK, start="start", parser="earley").parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


def tricky_ok(text: str) -> bool:
    return re.fullmatch(TRICKY_REGEX, text) is not None
