"""What changed between two requests' structure (fingerprints), and where it sits in the prompt.

Each change is a candidate cause with the character region of the current prompt it
occupies (the glue before a part belongs to it: a role header that changed is that
message's change). The diagnosis picks the change whose region holds the first differing
character; a structural difference elsewhere (e.g. a tool-call id the template does not
render) explains nothing and is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from server.cache_diag.fingerprint import Fingerprint, SegmentMark

NAMESPACE_SETTINGS = ("cache_namespace",)  # a change here misses even with identical tokens


@dataclass(frozen=True)
class Change:
    type: str  # system_changed | tools_changed | messages_changed
    start: int  # region in the current prompt's characters, end exclusive
    end: int
    detail: dict[str, Any] = field(default_factory=dict)


def _regions(fp: Fingerprint, text_len: int) -> dict[str, tuple[int, int]]:
    """key -> (region start, region end): from the end of the previous segment to the end of this one."""
    out: dict[str, tuple[int, int]] = {}
    prev_end = 0
    for seg in sorted(fp.segments, key=lambda s: s.char_start):
        if seg.key and seg.key not in out:
            out[seg.key] = (prev_end, seg.char_end)
        prev_end = seg.char_end
    out["<end>"] = (prev_end, max(text_len, prev_end) + 1)
    return out


def _segment(fp: Fingerprint, key: str) -> SegmentMark | None:
    return next((s for s in fp.segments if s.key == key), None)


def tools_change(prev: Fingerprint, cur: Fingerprint) -> dict[str, Any] | None:
    if prev.tools == cur.tools:
        return None
    pn = [n for n, _ in prev.tools]
    cn = [n for n, _ in cur.tools]
    removed = [n for n in pn if n not in cn]
    added = [n for n in cn if n not in pn]
    if removed or added:
        kind = "replaced" if removed and added else ("removed" if removed else "added")
        return {"change": kind, "removed": removed, "added": added, "tool": (removed or added)[0]}
    if pn != cn:
        first = next(c for p, c in zip(pn, cn, strict=True) if p != c)
        return {"change": "reordered", "tool": first, "order_before": pn, "order_now": cn}
    edited = [n for (n, a), (_, b) in zip(prev.tools, cur.tools, strict=True) if a != b]
    return {"change": "edited", "tool": edited[0], "edited": edited}


def _strip_system(msgs: tuple[tuple[str, bytes], ...]) -> tuple[int, tuple[tuple[str, bytes], ...]]:
    if msgs and msgs[0][0] in ("system", "developer"):
        return 1, msgs[1:]
    return 0, msgs


def messages_change(prev: Fingerprint, cur: Fingerprint) -> dict[str, Any] | None:
    """The first message after the system message that differs: edited, removed or inserted.

    None when the current request only appends. ``message`` is its index in the current
    request (for messages removed at the end: where they were).
    """
    op, p = _strip_system(prev.messages)
    oc, c = _strip_system(cur.messages)
    k = next((i for i in range(min(len(p), len(c))) if p[i] != c[i]), None)
    if k is None:
        if len(c) >= len(p):
            return None
        return {"message": len(c) + oc, "change": "removed", "count": len(p) - len(c), "role": p[len(c)][0]}
    at = k + oc
    edited = {"message": at, "change": "edited", "role": c[k][0], "role_before": p[k][0]}
    m = min(len(p) - k - 1, len(c) - k - 1)
    if m >= 1 and p[k + 1 : k + 1 + m] == c[k + 1 : k + 1 + m]:
        return edited  # the messages after it are where they were
    hp, hc = _Windows(p), _Windows(c)  # O(1) window compares: the loops below stay linear
    for r in range(1, len(p) - k + 1):  # messages k .. k+r-1 of the previous request removed?
        m = min(len(p) - k - r, len(c) - k)
        if m >= 1 and hp.equal(k + r, hc, k, m):
            return {"message": at, "change": "removed", "count": r, "role": p[k][0]}
    for r in range(1, len(c) - k + 1):  # messages inserted before the previous message k?
        m = min(len(c) - k - r, len(p) - k)
        if m >= 1 and hc.equal(k + r, hp, k, m):
            return {"message": at, "change": "inserted", "count": r, "role": c[k][0]}
    return edited


class _Windows:
    """Prefix hashes of a message list: two windows compare in O(1) (a hash match is confirmed
    exactly, so the answer never depends on a collision). Was a slice compare per shift, O(n²)
    in the message count."""

    MOD = (1 << 61) - 1
    BASE = 1_000_003

    def __init__(self, seq: tuple[tuple[str, bytes], ...]) -> None:
        self.seq = seq
        self.h = [0]
        self.pw = [1]
        for item in seq:
            self.h.append((self.h[-1] * self.BASE + (hash(item) & self.MOD)) % self.MOD)
            self.pw.append(self.pw[-1] * self.BASE % self.MOD)

    def _window(self, i: int, m: int) -> int:
        return (self.h[i + m] - self.h[i] * self.pw[m]) % self.MOD

    def equal(self, i: int, other: _Windows, j: int, m: int) -> bool:
        if self._window(i, m) != other._window(j, m):
            return False
        return self.seq[i : i + m] == other.seq[j : j + m]


def structural_changes(prev: Fingerprint, cur: Fingerprint, cur_len: int) -> list[Change]:
    """Every structural difference, each with its region in the current prompt."""
    regions = _regions(cur, cur_len)
    old_regions = _regions(prev, cur_len)
    out: list[Change] = []

    def region(key: str) -> tuple[int, int]:
        return regions.get(key) or old_regions.get(key) or regions["<end>"]

    if prev.system != cur.system:
        s, e = region("system")
        seg = _segment(cur, "system")
        out.append(Change("system_changed", s, e, {"segment_start": seg.char_start if seg else s}))
    tools = tools_change(prev, cur)
    if tools is not None:
        s, e = region("tools")
        out.append(Change("tools_changed", s, e, tools))
    msgs = messages_change(prev, cur)
    if msgs is not None:
        key = f"message:{msgs['message']}"
        s, e = regions.get(key) or regions["<end>"]
        seg = _segment(cur, key)
        msgs["segment_start"] = seg.char_start if seg else s
        out.append(Change("messages_changed", s, e, msgs))
    return out


def changed_settings(prev: Fingerprint, cur: Fingerprint) -> list[str]:
    a, b = dict(prev.settings), dict(cur.settings)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def key_order_change(prev: Fingerprint, cur: Fingerprint) -> dict[str, Any] | None:
    """The first tool or message whose content is the same but whose JSON keys the client sent
    in another order (the prompt renders them as sent), else None."""
    n_tools = len(cur.tools)
    if len(prev.tools) != n_tools:
        return None
    for i, (a, b) in enumerate(zip(prev.key_order, cur.key_order, strict=False)):  # the common part
        if a == b:
            continue
        if i < n_tools:
            return {"change": "key_order", "tool": cur.tools[i][0]}
        return {"change": "key_order", "message": i - n_tools, "role": cur.messages[i - n_tools][0]}
    return None
