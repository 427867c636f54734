"""A committable copy of an agent capture: the client's prose replaced by filler, structure kept.

    python benchmarks/agents/redact_capture.py ~/.cache/agentserve/captures/claude.jsonl \
        benchmarks/data/agent_captures/claude.jsonl

Claude Code's system prompt and tool descriptions are Anthropic's (not open source), so its capture
(``benchmarks/agents/agent_capture.py``) is not committed as is. This copy keeps everything ``bench agents``
measures: the requests in order, headers (any key-bearing header blanked), every field, block, tool
name and schema shape, ``cache_control``, tool calls and their results, and the billing-header line
(the hit-rate test); every prose string (``text``, ``description``, ``instructions``, string
``content``) becomes filler of the same length. Filler is a function of the original string, so a
string repeated across turns stays identical (the prefix cache sees the same prefix growth); its
token count is close to, not equal to, the original's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

PROSE_KEYS = ("text", "description", "instructions", "content")
KEY_HEADERS = ("authorization", "x-api-key", "cookie", "proxy-authorization")
KEEP_PREFIX = ("x-anthropic-billing-header",)  # the line the billing-hash arm edits
WORDS = (
    "the agent reads files edits code runs tests and reports what changed before it answers a user who "
    "asked for help with a small project kept in one folder under version control"
).split()


def filler(text: str) -> str:
    """Words drawn by a hash of ``text``, newlines where it had them, exactly ``len(text)`` characters."""
    out: list[str] = []
    size, counter = 0, 0
    while size < len(text):
        digest = hashlib.sha256(f"{counter}\x00{text}".encode()).digest()
        counter += 1
        for byte in digest:
            word = WORDS[byte % len(WORDS)]
            out.append(word)
            size += len(word) + 1
            if size >= len(text):
                break
    chars = list(" ".join(out).ljust(len(text))[: len(text)])
    for i, ch in enumerate(text):
        if ch == "\n":
            chars[i] = "\n"
    return "".join(chars)


def redact(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: redact(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if isinstance(value, str) and key in PROSE_KEYS and not value.startswith(KEEP_PREFIX):
        return filler(value)
    return value


def redact_row(row: dict[str, Any]) -> dict[str, Any]:
    headers = {k: ("REDACTED" if k.lower() in KEY_HEADERS else v) for k, v in row["headers"].items()}
    return {**row, "headers": headers, "body": redact(row["body"])}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("capture", type=Path)
    ap.add_argument("out", type=Path)
    a = ap.parse_args(argv)
    rows = [json.loads(line) for line in a.capture.read_text().splitlines() if line.strip()]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("".join(json.dumps(redact_row(r), ensure_ascii=False) + "\n" for r in rows))
    print(f"wrote {a.out} ({len(rows)} requests)", file=sys.stderr)


if __name__ == "__main__":
    main()
