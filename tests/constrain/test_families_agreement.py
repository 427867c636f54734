"""A tool call in the history, as the family renders it, is the text the masks let the model write.

For each family (grammars/families, famrender's renderer) and its envelope (grammars/envelopes,
the masks): the reply an assistant turn with tool calls renders to (the text between the
previous prompt's generation prompt and the end-of-turn token) equals ``Envelope.render_calls``
for the same calls, and its tokens pass the masks one by one (mode auto, and required after its
prefill), ending where the constraint says the reply is complete. If the two sides disagreed, a
reply would be re-rendered differently in the next prompt and the cache would lose it.
"""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from server.chat.tool_choice import plan_tools
from server.chat.toolcalls import parse_tool_calls
from server.constrain.vocab import TokenVocab
from server.families.envelope import load_envelope
from server.families.family import load_family
from server.families.render import renderer_for
from server.protocol import ChatMessage

from .conftest import FAMILIES

# family ref -> (vocabulary, end of the assistant turn, may a reply hold text and calls)
CASES = {
    "hermes": ("qwen", "<|im_end|>", True),
    "qwen3_coder": ("qwen", "<|im_end|>", True),
    "llama3_json": ("llama3", "<|eot_id|>", False),
    "mistral:v3": ("tekken_args", "</s>", False),
    "mistral:v3_spm": ("mistral_spm", "</s>", False),
    "mistral:v11": ("tekken_args", "</s>", True),
    "mistral:v13": ("tekken_args", "</s>", True),
}
TOOLS = [
    {"type": "function", "function": {"name": "shell_exec", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}},
    {"type": "function", "function": {"name": "browser_open", "parameters": {
        "type": "object", "properties": {"url": {"type": "string"}, "new_tab": {"type": "boolean"},
                                         "retries": {"type": "integer"}}, "required": ["url"]}}},
    {"type": "function", "function": {"name": "edit", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}, "at": {"type": "object", "properties": {
            "line": {"type": "integer"}, "col": {"type": "integer"}}}}, "required": ["text"]}}},
    {"type": "function", "function": {"name": "submit"}},
]  # fmt: skip
CALLS = {
    "one": [("shell_exec", {"cmd": "ls -la | grep 'x y'"})],
    # the schema's order (url, new_tab, retries), not sorted: the masks write it, the history keeps it
    "schema_order": [("browser_open", {"url": "https://ex.org/ä?q=1", "new_tab": True, "retries": 3})],
    "nested_and_empty": [
        ("edit", {"text": "a\nb </tool_call> c", "at": {"line": 3, "col": 1}}),
        ("submit", {}),
    ],
}
IDS = ["a1B2c3D4e", "Zz9Yy8Xx7"]


def after_prefill(tokenizer, text: str, prefill: str) -> list[int]:
    """The tokens of ``text`` after those of the prefill (the prompt holds the prefill's tokens; a
    SentencePiece tokenizer would put a "▁" before the rest if it were tokenized on its own)."""
    full = tokenizer.encode(text, add_special_tokens=False)
    head = tokenizer.encode(prefill, add_special_tokens=False) if prefill else []
    if full[: len(head)] == head:
        return full[len(head) :]
    return tokenizer.encode(text[len(prefill) :], add_special_tokens=False)  # the prefill cuts a token


