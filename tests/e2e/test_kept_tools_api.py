"""Mask, don't remove — at the server (server/chat/kept_tools.py), over HTTP in all three dialects.

A named session's request with fewer tools than its previous turn (Codex's compaction: the whole
history again with ``tools: []``) renders the previous tool list and masks the removed tools: the
shared history comes from cache and no call can be written. Reordered tools render in the earlier
order; an added tool is a real change, reported as before.
"""

from __future__ import annotations

from typing import Any

import pytest
import xgrammar as xgr

from server.chat.service import ChatService
from server.constrain.vocab import TokenVocab
from server.metrics import Metrics
from server.protocol import ChatCompletionRequest
from tests.conftest import worker_settings
from tests.e2e.three_dialects import DIALECTS, MODEL, Chat, Responses, post

pytestmark = pytest.mark.e2e

SYSTEM = "You are a careful coding agent. " + " ".join(f"Rule {i}: check your work." for i in range(30))
NAMES = ("shell_exec", "file_read", "browser_open")
HISTORY = [
    {"role": "user", "content": "List the files of the project and tell me what each one does."},
]


def history_of(name: str) -> list[dict[str, Any]]:
    """A history of its own per test (the engine is shared: another test's prompt would be cached)."""
    return [{"role": "user", "content": f"[{name}] {HISTORY[0]['content']}"}]


def system_of(history: list[dict[str, Any]]) -> str:
    """The tag of the history first in the system prompt (every dialect renders it first)."""
    return str(history[0]["content"]).split("]")[0] + "] " + SYSTEM


def body(dialect: Any, history: list[dict[str, Any]], names: tuple[str, ...] | None) -> dict[str, Any]:
    return dialect.body(system_of(history), history, dialect.tools(names) if names is not None else None)


def reply(dialect: Any, r: dict[str, Any]) -> list[dict[str, Any]]:
    return dialect.replies(r)


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.__name__)
def test_removed_tools_are_kept_masked_and_the_history_comes_from_cache(server_url, dialect):
    key = f"kept-{dialect.__name__}"
    first = history_of(key)
    r1 = post(server_url, dialect.path, body(dialect, first, NAMES), key)
    shared = r1["cache"]["prompt_tokens"]
    assert "kept_tools" not in r1["cache"]
    history = [*first, *reply(dialect, r1), {"role": "user", "content": "Summarize the conversation."}]
    # the compaction's shape: the whole history again, no tools
    r2 = post(server_url, dialect.path, body(dialect, history, ()), key)
    c2 = r2["cache"]
    assert c2["kept_tools"] == list(NAMES)
    assert c2["cached_tokens"] >= 0.95 * shared, c2
    assert c2["type"] is None, c2  # nothing missed: the prompt extends the previous one
    assert r2["tool_state"] == {"mode": "none", "allowed": [], "state": None} and dialect.calls(r2) == 0
    # the same tools in another order: rendered in the earlier order, every one callable
    history += [*reply(dialect, r2), {"role": "user", "content": "Go on."}]
    r3 = post(server_url, dialect.path, body(dialect, history, tuple(reversed(NAMES))), key)
    c3 = r3["cache"]
    assert c3["kept_tools"] == [] and c3["type"] is None and c3["cached_tokens"] >= c2["prompt_tokens"] - 64
    assert sorted(r3["tool_state"]["allowed"]) == sorted(NAMES)
    # a tool added mid-session is a real change: rendered as sent, named by the report
    history += [*reply(dialect, r3), {"role": "user", "content": "And now?"}]
    r4 = post(server_url, dialect.path, body(dialect, history, (*NAMES, "grep_files")), key)
    c4 = r4["cache"]
    assert "kept_tools" not in c4
    assert c4["type"] == "tools_changed" and c4["detail"]["change"] == "added", c4


def test_a_session_without_a_name_renders_the_tools_as_sent(server_url):
    """prefix-hash sessions (no key, no previous_response_id) are not kept: the tools are their key."""
    first = history_of("unnamed")
    r1 = post(server_url, Chat.path, body(Chat, first, NAMES), None)
    history = [*first, *reply(Chat, r1), {"role": "user", "content": "Summarize."}]
    r2 = post(server_url, Chat.path, body(Chat, history, ()), None)
    assert "kept_tools" not in r2["cache"]


