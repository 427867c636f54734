"""A prompt's fingerprint: hashes and boundaries only, never text.

What a cache-miss diagnosis needs from an earlier prompt, and nothing it could be read from:

* the model and the settings that change the prompt or the cache namespace (name -> digest);
* the request's structure: a digest of the system message, of every tool definition (by
  name, in order) and of every message (with its role), as the client sent them;
* the token stream, as keyed hashes: a chained 64-bit hash per block of ``BLOCK`` tokens
  (finds the first block that differs) and a 16-bit mark per token, mixed with its
  block's chain hash (finds the token inside that block; a false match is 1 in 65,536);
* the labelled segments as token ranges (which part of the prompt a token belongs to).

Hashes are keyed with a secret drawn at start (per process), so a fingerprint names
nothing outside this process. The session table keeps the full previous prompt as well
(its text gives the snippet in the report); the per-response store keeps fingerprints only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from array import array
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from server.families.rendered import RenderedPrompt

BLOCK = 16  # tokens per chained block hash
_KEY = os.urandom(16)
_K = [np.uint64(int.from_bytes(_KEY[i : i + 8]) | 1) for i in (0, 4, 8)]  # keyed odd multipliers
_MESSAGE_LABEL = re.compile(r"message (\d+)\b")


def digest(value: Any, ordered: bool = False) -> bytes:
    """A keyed 8-byte digest of a JSON-able value (fixed separators; keys sorted unless ``ordered``)."""
    raw = json.dumps(value, sort_keys=not ordered, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.blake2b(raw.encode(), digest_size=8, key=_KEY).digest()


def _parsed_arguments(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """The message with its tool-call arguments parsed (JSON text -> value), so that the same
    arguments with other whitespace digest alike and a key reorder shows as a key-order change."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = []
    for call in calls:
        fn = dict(call.get("function") or {})
        try:
            fn["arguments"] = json.loads(fn.get("arguments") or "{}")
        except (TypeError, ValueError):
            pass
        out.append({**call, "function": fn})
    return {**message, "tool_calls": out}


@dataclass(frozen=True)
class SegmentMark:
    key: str  # "system" | "tools" | "message:N" | "prompt" | "" (unknown)
    label: str
    char_start: int  # in the prompt it belongs to (a character count, not text)
    char_end: int
    tok_start: int
    tok_end: int


@dataclass(frozen=True)
class Fingerprint:
    model: str
    settings: tuple[tuple[str, str], ...]  # (name, value digest), sorted by name
    system: bytes | None  # digest of messages[0] when it is a system/developer message
    tools: tuple[tuple[str, bytes], ...]  # (name, digest of the definition), in request order
    messages: tuple[tuple[str, bytes], ...]  # (role, digest), every message in request order
    n_tokens: int
    core_tokens: int  # tokens up to the end of the last labelled segment (no generation prompt)
    blocks: array[int]  # 'Q': chained hash of each full block of BLOCK tokens
    marks: array[int]  # 'H': per-token mark
    segments: tuple[SegmentMark, ...]
    structured: bool = True  # False for raw completions prompts (no messages / tools)
    # digests with the JSON keys in the order the client sent them (tools, then messages): the
    # prompt keeps the client's key order, so a reorder is a change the digests above do not see
    key_order: tuple[bytes, ...] = ()
    notes: tuple[str, ...] = ()  # what the renderer noticed (e.g. "template_rewrote_history")

    def setting(self, name: str) -> str | None:
        return dict(self.settings).get(name)

    def segment_at_token(self, tok: int) -> SegmentMark | None:
        for seg in self.segments:
            if seg.tok_start <= tok < seg.tok_end:
                return seg
        return None


def segment_key(label: str) -> str:
    if "tools" in label:
        return "tools"
    m = _MESSAGE_LABEL.search(label)
    if m:
        return f"message:{m.group(1)}"
    if "system" in label:
        return "system"
    if label == "prompt":
        return "prompt"
    return ""