def reply_of(ref: str, calls, content: str) -> tuple[str, str]:
    """(the prompt up to the assistant turn, the reply the family renders for these calls)."""
    renderer = renderer_for(ref)
    user = ChatMessage(role="user", content="Please do it.")
    tool_calls = [
        {"id": IDS[i], "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(calls)
    ]
    assistant = ChatMessage(role="assistant", content=content or None, tool_calls=tool_calls)
    results = [ChatMessage(role="tool", tool_call_id=IDS[i], content="ok") for i in range(len(calls))]
    before = renderer.render([user], TOOLS).text
    after = renderer.render([user, assistant, *results], TOOLS, add_generation_prompt=False).text
    assert after.startswith(before), "the family is not append-only here"
    end = CASES[ref][1]
    rest = after[len(before) :]
    assert end in rest
    return before, rest[: rest.index(end)]


@pytest.mark.parametrize("case", list(CALLS))
@pytest.mark.parametrize("ref", list(CASES))
def test_history_call_equals_what_the_masks_write(official, ref, case):
    vocab_name, _, with_text = CASES[ref]
    env_name = load_family(ref).envelope
    assert FAMILIES[env_name][0] == vocab_name
    env = load_envelope(env_name)
    calls = CALLS[case] if env.parallel else CALLS[case][:1]
    content = "I will do that." if with_text else ""
    _, reply = reply_of(ref, calls, content)
    canonical = [(n, json.dumps(a, sort_keys=env.key_order == "sorted", ensure_ascii=False), IDS[i])
                 for i, (n, a) in enumerate(calls)]  # fmt: skip
    expected = env.render_calls(canonical, content + ("\n\n" if content and env.trigger == "text" else ""))
    if ref == "hermes" and content:
        expected = env.render_calls(canonical, content + "\n")  # hermes: text, one newline, calls
    assert reply == expected
    # what the client gets back (and sends back in the next request) is those same bytes: the
    # arguments as written (UTF-8, the schema's key order) and the id the model wrote, if any
    parsed = parse_tool_calls(reply, env, TOOLS).tool_calls
    want = [(n, a, i if env.call_id else None) for n, a, i in canonical]
    assert [(c.name, c.arguments, c.id) for c in parsed] == want

    off = official(vocab_name)
    compiler = off.compiler(env_name)
    eos = off.eos(env_name)
    bitmask = xgr.allocate_token_bitmask(1, off.vocab.vocab_size)
    for mode in ("auto", "required"):
        plan = plan_tools(TOOLS, mode, [], True, None, env)
        constraint = compiler.build(TOOLS, plan, eos)
        text = reply if mode == "auto" else reply[len(content) :].lstrip("\n")
        assert text.startswith(plan.prefill)
        for tid in after_prefill(off.tokenizer, text, plan.prefill):
            constraint.fill_next_token_bitmask(bitmask, 0)
            allowed = TokenVocab.unpack(bitmask[0].numpy(), off.vocab.vocab_size)
            assert tid in allowed and constraint.accept_token(tid), (mode, off.tokenizer.decode([tid]))
        assert constraint.calls == [n for n, _ in calls], mode
        assert constraint.is_terminated() or set(eos) <= TokenVocab.unpack(
            _filled(constraint, bitmask), off.vocab.vocab_size
        )


def _filled(constraint, bitmask):
    constraint.fill_next_token_bitmask(bitmask, 0)
    return bitmask[0].numpy()


# A string argument as the history renders it (json.dumps / tojson, ensure_ascii=False: UTF-8, only the
# escapes json.dumps writes) passes the masks; an escape the history would never render (\u00e4 for ä,
# \/) does not: else the model's bytes and the history's differ and the next turn misses the cache there.
STRINGS = {
    "canonical": (json.dumps('ä \x1f\x7f\n\t"\\ /', ensure_ascii=False), True),
    "u_escape_of_a_letter": ('"\\u00e4"', False),
    "uppercase_hex_control": ('"\\u001F"', False),
    "escaped_slash": ('"a\\/b"', False),
}


@pytest.mark.parametrize("string", list(STRINGS))
@pytest.mark.parametrize("ref", [r for r in CASES if r != "qwen3_coder"])  # qwen3_coder: raw XML values
def test_masks_write_strings_as_the_history_renders_them(official, ref, string):
    vocab_name = CASES[ref][0]
    env_name = load_family(ref).envelope
    env = load_envelope(env_name)
    value, ok = STRINGS[string]
    off = official(vocab_name)
    tools = TOOLS[:1]
    plan = plan_tools(tools, "required", [], True, None, env)
    constraint = off.compiler(env_name).build(tools, plan, off.eos(env_name))
    text = env.render_calls([("shell_exec", '{"cmd": ' + value + "}", IDS[0])])
    accepted = all(constraint.accept_token(tid) for tid in after_prefill(off.tokenizer, text, plan.prefill))
    assert accepted == ok, (text, constraint.error)
    assert (constraint.calls == ["shell_exec"]) == ok
