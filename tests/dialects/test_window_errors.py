"""Window overflow and max_tokens 400s in each client's own words (issue 36 items 3 and 10).

The patterns below are copied from the clients' bundles (``strings`` on the installed binaries), with
the version beside each; a text that stops matching one of them breaks what that client does next:
Claude Code compacts, lowers max_tokens and resends, opencode compacts, Codex stops the turn with
"context window exceeded".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.chat.window import fit_sampling, reply_floor
from server.config import load_settings
from server.dialects.messages.error_shape import anthropic_message, shape_error
from server.engines.base import SamplingParams
from server.errors import MaxTokensOverLimit, MaxTokensOverWindow, PromptTooLong
from server.protocol import ChatCompletionRequest, CompletionRequest

# Claude Code 2.1.332 (@anthropic-ai/claude-code, the bun binary)
CC_PROMPT_TOO_LONG = "prompt is too long"  # nyo(): a 400/413 containing it -> reactive compaction
# aPe(): the numbers (their gap: how much to drop)
CC_PROMPT_TOO_LONG_NUMBERS = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.I)
CC_FIRST_PARTY = re.compile(r"^prompt is too long: \d+ tokens > \d+ maximum$")  # t_[0]
# YGe(): resend with max_tokens = limit - input - 1000
CC_CONTEXT_LIMIT = re.compile(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)")
# YPs (lowerAfter): resend at N, matched whole
CC_MAX_TOKENS = re.compile(
    r"^max_tokens: \d+ > (\d+), which is the maximum allowed number of output tokens for .+$"
)
CC_GATEWAY = ("maximum context length", "context_length_exceeded", "reduce the length of the messages")  # _n
CC_FLOOR_OUTPUT_TOKENS = 3000  # Eto: the least max_tokens it resends with after CC_CONTEXT_LIMIT
# opencode 1.18.33 (opencode-linux-x64): b$, the context-overflow patterns (a match -> compaction)
OPENCODE_OVERFLOW = (
    re.compile(r"maximum context length is \d+ tokens", re.I),
    re.compile(r"reduce the length of the messages", re.I),
    re.compile(r"context[_ ]length[_ ]exceeded", re.I),
)
# Codex 0.171.0 (codex-linux-x64): the error code it maps to ContextWindowExceeded (the binary
# compares it in pieces; its bytes "context_length_" sit beside the variant name)
CODEX_CODE = "context_length_exceeded"

MODEL = "smollm2-135m-instruct"


@dataclass
class FakeEngine:
    max_model_len: int
    vocab_size: int = 49152
    facts: Any = field(default_factory=lambda: SimpleNamespace(default_logit_bias=()))  # what sampling reads

    def check_sampling(self, params: SamplingParams) -> None:
        return None


def chat(max_tokens: int | None = None) -> ChatCompletionRequest:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return ChatCompletionRequest.model_validate(body)


def fit(req: Any, prompt: int, window: int = 16384, **limits: Any) -> SamplingParams:
    settings = load_settings(limits=limits) if limits else load_settings()
    return fit_sampling(req, prompt, FakeEngine(window), settings)[0]  # type: ignore[arg-type]


def test_prompt_over_the_window_in_every_clients_words():
    with pytest.raises(PromptTooLong) as caught:
        fit(chat(), 17000)
    exc = caught.value
    assert exc.status == 400 and exc.code == CODEX_CODE and exc.param == "messages"
    for pattern in OPENCODE_OVERFLOW[:2]:
        assert pattern.search(exc.message), pattern
    assert OPENCODE_OVERFLOW[2].search(json.dumps(exc.body()))  # the code, in the body
    assert all(phrase in exc.message.lower() for phrase in CC_GATEWAY[::2])
    assert "nothing was truncated" in exc.message  # what happened and how to fix it, as before
    anthropic = shape_error("/v1/messages", 400, exc.body(), exc)
    text = anthropic["error"]["message"]
    assert anthropic["error"]["type"] == "invalid_request_error"
    assert CC_FIRST_PARTY.match(text) and CC_PROMPT_TOO_LONG in text
    actual, limit = map(int, CC_PROMPT_TOO_LONG_NUMBERS.search(text).groups())  # type: ignore[union-attr]
    assert actual == 17000 and limit == 16384 - 256 and actual > limit  # Claude Code's gap > 0
    assert shape_error("/v1/chat/completions", 400, exc.body(), exc) == exc.body()  # OpenAI body as it is


def test_completions_name_the_prompt():
    req = CompletionRequest.model_validate({"model": MODEL, "prompt": "hi"})
    with pytest.raises(PromptTooLong) as caught:
        fit(req, 20000)
    assert caught.value.param == "prompt" and "your prompt resulted in 20000 tokens" in caught.value.message


def test_below_the_reply_floor_the_answer_is_the_window_error_not_a_few_tokens():
    floor = reply_floor(load_settings(), 16384)
    assert floor == 256
    prompt = 16384 - 200  # 200 tokens of room: a reply clamped to 200 would be cut
    with pytest.raises(PromptTooLong) as caught:
        fit(chat(32000), prompt)
    exc = caught.value
    assert "leaves 200 for the reply, under the 256-token minimum (limits.min_reply_tokens)" in exc.message
    text = anthropic_message(exc)
    assert text == f"prompt is too long: {prompt} tokens > {16384 - 256} maximum"
    with pytest.raises(PromptTooLong):
        fit(chat(), prompt)  # no max_tokens: default_max_tokens (1024) does not fit either
    assert fit(chat(200), prompt).max_tokens == 200  # what fits is served as asked
    assert fit(chat(32000), 16384 - 256).max_tokens == 256  # at the floor: clamped, served
    # the floor is at most a quarter of a small window (512: 128)
    assert fit(chat(32000), 512 - 150, window=512).max_tokens == 150
    with pytest.raises(PromptTooLong):
        fit(chat(32000), 512 - 127, window=512)
    assert fit(chat(32000), prompt, min_reply_tokens=100).max_tokens == 200  # the setting moves it
    with pytest.raises(PromptTooLong):
        fit(chat(32000), prompt, min_reply_tokens=1000)


def test_a_compaction_request_asking_32k_gets_a_reply_that_fits():
    """opencode / Claude Code send their summary request with max_tokens 32000: clamped to the room."""
    assert fit(chat(32000), 5000).max_tokens == 16384 - 5000


def test_reject_mode_words_the_window_as_anthropic_does():
    with pytest.raises(MaxTokensOverWindow) as caught:
        fit(chat(32000), 5000, max_tokens_over_window="reject")
    exc = caught.value
    assert exc.code == CODEX_CODE and exc.param == "max_tokens"
    assert OPENCODE_OVERFLOW[0].search(exc.message) and "max_tokens at most 11384 fits" in exc.message
    text = anthropic_message(exc)
    assert text is not None
    match = CC_CONTEXT_LIMIT.search(text)
    assert match and tuple(map(int, match.groups())) == (5000, 32000, 16384)
    assert 16384 - 5000 - 1000 >= CC_FLOOR_OUTPUT_TOKENS  # Claude Code resends with max_tokens 10384


def test_the_operator_cap_is_anthropics_max_tokens_message():
    with pytest.raises(MaxTokensOverLimit) as caught:
        fit(chat(32000), 100, max_tokens=8192)
    exc = caught.value
    assert exc.param == "max_tokens" and "limits.max_tokens" in exc.message
    text = anthropic_message(exc)
    limit = "which is the maximum allowed number of output tokens for"
    assert text == f"max_tokens: 32000 > 8192, {limit} {MODEL}"
    match = CC_MAX_TOKENS.match(text)
    assert match and int(match.group(1)) == 8192  # Claude Code resends at 8192


@pytest.mark.e2e
def test_each_dialect_answers_a_prompt_over_the_window_in_its_words(hf_engine):
    from server.app import build_app
    from tests.conftest import worker_settings

    long = "hi " * 9000
    with TestClient(build_app(worker_settings(), engine=hf_engine)) as c:
        body = {"model": MODEL, "max_tokens": 32000, "messages": [{"role": "user", "content": long}]}
        r = c.post("/v1/messages", json=body)
        assert r.status_code == 400, r.text
        err = r.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
        assert CC_FIRST_PARTY.match(err["error"]["message"]), err
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == CODEX_CODE
        assert OPENCODE_OVERFLOW[0].search(r.json()["error"]["message"])
        r = c.post("/v1/responses", json={"model": MODEL, "input": long, "max_output_tokens": 64})
        assert r.status_code == 400 and r.json()["error"]["code"] == CODEX_CODE, r.text
