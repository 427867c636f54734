# ruff: noqa: E501  (the expected prompt is written out literally)
"""Qwen3-Coder: no official Python renderer exists, so the layout is checked against the
published Qwen3-Coder chat template's format, written out by hand below (tools XML with
extra schema keys, the no-system default, XML calls with typed values, grouped results), in the
client's key order (the template iterates the dicts it is given: nothing is sorted)."""

from __future__ import annotations

import json

from server.families.render import FamilyRenderer
from server.protocol import ChatMessage

TOOL = {
    "type": "function",
    "function": {
        "name": "edit_file",
        "description": "  Edit a file. ",
        "parameters": {
            "type": "object",
            "required": ["path"],
            "properties": {
                "path": {"type": "string", "description": "Where."},
                "dry": {"type": "boolean", "default": False},
                "lines": {"type": "array", "items": {"type": "integer"}},
            },
        },
    },
}
INSTRUCTIONS = (
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the "
    "specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> "
    "XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function "
    "call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, "
    "answer the question like normal with your current knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>"
)
EXPECTED = (
    "<|im_start|>system\nYou are Qwen, a helpful AI assistant that can interact with a computer to solve tasks."
    "\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n<function>\n<name>edit_file</name>\n"
    "<description>Edit a file.</description>\n<parameters>\n<parameter>\n<name>path</name>\n<type>string</type>\n"
    "<description>Where.</description>\n</parameter>\n<parameter>\n<name>dry</name>\n<type>boolean</type>\n"
    "<default>False</default>\n</parameter>\n<parameter>\n<name>lines</name>\n<type>array</type>\n"
    '<items>{"type": "integer"}</items>\n</parameter>\n<required>["path"]</required>\n</parameters>\n</function>\n'
    "</tools>" + INSTRUCTIONS + "<|im_end|>\n"
    "<|im_start|>user\nfix it<|im_end|>\n"
    "<|im_start|>assistant\nLet me look.\n\n<tool_call>\n<function=edit_file>\n<parameter=path>\na.py\n</parameter>\n"
    "<parameter=dry>\nTrue\n</parameter>\n<parameter=lines>\n[3, 4]\n</parameter>\n</function>\n</tool_call>"
    "\n<tool_call>\n<function=edit_file>\n<parameter=path>\nb.py\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\nok\n</tool_response>\n<tool_response>\nnope\n</tool_response>\n<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def _conversation() -> list[ChatMessage]:
    calls = [
        {"id": "a", "type": "function", "function": {"name": "edit_file", "arguments": json.dumps(args)}}
        for args in ({"path": "a.py", "dry": True, "lines": [3, 4]}, {"path": "b.py"})
    ]
    msgs = [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": " Let me look. ", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "a", "content": "ok"},
        {"role": "tool", "tool_call_id": "a", "content": "nope"},
    ]
    return [ChatMessage(**m) for m in msgs]


def test_published_format_with_tools() -> None:
    assert FamilyRenderer("qwen3_coder").render(_conversation(), [TOOL]).text == EXPECTED


def test_no_tools_no_system_renders_no_system_turn() -> None:
    text = FamilyRenderer("qwen3_coder").render([ChatMessage(role="user", content="hi")], []).text
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_call_markers_are_single_tokens_in_the_qwen_vocabulary() -> None:
    from server.families.tokenizers import qwen_tokenizer

    tok = qwen_tokenizer()
    ids = tok(EXPECTED, add_special_tokens=False)["input_ids"]
    assert ids.count(tok.convert_tokens_to_ids("<tool_call>")) == 4  # 2 in the instructions, 2 calls
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 5
    assert tok.decode(ids) == EXPECTED