def token_hashes(ids: Sequence[int]) -> tuple[array[int], array[int]]:
    """(chained block hashes, per-token marks) of a token stream.

    A token's mark is a keyed 64-bit mix of its id, xor-ed with its block's parent chain hash
    times an odd per-position factor, cut to 16 bits (vectorized).
    """
    n = len(ids)
    blocks = array("Q")
    parents = [int.from_bytes(hashlib.blake2b(b"", digest_size=8, key=_KEY).digest())]
    raw = array("q", ids).tobytes()
    width = BLOCK * 8
    for b in range(n // BLOCK):
        chunk = parents[-1].to_bytes(8) + raw[b * width : (b + 1) * width]
        h = int.from_bytes(hashlib.blake2b(chunk, digest_size=8, key=_KEY).digest())
        blocks.append(h)
        parents.append(h)
    with np.errstate(over="ignore"):
        t = np.asarray(ids, dtype=np.int64).astype(np.uint64)
        t = (t + _K[0]) * _K[1]
        t ^= t >> np.uint64(29)
        t *= _K[2]
        pos = np.arange(n, dtype=np.uint64)
        mix = np.asarray(parents, dtype=np.uint64)[(pos // np.uint64(BLOCK)).astype(np.int64)]
        mix *= (pos % np.uint64(BLOCK)) * np.uint64(2) + np.uint64(1)
        marks = ((t ^ mix) >> np.uint64(48)).astype(np.uint16)
    return blocks, array("H", marks.tobytes())


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    step = 256
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def hashed_common_prefix(a: Fingerprint, b: Fingerprint) -> int:
    """Tokens the two prompts share at the start, from their hashes alone."""
    same_blocks = common_prefix(a.blocks, b.blocks)
    start = same_blocks * BLOCK
    n = min(a.n_tokens, b.n_tokens)
    i = start
    while i < n and a.marks[i] == b.marks[i]:
        i += 1
    return i


def _tok_index(offsets: Sequence[int], char: int) -> int:
    """Number of tokens that start before ``char``."""
    return bisect_left(offsets, char)


def fingerprint(
    *,
    model: str,
    settings: Mapping[str, Any],
    ids: Sequence[int],
    offsets: Sequence[int],
    rendered: RenderedPrompt,
    messages: Sequence[Mapping[str, Any]] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> Fingerprint:
    """The fingerprint of one prompt. ``messages``/``tools`` as the client sent them (None: raw prompt)."""
    msgs = list(messages or [])
    system = None
    if msgs and msgs[0].get("role") in ("system", "developer"):
        system = digest(msgs[0].get("content"))
    tool_fp = tuple((str((t.get("function") or {}).get("name", "")), digest(t)) for t in tools or [])
    parsed = [_parsed_arguments(m) for m in msgs]
    msg_fp = tuple((str(m.get("role", "")), digest(m)) for m in parsed)
    ordered = tuple(digest(v, ordered=True) for v in [*(tools or []), *parsed])
    segs = []
    for s in rendered.segments:
        segs.append(
            SegmentMark(
                segment_key(s.label),
                s.label,
                s.start,
                s.end,
                _tok_index(offsets, s.start),
                max(_tok_index(offsets, s.end), _tok_index(offsets, s.start) + 1),
            )
        )
    core = max((s.tok_end for s in segs), default=len(ids))
    blocks, marks = token_hashes(ids)
    return Fingerprint(
        model=model,
        settings=tuple(sorted((k, digest(v).hex()) for k, v in settings.items())),
        system=system,
        tools=tool_fp,
        messages=msg_fp,
        n_tokens=len(ids),
        core_tokens=min(core, len(ids)),
        blocks=blocks,
        marks=marks,
        segments=tuple(segs),
        structured=messages is not None,
        notes=tuple(getattr(rendered, "notes", ())),
        key_order=ordered,
    )
