"""A custom tool's input as the envelope writes it: JSON string escapes, or raw XML up to the end marker.

``scan`` decodes the bytes a token writes (after the bytes held back from the last one) into the
input bytes llguidance sees, what is held at the end, and where the input closed.
"""

from __future__ import annotations

import json

# canonical JSON string escapes (json.dumps, ensure_ascii=False): escape text -> the byte it stands for
ESCAPES: dict[bytes, bytes] = {
    json.dumps(chr(c), ensure_ascii=False)[1:-1].encode(): bytes([c]) for c in [*range(0x20), 0x22, 0x5C]
}
ESCAPE_PREFIXES = frozenset(e[:k] for e in ESCAPES for k in range(1, len(e)))
XML_END = b"\n</parameter>\n"
XML_END = b"\n</parameter>\n"

Scan = tuple[bytes, bytes, int]  # (input bytes, bytes held at the end, bytes used up to the close or -1)


def scan(encoding: str, pending: bytes, data: bytes) -> Scan | None:
    """Decode ``data`` written in the input's encoding after the held bytes ``pending`` (pure).

    None: not a valid encoding (a raw control byte or a non-canonical escape in JSON).
    """
    buf = pending + data
    if encoding == "xml":
        at = buf.find(XML_END)
        if at >= 0:
            return buf[:at], b"", at + len(XML_END) - len(pending)
        keep = _held(buf)
        return buf[: len(buf) - keep], buf[len(buf) - keep :], -1
    raw, i = bytearray(), 0
    while i < len(buf):
        c = buf[i]
        if c == 0x5C:  # backslash: a canonical escape
            for esc, byte in ESCAPES.items():
                if buf.startswith(esc, i):
                    raw += byte
                    i += len(esc)
                    break
            else:
                return (bytes(raw), buf[i:], -1) if buf[i:] in ESCAPE_PREFIXES else None
        elif c == 0x22:  # the closing quote
            return bytes(raw), b"", i + 1 - len(pending)
        elif c < 0x20:
            return None
        else:
            raw.append(c)
            i += 1
    return bytes(raw), b"", -1


def _held(buf: bytes) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of the XML end marker."""
    for k in range(min(len(buf), len(XML_END) - 1), 0, -1):
        if XML_END.startswith(buf[-k:]):
            return k
    return 0
