"""The ``harmony`` family (gpt-oss) renders token for token what the official gpt-oss chat template
(tests/fixtures/templates/gpt-oss.jinja, see NOTICE) renders through transformers'
``apply_chat_template``, on the shared corpus and on Harmony-specific conversations, the input as
an SDK sends it (tools and arguments in SDK key order, never canonicalized; vLLM's message
preparation: arguments parsed, null content as "").

Same values on both sides: the template's clock (``strftime_now``) is pinned to the family's
``date``; ``reasoning_effort`` is the template's default (``medium``) unless a test sets it on both
sides; the reasoning an SDK sends as
``reasoning_content`` is the template's ``thinking`` field. Tokens: the Harmony test vocabulary
(SmolLM2's + the Harmony special tokens; the o200k vocabulary cannot be fetched here).

What the template cannot express (docs/families.md): several calls in one assistant message
(it renders only the first: checked up to there); a later system message (it drops it: we render
a developer message).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from server.families.family import load_family
from server.families.render import FamilyRenderer
from server.families.test_model import family_test_tokenizer
from server.protocol import ChatMessage
from tests.families.conversations import conversations
from tests.families.test_template_parity import vllm_messages

TEMPLATE = (Path(__file__).parent.parent / "fixtures" / "templates" / "gpt-oss.jinja").read_text()
DATE = str(load_family("harmony").date)


def _tool(name: str, params: dict[str, Any] | None, description: str = "Does a thing.") -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name, "description": description}
    if params is not None:
        fn["parameters"] = params
    return {"type": "function", "function": fn}


# every branch of the template's TypeScript rendering, keys in the order an SDK writes them
TOOLS = [
    _tool(
        "search_files",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for."},
                "paths": {"type": "array", "items": {"type": "string"}},
                "limit": {"type": "integer", "default": 10},
                "scores": {"type": "array", "items": {"type": "number"}},
                "flags": {"type": "array", "items": {"type": "boolean"}},
                "mode": {"type": "string", "enum": ["fast", "exact"], "default": "fast"},
                "note": {"type": "string", "nullable": True},
                "case_sensitive": {"type": "boolean", "default": False},
            },
            "required": ["query"],
        },
        "Search the workspace. Renvoie des résultats.",
    ),
    _tool(
        "edit",
        {
            "type": "object",
            "properties": {
                "target": {
                    "type": "object",
                    "properties": {"file": {"type": "string"}, "line": {"type": "integer"}},
                    "required": ["file"],
                },
                "edits": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"old": {"type": "string"}, "new": {"type": "string"}},
                    },
                },
                "value": {"oneOf": [{"type": "string"}, {"type": "number", "description": "a count"}]},
                "either": {"type": ["string", "null"]},
                "meta": {"type": "object"},
                "anything": {},
            },
            "required": ["target", "edits"],
        },
    ),
    _tool("list_tabs", None, "List the open tabs."),
    _tool("ping", {"type": "object", "properties": {}}, ""),
]


def _call(cid: str, name: str, args: dict[str, Any], ascii: bool = False) -> dict[str, Any]:
    arguments = json.dumps(args, ensure_ascii=ascii)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


SEARCH = {"query": 'naïve café "quoted"\nnext', "paths": ["src/", "docs/"], "limit": 3}
EDIT = {"target": {"line": 4, "file": "a.py"}, "edits": [{"old": "x", "new": "ÿ"}]}
OWN: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
    # a tool loop with reasoning: kept until the final answer, then dropped (the template's rule)
    (
        [
            {"role": "system", "content": "You are a coding agent.\nBe brief."},
            {"role": "user", "content": "Find the café."},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Search first.",
                "tool_calls": [_call("c1", "search_files", SEARCH)],
            },
            {"role": "tool", "tool_call_id": "c1", "content": '{"hits": ["src/café.py"]}'},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Now edit it.",
                "tool_calls": [_call("c2", "edit", EDIT, ascii=True)],
            },
            {"role": "tool", "tool_call_id": "c2", "content": "ok — done"},
        ],
        TOOLS,
    ),
    (
        [
            {"role": "developer", "content": "Réponds en français."},
            {"role": "user", "content": "List tabs then answer."},
            {
                "role": "assistant",
                "content": "Looking at the tabs.",
                "tool_calls": [_call("c1", "list_tabs", {})],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "[1, 2]"},
            {"role": "assistant", "content": "Deux onglets.", "reasoning_content": "Two tabs."},
            {"role": "user", "content": "Ping."},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Ping it.",
                "tool_calls": [_call("c2", "ping", {})],
            },
            {"role": "tool", "tool_call_id": "c2", "content": "pong"},
        ],
        TOOLS,
    ),
    ([{"role": "user", "content": "Hello 👋"}], []),
    ([{"role": "user", "content": "Tools but no system."}], TOOLS[2:]),
]


def _template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's preparation, and the reasoning as the template's ``thinking`` field."""
    out = []
    for m in vllm_messages(messages):
        m = dict(m)
        if m.get("reasoning_content") is not None:
            m["thinking"] = m.pop("reasoning_content")
        out.append(m)
    return out


