"""What a schema's regular expressions cost to compile, counted before anything compiles.

A grammar compiler expands every bounded repetition: ``[a-z0-9]{1,64}(\\.[a-z0-9]{1,64}){0,16}``
(132 bytes of schema) is 1,104 character positions and took 10 s and 7 MB in xgrammar on
the embedded vocabulary; an 18.5 KiB schema of such patterns took 22 s and ~400 MB. The cost
of a pattern is the positions it expands to: each atom (a character, an escape, a class) is 1,
a group is the sum of what it holds (alternatives added), a bounded quantifier ``{m,n}``
multiplies what it follows by ``n`` (``{m,}`` by ``m + 1``), ``*`` / ``+`` / ``?`` by 1 (a loop
costs no more states). ``schema_pattern_cost`` adds every ``pattern`` and
``patternProperties`` key of a schema; chat refuses one past ``limits.max_schema_pattern_cost``
(a 400 naming it) in O(schema), before rendering.
"""

from __future__ import annotations

import re
from typing import Any

_QUANT = re.compile(r"\{(\d*)(,?)(\d*)\}")
_CAP = 10**12  # counts stop growing here (a cost is only ever compared with a limit)


def pattern_cost(pattern: str) -> int:
    """Character positions ``pattern`` expands to (an upper estimate; see the module doc)."""
    stack: list[list[int]] = [[]]  # per open group: the costs of its atoms so far
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            stack[-1].append(1)
            i += 2
            continue
        if c == "[":
            j = i + 1
            if j < n and pattern[j] == "^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            stack[-1].append(1)
            i = j + 1
            continue
        if c == "(":
            stack.append([])
        elif c == ")" and len(stack) > 1:
            inner = stack.pop()
            stack[-1].append(min(_CAP, max(1, sum(inner))))
        elif c == "{":
            m = _QUANT.match(pattern, i)
            if m and (m.group(1) or m.group(3)):
                low = int(m.group(1) or 0)
                times = int(m.group(3)) if m.group(3) else (low + 1 if m.group(2) else low)
                if stack[-1]:
                    stack[-1][-1] = min(_CAP, stack[-1][-1] * max(1, times))
                i = m.end()
                continue
            stack[-1].append(1)
        elif c not in "|^$*+?":
            stack[-1].append(1)
        i += 1
    return min(_CAP, sum(sum(level) for level in stack))


def schema_pattern_cost(schema: Any, depth: int = 0) -> int:
    """The summed ``pattern_cost`` of every ``pattern`` / ``patternProperties`` key in ``schema``."""
    if depth > 64:
        return 0
    total = 0
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "pattern" and isinstance(value, str):
                total += pattern_cost(value)
            elif key == "patternProperties" and isinstance(value, dict):
                total += sum(pattern_cost(k) for k in value if isinstance(k, str))
                total += sum(schema_pattern_cost(v, depth + 1) for v in value.values())
            else:
                total += schema_pattern_cost(value, depth + 1)
    elif isinstance(schema, list):
        total += sum(schema_pattern_cost(v, depth + 1) for v in schema)
    return min(_CAP, total)
