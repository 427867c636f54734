"""``ReasoningSplitter``: a reply split into reasoning + answer, the same whole or streamed.

Streamed in any chunks, the reasoning deltas and answer deltas add up to what the whole reply
gives (stream equals non-stream); the reasoning is what Qwen3's template reads back from the
content (``Reasoning.split``), so a client sending it back renders the turn as written. Property
tests are derandomized (tests/conftest.py).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.chat.generate import reasoning_tokens
from server.chat.reasoning_reply import ReasoningSplitter, choose_reasoning
from server.constrain.plan import ReasoningPlan
from server.errors import InvalidRequest
from server.families.family import load_family

R = load_family("hermes:qwen3_thinking").reasoning
assert R is not None
PLAN = ReasoningPlan(R.open, R.close)
PIECES = ["<think>", "</think>", "\n", "\n\n", "a", "b c", "<tool_call>", "</", "think", ">", "<", "</think"]


def split(chunks: list[str]) -> tuple[str | None, str, str]:
    s = ReasoningSplitter(PLAN)
    thought, answer = "", ""
    for c in chunks:
        t, a = s.feed(c)
        thought, answer = thought + t, answer + a
    t, a = s.finish()
    return s.reasoning, thought + t, answer + a


@given(st.lists(st.sampled_from(PIECES), max_size=14), st.lists(st.integers(0, 40), max_size=6))
def test_streamed_equals_whole(pieces: list[str], cuts: list[int]) -> None:
    text = "".join(pieces)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    whole = split([text])
    assert split(chunks) == whole
    reasoning, said, _ = whole
    assert (reasoning or "") == said


@given(st.text(alphabet="ab \n<>/", max_size=20), st.text(alphabet="ab \n<>", max_size=20))
def test_matches_the_template_split(thought: str, content: str) -> None:
    text = R.open + thought + R.close + content
    if R.close_tag in thought:
        return
    reasoning, _, answer = split([text])
    want_reasoning, want_content = R.split(text)
    assert (reasoning or "") == want_reasoning and answer == want_content


def test_a_reply_cut_while_thinking_is_all_reasoning() -> None:
    assert split(["<think>\nstill thinking\n"]) == ("still thinking", "still thinking", "")


def test_text_without_the_open_tag_is_reasoning_until_the_close() -> None:
    # a template that opens the reasoning in the prompt (the reply starts inside it)
    assert split(["hmm\n</think>\n\nok"]) == ("hmm", "hmm", "ok")


def test_effort_and_budget() -> None:
    assert choose_reasoning(R, None, None).plan == ReasoningPlan(R.open, R.close, None)
    assert choose_reasoning(R, "low", None).plan == ReasoningPlan(R.open, R.close, R.efforts["low"])
    assert choose_reasoning(R, "low", 7).plan == ReasoningPlan(R.open, R.close, 7)  # the extension wins
    off = choose_reasoning(R, "none", None)
    assert off.plan is None and off.lead == R.disabled
    assert choose_reasoning(None, "high", 5).plan is None  # a family that does not reason
    with pytest.raises(InvalidRequest, match="effort"):
        choose_reasoning(R, "extreme", None)


class _Bytes:
    """Token id -> its bytes (``LogprobText.bytes_of``'s interface) over a made-up vocabulary."""

    def __init__(self, tokens: list[bytes]) -> None:
        self.tokens = tokens

    def bytes_of(self, token_id: int) -> bytes:
        return self.tokens[token_id]


@given(st.lists(st.sampled_from(PIECES), max_size=14))
def test_reasoning_tokens_end_with_the_token_that_completes_the_close(pieces: list[str]) -> None:
    """usage's reasoning_tokens: the tokens up to the one whose bytes complete ``</think>``
    (a tag split over tokens included); every token when the reasoning never closed."""
    ids = list(range(len(pieces)))
    n = reasoning_tokens(ids, R.close_tag, _Bytes([p.encode() for p in pieces]))  # type: ignore[arg-type]
    assert 0 <= n <= len(pieces)
    closed = [i for i in range(1, len(pieces) + 1) if R.close_tag in "".join(pieces[:i])]
    assert n == (closed[0] if closed else len(pieces))


def test_reasoning_tokens_finds_a_tag_inside_a_long_token() -> None:
    long = ("x" * 100 + "</think>" + "y" * 100).encode()
    assert reasoning_tokens([0, 1, 2], R.close_tag, _Bytes([b"a", long, b"b"])) == 2  # type: ignore[arg-type]


def test_reasoning_tokens_find_a_long_tag_spread_over_several_tokens() -> None:
    """Harmony's close ``<|end|><|start|>assistant`` (25 bytes) is written as four tokens: the
    bytes kept between tokens must be the whole tag less one, not a slice that shrinks."""
    pieces = [
        b"<|channel|>",
        b"analysis",
        b"<|message|>",
        b"h",
        b"mm",
        b"<|end|>",
        b"<|start|>",
        b"ass",
        b"istant",
    ]
    tokens = _Bytes([*pieces, b"<|channel|>", b"comment", b"ary"])
    assert reasoning_tokens(list(range(12)), "<|end|><|start|>assistant", tokens) == len(pieces)  # type: ignore[arg-type]