@pytest.fixture(scope="module")
def tok() -> Any:
    return family_test_tokenizer("harmony")


@pytest.fixture(scope="module")
def template_text(tok: Any) -> Any:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    pinned = datetime.strptime(DATE, "%Y-%m-%d")
    globals_ = _compile_jinja_template(TEMPLATE).globals
    saved = globals_.get("strftime_now")
    globals_["strftime_now"] = pinned.strftime

    def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]], **kwargs: Any) -> str:
        text: str = tok.apply_chat_template(
            _template_messages(messages),
            tools=tools or None,
            chat_template=TEMPLATE,
            tokenize=False,
            add_generation_prompt=True,
            **kwargs,  # e.g. reasoning_effort, as vLLM's chat_template_kwargs pass it
        )
        return text

    yield render
    globals_["strftime_now"] = saved


def _ours(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    return FamilyRenderer("harmony").render([ChatMessage(**m) for m in messages], tools).text


CASES = conversations() + OWN


@pytest.mark.parametrize("case", range(len(CASES)))
def test_tokens_equal_the_gpt_oss_template(case: int, tok: Any, template_text: Any) -> None:
    messages, tools = CASES[case]
    ours, want = _ours(messages, tools), template_text(messages, tools)
    several = next((m for m in messages if len(m.get("tool_calls") or []) > 1), None)
    if several is not None:  # the template renders the first call only: equal up to the second
        first = json.dumps(json.loads(several["tool_calls"][0]["function"]["arguments"]), ensure_ascii=False)
        cut = want.index(first + "<|call|>", want.index(several["tool_calls"][0]["function"]["name"]))
        cut += len(first + "<|call|>")
        assert ours[:cut] == want[:cut]
        assert ours.count("<|call|>") > want.count("<|call|>")  # ours keeps every call
        return
    assert (
        tok(ours, add_special_tokens=False)["input_ids"] == tok(want, add_special_tokens=False)["input_ids"]
    )
    assert ours == want


@pytest.mark.parametrize(("effort", "says"), [("low", "low"), ("high", "high"), ("minimal", "low")])
def test_the_request_effort_is_the_reasoning_line(effort: str, says: str, template_text: Any) -> None:
    """reasoning_effort reaches the system message as the template writes it ("Reasoning: high");
    our effort names gpt-oss lacks map to its nearest (minimal: low)."""
    messages, tools = CASES[0]
    ours = FamilyRenderer("harmony").render(
        [ChatMessage(**m) for m in messages], tools, reasoning_effort=effort
    )
    assert ours.text == template_text(messages, tools, reasoning_effort=says)
    assert f"Reasoning: {says}\n" in ours.text and "Reasoning: medium" not in ours.text


def test_the_cases_cover_harmony_features(template_text: Any) -> None:
    loop = _ours(*OWN[0])
    assert "<|channel|>analysis<|message|>Search first.<|end|>" in loop  # no final answer yet: kept
    assert '<|start|>functions.edit to=assistant<|channel|>commentary<|message|>"ok — done"<|end|>' in loop
    assert (
        '"ÿ"' in loop and "line?: \n                number" in loop
    )  # UTF-8; nested objects as the template
    answered = _ours(*OWN[1])
    assert "Looking at the tabs." not in answered and "Two tabs." not in answered  # dropped after the answer
    assert "<|channel|>analysis<|message|>Ping it.<|end|>" in answered
    assert answered.count("<|start|>developer<|message|># Instructions") == 1
    assert sum(len(m.get("tool_calls") or []) > 1 for msgs, _ in CASES for m in msgs) >= 3


def test_a_later_system_message_is_a_developer_message_not_dropped() -> None:
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "system", "content": "Switch to plan mode."},
        {"role": "user", "content": "b"},
    ]
    text = _ours(msgs, [])
    assert "<|start|>developer<|message|># Instructions\n\nSwitch to plan mode.\n\n<|end|>" in text


def test_history_rewrite_is_named_and_keep_reasoning_renders_what_the_model_wrote() -> None:
    messages, tools = OWN[1]
    msgs = [ChatMessage(**m) for m in messages]
    default = FamilyRenderer("harmony").render(msgs, tools)
    assert "template_rewrote_history" in default.notes
    kept = FamilyRenderer("harmony", keep_reasoning=True).render(msgs, tools)
    assert "template_rewrote_history" not in kept.notes
    written = (
        "<|start|>assistant<|channel|>analysis<|message|>Ping it.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.ping <|constrain|>json<|message|>{}<|call|>"
    )
    assert written in kept.text and "<|channel|>analysis<|message|>Two tabs.<|end|>" in kept.text
