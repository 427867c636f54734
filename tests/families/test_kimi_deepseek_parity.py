"""Kimi K2 and DeepSeek V3.1 render token for token what their vendors' chat templates render
through transformers' ``apply_chat_template`` (tests/fixtures/templates/, see NOTICE), on the shared
corpus and on conversations with reasoning, the input as an SDK sends it (keys in the SDK's order,
nothing sorted; vLLM's message preparation: null content as "", arguments parsed into dicts).

Tokens: each family's test vocabulary (SmolLM2's plus the family's special tokens,
``test_model.add_special``): the real Kimi (tiktoken, remote code) and DeepSeek vocabularies
cannot be fetched here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from server.families.render import FamilyRenderer
from server.families.test_model import family_test_tokenizer
from server.protocol import ChatMessage
from tests.families.conversations import WEATHER, conversations
from tests.families.test_template_parity import vllm_messages

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "templates"
FAMILIES = ["kimi_k2", "deepseek_v31"]
DS_BOS = "<｜begin▁of▁sentence｜>"


def _kimi(tok: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    text: str = tok.apply_chat_template(
        vllm_messages(messages),
        tools=tools or None,
        chat_template=(TEMPLATES / "kimi-k2-thinking.jinja").read_text(),
        tokenize=False,
        add_generation_prompt=True,
    )
    return text


def _deepseek_tools(tok: Any, tools: list[dict[str, Any]]) -> str:
    """The model card's tool block as SGLang's / vLLM's example template writes it after the system
    prompt ("\n\n## Tools …"), cut out of its rendering (the example template's own stray
    indentation elsewhere is not the model's format: the official template has none)."""
    text: str = tok.apply_chat_template(
        [{"role": "user", "content": "x"}],
        tools=tools,
        chat_template=(TEMPLATES / "deepseek-v3.1-tools.jinja").read_text(),
        tokenize=False,
    )
    return text.split(DS_BOS, 1)[1].split("<｜User｜>")[0]


def _dumped(call: dict[str, Any]) -> dict[str, Any]:
    """vLLM parses a call's arguments into a dict, which the official template cannot join to its
    strings; SGLang's copy of the template writes such a dict with ``tojson``: so do we here."""
    return {
        **call,
        "function": {
            **call["function"],
            "arguments": json.dumps(call["function"]["arguments"], ensure_ascii=False),
        },
    }


def unexpressible(ref: str, tools: list[dict[str, Any]]) -> str | None:
    if ref == "deepseek_v31" and any("parameters" not in t["function"] for t in tools):
        return (
            "a tool without parameters: the model card's block writes them with tojson (the template raises)"
        )
    return None


def _deepseek(tok: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """The official V3.1 template (arguments as the SDK sends them, JSON text: the template joins
    strings), the tools in the system prompt as the model card says: SYSTEM + "\n\n" + TOOLS."""
    msgs = [
        {**m, "tool_calls": [_dumped(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m
        for m in vllm_messages(messages)
    ]
    if tools:
        block = _deepseek_tools(tok, tools)
        if any(m["role"] == "system" for m in msgs):
            at = max(i for i, m in enumerate(msgs) if m["role"] == "system")
            msgs.insert(at + 1, {"role": "system", "content": block.removeprefix("\n\n")})
        else:
            msgs.insert(0, {"role": "system", "content": block})
    text: str = tok.apply_chat_template(
        msgs,
        chat_template=(TEMPLATES / "deepseek-v3.1.jinja").read_text(),
        tokenize=False,
        add_generation_prompt=True,
    )
    return text


THEIRS = {"kimi_k2": _kimi, "deepseek_v31": _deepseek}


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


# reasoning in a tool loop (kept), then an answer (earlier reasoning dropped), then a new loop;
# Kimi's call ids as its model writes them (functions.NAME:IDX, a running index)
REASONING: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
    (
        [
            {"role": "user", "content": "Weather in Paris, then Zürich?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Two cities: call twice.\n",
                "tool_calls": [
                    _call("functions.get_weather:0", "get_weather", {"city": "Paris"}),
                    _call("functions.get_weather:1", "get_weather", {"city": "Zürich", "unit": "c"}),
                ],
            },
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "21"},
            {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": '{"t": 19}'},
        ],
        [WEATHER],
    ),
    (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Paris?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "reasoning_content": "Call it.",
                "tool_calls": [_call("functions.get_weather:0", "get_weather", {"city": "Paris"})],
            },
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "21"},
            {"role": "assistant", "content": "21 degrees.", "reasoning_content": "Answer."},
            {"role": "user", "content": 'And "Zürich"?\nQuick.'},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Again.",
                "tool_calls": [_call("functions.get_weather:1", "get_weather", {"city": "Zürich"})],
            },
            {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "19"},
        ],
        [WEATHER],
    ),
]
CASES = conversations() + REASONING


@pytest.fixture(scope="module")
def toks() -> dict[str, Any]:
    return {}


def _tok(toks: dict[str, Any], ref: str) -> Any:
    if ref not in toks:
        toks[ref] = family_test_tokenizer(ref)
    return toks[ref]


def _ours(ref: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    return FamilyRenderer(ref).render([ChatMessage(**m) for m in messages], tools).text


@pytest.mark.parametrize("ref", FAMILIES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_tokens_equal_the_vendor_template(ref: str, case: int, toks: dict[str, Any]) -> None:
    tok = _tok(toks, ref)
    messages, tools = CASES[case]
    why = unexpressible(ref, tools)
    if why is not None:
        text = _ours(ref, messages, tools)
        assert "Parameters: {}\n" in text  # we write an empty object
        pytest.skip(why)
    ours, want = _ours(ref, messages, tools), THEIRS[ref](tok, messages, tools)
    assert ours == want
    assert (
        tok(ours, add_special_tokens=False)["input_ids"] == tok(want, add_special_tokens=False)["input_ids"]
    )