def test_previous_response_id_finds_the_turn_it_continues(server_url):
    first = body(Responses, history_of("previous_response_id"), NAMES) | {"store": True}
    r1 = post(server_url, Responses.path, first, None)  # keyed by its prefix hash
    follow = {
        "instructions": first["instructions"],
        "previous_response_id": r1["id"],
        "input": [{"role": "user", "content": "Summarize the conversation."}],
        "tools": [],
        "max_output_tokens": 4,
        "temperature": 0,
    }
    r2 = post(server_url, Responses.path, follow, None)
    assert r2["cache"]["kept_tools"] == list(NAMES)
    assert r2["cache"]["cached_tokens"] >= 0.95 * r1["cache"]["prompt_tokens"]


@pytest.fixture(scope="module")
def service(hf_engine):
    return ChatService(hf_engine, worker_settings(), Metrics())


def test_no_call_can_be_written_to_a_kept_tool(service, tokenizer):
    headers = {"x-session-id": "kept-mask"}
    first = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": Chat.tools(NAMES)}
    service.prepare_chat(ChatCompletionRequest.model_validate(first), headers)
    later = {**first, "tools": Chat.tools(NAMES[:2]), "tool_choice": "required"}
    p = service.prepare_chat(ChatCompletionRequest.model_validate(later), headers)
    assert p.kept_tools == list(NAMES[2:]) and p.plan is not None and p.plan.allowed == NAMES[:2]
    assert [t["function"]["name"] for t in p.tool_spec.tools] == list(NAMES)  # rendered, masked
    matcher = p.constraint.matcher  # prefilled '<tool_call>\n{"name": "': the name's first token next
    bitmask = xgr.allocate_token_bitmask(1, len(tokenizer))
    matcher.fill_next_token_bitmask(bitmask, 0)
    allowed = TokenVocab.unpack(bitmask[0].numpy(), len(tokenizer))
    assert {tokenizer.encode("shell")[0], tokenizer.encode("file")[0]} <= allowed
    assert tokenizer.encode("browser")[0] not in allowed
    none = {**first, "tools": []}
    p = service.prepare_chat(ChatCompletionRequest.model_validate(none), headers)
    assert p.kept_tools == list(NAMES) and p.plan is not None and p.plan.mode == "none"
    matcher = p.constraint.matcher
    for tid in tokenizer.encode("<tool_call>"):  # the call's opening is never allowed
        matcher.fill_next_token_bitmask(bitmask, 0)
        if tid not in TokenVocab.unpack(bitmask[0].numpy(), len(tokenizer)):
            break
        assert matcher.accept_token(tid)
    else:
        pytest.fail("the call opening '<tool_call>' was allowed with every tool removed")


def test_kept_tools_that_would_take_the_replys_room_are_rendered_as_sent(service):
    """Kept tools lengthen the prompt: when the reply would then be clamped or refused by the window,
    and as sent it would not, the tools are rendered as sent (a compaction near the window still fits)."""
    headers = {"x-session-id": "kept-window"}
    big = [dict(t, function=dict(t["function"], description="word " * 2500)) for t in Chat.tools(NAMES)]
    msgs = [{"role": "user", "content": "hi"}]
    first = {"model": MODEL, "messages": msgs, "tools": big, "max_tokens": 4}
    service.prepare_chat(ChatCompletionRequest.model_validate(first), headers)
    later = {**first, "tools": [], "max_tokens": 2000}
    p = service.prepare_chat(ChatCompletionRequest.model_validate(later), headers)
    assert p.kept_tools is None and p.max_tokens_clamped is None and len(p.prompt_ids) < 200
    other = {"x-session-id": "kept-window-short-reply"}  # the kept tools fit next to a short reply
    service.prepare_chat(ChatCompletionRequest.model_validate(first), other)
    p = service.prepare_chat(ChatCompletionRequest.model_validate({**later, "max_tokens": 4}), other)
    assert p.kept_tools == list(NAMES) and len(p.prompt_ids) > 5000
