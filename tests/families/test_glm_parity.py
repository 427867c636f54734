"""The ``glm47`` and ``glm45`` families render token for token what the official GLM chat templates
(tests/fixtures/templates/glm-4.7.jinja, glm-4.6.jinja; see NOTICE) render through transformers'
``apply_chat_template``, on the shared corpus and on GLM cases (reasoning kept and dropped,
``clear_thinking: false``, quotes / newlines / unicode in arguments, typed values, parallel calls),
the input as an SDK sends it (vLLM's message preparation: arguments parsed, null content "").

Tokens: the family's test vocabulary (SmolLM2's + GLM's turn tokens and tags; the GLM vocabulary
cannot be fetched here). The templates' generation prompt ends with ``<think>`` (GLM-4.7) where our
prompt ends before it and the masks force it as the reply's first token (the model reads the same
tokens): the comparison adds it. With ``keep_reasoning`` our history is the template's with
``clear_thinking=False`` (GLM-4.7's preserved thinking; GLM-4.6's template has no such switch), but
for reasoning or text with spaces around them, which it renders as sent back (append-only) where the
template strips them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from server.families.family import load_family
from server.families.render import FamilyRenderer
from server.families.test_model import family_test_tokenizer
from server.protocol import ChatMessage
from tests.families.conversations import conversations
from tests.families.test_template_parity import vllm_messages

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "templates"
FAMILIES = {"glm47": "glm-4.7.jinja", "glm45": "glm-4.6.jinja"}
# what the template's generation prompt holds beyond ours: the reasoning open, forced by the masks
FORCED = {"glm47": "<think>", "glm45": ""}

EDIT = {
    "type": "function",
    "function": {
        "name": "edit_file",
        "description": "Replace text in a file.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old": {"type": "string"},
                "new": {"type": "string"},
                "count": {"type": "integer"},
                "dry_run": {"type": "boolean"},
                "opts": {"type": "object", "properties": {"ratio": {"type": "number"}}},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["path", "old", "new"],
        },
    },
}
LS = {"type": "function", "function": {"name": "ls", "description": "List a folder.", "parameters": {}}}


def _call(cid: str, name: str, args: dict[str, Any], ascii: bool = False) -> dict[str, Any]:
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=ascii)},
    }


TRICKY = {
    "path": "src/café.py",
    "old": 'print("hi")\n\tx = 1',
    "new": "print('naïve — ✓')\n",
    "count": 2,
    "dry_run": False,
    "opts": {"ratio": 0.5},
    "tags": ["a", "b"],
}
OWN: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
    (  # a tool loop with reasoning (kept: after the last user message), parallel calls, tricky args
        [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Fix the café."},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Look first.\nThen edit.",
                "tool_calls": [_call("c1", "ls", {}), _call("c2", "edit_file", TRICKY)],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "café.py"},
            {"role": "tool", "tool_call_id": "c2", "content": '{"ok": true}'},
            {
                "role": "assistant",
                "content": "Editing again.",
                "reasoning_content": "Once more.",
                "tool_calls": [_call("c3", "edit_file", TRICKY, ascii=True)],
            },
            {"role": "tool", "tool_call_id": "c3", "content": "done"},
        ],
        [EDIT, LS],
    ),
    (  # reasoning before the last user message: dropped by the template (kept with clear_thinking off)
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
            {"role": "user", "content": "List the folder."},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Call ls.",
                "tool_calls": [_call("c1", "ls", {})],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a\nb"},
        ],
        [LS],
    ),
]
OWN.append(  # text and reasoning with spaces and newlines around them: the template strips both
    (
        [
            {"role": "user", "content": "Go."},
            {
                "role": "assistant",
                "content": "\n  Checking the folder. \n",
                "reasoning_content": " \nList it first.\n ",
                "tool_calls": [_call("c1", "ls", {})],
            },
            {"role": "tool", "tool_call_id": "c1", "content": " a \n"},
            {"role": "assistant", "content": "<think>Inline.</think>\n\nDone. "},
            {"role": "user", "content": "Thanks"},
        ],
        [LS],
    )
)
CASES = conversations() + OWN


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, Any]:
    return {ref: family_test_tokenizer(ref) for ref in FAMILIES}


def _template(
    ref: str, tok: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]], **kw: Any
) -> str:
    text: str = tok.apply_chat_template(
        vllm_messages(messages),
        tools=tools or None,
        chat_template=(TEMPLATES / FAMILIES[ref]).read_text(),
        tokenize=False,
        add_generation_prompt=True,
        **kw,
    )
    return text


def _ours(ref: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]], keep: bool = False) -> str:
    renderer = FamilyRenderer(ref, keep_reasoning=keep)
    return renderer.render([ChatMessage(**m) for m in messages], tools).text


@pytest.mark.parametrize("ref", sorted(FAMILIES))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_tokens_equal_the_glm_template(ref: str, case: int, tokenizers: dict[str, Any]) -> None:
    messages, tools = CASES[case]
    tok = tokenizers[ref]
    ours, want = _ours(ref, messages, tools) + FORCED[ref], _template(ref, tok, messages, tools)
    assert ours == want
    assert (
        tok(ours, add_special_tokens=False)["input_ids"] == tok(want, add_special_tokens=False)["input_ids"]
    )


@pytest.mark.parametrize("case", range(len(CASES) - 1))  # the last case: spaces around the reasoning
def test_keep_reasoning_is_the_template_with_clear_thinking_off(
    case: int, tokenizers: dict[str, Any]
) -> None:
    messages, tools = CASES[case]
    ours = _ours("glm47", messages, tools, keep=True) + FORCED["glm47"]
    assert ours == _template("glm47", tokenizers["glm47"], messages, tools, clear_thinking=False)


def test_reasoning_off_is_the_template_with_thinking_disabled(tokenizers: dict[str, Any]) -> None:
    messages, tools = OWN[1]
    reasoning = load_family("glm47").reasoning
    assert reasoning is not None
    ours = _ours("glm47", messages, tools) + reasoning.disabled
    assert ours == _template("glm47", tokenizers["glm47"], messages, tools, enable_thinking=False)


def test_the_cases_cover_glm_features(tokenizers: dict[str, Any]) -> None:
    loop = _ours("glm47", *OWN[0])
    assert (
        "<|assistant|><think>Look first.\nThen edit.</think><tool_call>ls</tool_call><tool_call>edit_file"
        in loop
    )
    assert '<arg_key>old</arg_key><arg_value>print("hi")\n\tx = 1</arg_value>' in loop  # raw string
    assert "<arg_value>false</arg_value>" in loop and '<arg_value>{"ratio": 0.5}</arg_value>' in loop
    assert "<|observation|><tool_response>café.py</tool_response><tool_response>" in loop
    dropped = _ours("glm47", *OWN[1])
    assert "<|assistant|></think>Hello!<|user|>" in dropped and "Greet back." not in dropped
    assert "<think>Greet back.</think>" in _ours("glm47", *OWN[1], keep=True)
    spaced = _ours("glm47", *OWN[2], keep=True)  # keep_reasoning: as sent back, not stripped
    assert "<think> \nList it first.\n </think>  Checking the folder. \n<tool_call>ls" in spaced
    old = _ours("glm45", *OWN[0])
    assert "\n<tool_call>edit_file\n<arg_key>path</arg_key>\n<arg_value>src/café.py</arg_value>\n" in old
