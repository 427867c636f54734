"""A reply's calls as one section of special tokens (``Envelope.sectioned``: Kimi K2, DeepSeek V3.1)::

    [text] CALLS_OPEN (CALL_START NAME_OPEN NAME NAME_CLOSE ARGS CALL_END)+ CALLS_CLOSE

Kimi K2: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>
{…}<|tool_call_end|>…<|tool_calls_section_end|>`` (the id ``functions.NAME:IDX``, the envelope's
``id_format``); DeepSeek V3.1: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}
<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>``. The text is the decoded reply with its special tokens.

``section_step`` is one step of ``StreamingToolCallParser`` (server/chat/toolcalls.py) for such an
envelope: text before the section is content; each call is emitted once its ``CALL_END`` is there
and its arguments parse (the first ``CALL_END`` after which they do: a string may hold the text of
one); a section that goes wrong (no call start where one must be, arguments that never parse before
the next marker) leaves its text in the content, nothing dropped or altered; a section still open
when the reply ends is the parser's ``unfinished`` (a call cut by ``max_tokens``).
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

from server.chat.call_bodies import BodyParser, ParsedCall
from server.families.envelope import Envelope

Events = list[Any]  # toolcalls.py's ContentDelta / CallDelta


class StreamingToolCallParser(Protocol):
    """What of toolcalls.py's parser a section step reads and writes."""

    envelope: Envelope
    body: BodyParser
    _buf: str
    _in_call: bool
    _section_calls: int
    _name_re: re.Pattern[str]

    def _emit_content(self, text: str, events: Events) -> None: ...

    def _add(self, call: ParsedCall | None, raw: str, events: Events) -> None: ...


def name_pattern(parser: Any) -> re.Pattern[str]:
    """NAME then name_close (group 1 the name, group 2 the id the model wrote, if any)."""
    env = parser.envelope
    if env.call_id is not None and "{call_id}" in env.name_close:
        before, after = env.name_close.split("{call_id}")
        close = re.escape(before) + f"({env.call_id})" + re.escape(after)
    else:
        close = re.escape(env.name_close) + "()"
    return re.compile(r"([^\n]*?)" + close)


def section_step(p: StreamingToolCallParser, events: Events) -> bool:
    env = p.envelope
    if not p._in_call:
        at = p._buf.find(env.calls_open)
        if at < 0:
            keep = _partial(p._buf, env.calls_open)
            p._emit_content(p._buf[: len(p._buf) - keep], events)
            p._buf = p._buf[len(p._buf) - keep :]
            return False
        p._emit_content(p._buf[:at], events)
        p._buf, p._in_call, p._section_calls = p._buf[at + len(env.calls_open) :], True, 0
        return True
    buf = p._buf
    if buf.startswith(env.calls_close):
        p._buf, p._in_call = buf[len(env.calls_close) :], False
        return True
    head = env.call_start + env.name_open
    if not buf.startswith(head):
        if any(m.startswith(buf) for m in (head, env.calls_close)):
            return False  # not written yet
        return _leave(p, events)
    m = p._name_re.match(buf, len(head))
    if m is None:
        return _leave(p, events) if _any_marker(buf[len(head) :], p) else False
    name, written = m.group(1), m.group(2)
    end = buf.find(env.call_end, m.end())
    while end >= 0:
        call = _call(p, name, buf[m.end() : end], written)
        if call is not None:
            p._buf = buf[end + len(env.call_end) :]
            p._section_calls += 1
            p._add(call, buf[: end + len(env.call_end)], events)
            return True
        end = buf.find(env.call_end, end + 1)
    after = buf[m.end() :]
    if env.calls_close in after or env.call_start in after:  # the next marker came: never a call
        return _leave(p, events)
    return False  # not complete yet (or never: finish() keeps it)


def _call(p: StreamingToolCallParser, name: str, args: str, written: str) -> ParsedCall | None:
    try:
        json.loads(args)
    except json.JSONDecodeError:
        return None
    call_id = p.envelope.call_id_of(name, written) if written else None
    return p.body.name_and_json(name, args, call_id)


def _any_marker(text: str, p: StreamingToolCallParser) -> bool:
    env = p.envelope
    return any(t in text for t in (env.call_end, env.calls_close, env.call_start))


def _leave(p: StreamingToolCallParser, events: Events) -> bool:
    """A section that went wrong: its text (the opening too, if no call came out of it) is content."""
    opened = p.envelope.calls_open if p._section_calls == 0 else ""
    p._emit_content(opened + p._buf, events)
    p._buf, p._in_call = "", False
    return False


def _partial(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
