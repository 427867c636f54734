"""Mistral v11's call id, masked between [CALL_ID] and [ARGS] (server/constrain/call_id.py):
after the name's [CALL_ID] the model writes exactly 9 letters or digits, then [ARGS] and only then
the arguments; on the real tekken vocabulary with v11's special tokens."""

from __future__ import annotations

import pytest
import xgrammar as xgr

from server.chat.tool_choice import plan_tools
from server.constrain.call_id import id_alphabet
from server.constrain.vocab import TokenVocab
from server.families.envelope import load_envelope

TOOLS = [
    {"type": "function", "function": {"name": "shell_exec", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}},
]  # fmt: skip
ENV = "mistral_call_id"


@pytest.fixture(scope="module")
def setup(official):
    off = official("tekken_args")
    env = load_envelope(ENV)
    named = {"type": "function", "function": {"name": "shell_exec"}}
    plan = plan_tools(TOOLS, named, [], True, None, env)
    constraint = off.compiler(ENV).build(TOOLS, plan, off.eos(ENV))
    tok = off.tokenizer
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("[CALL_ID]", "[ARGS]", "[TOOL_CALLS]")}
    rest = "shell_exec"[len(plan.prefill) - len(env.opening) :]
    for tid in tok.encode(rest, add_special_tokens=False) + [ids["[CALL_ID]"]]:
        assert constraint.accept_token(tid), constraint.error
    return off, constraint, ids


def _allowed(constraint, off) -> set[int]:
    bitmask = xgr.allocate_token_bitmask(1, off.vocab.vocab_size)
    constraint.fill_next_token_bitmask(bitmask, 0)
    return TokenVocab.unpack(bitmask[0].numpy(), off.vocab.vocab_size)


def test_the_id_is_nine_alphanumerics_then_args_then_the_arguments(setup) -> None:
    off, c, ids = setup
    allowed = _allowed(c, off)
    pieces = {off.vocab.token_bytes[t] for t in allowed}
    assert pieces and all(p.isalnum() and p.isascii() and len(p) <= 9 for p in pieces)
    assert ids["[ARGS]"] not in allowed and not set(off.eos(ENV)) & allowed
    assert {b"a", b"Z", b"7"} <= pieces
    for tid in off.tokenizer.encode("a1B2c3D4", add_special_tokens=False):
        assert tid in _allowed(c, off) and c.accept_token(tid), c.error
    last = _allowed(c, off)  # one character left
    assert {len(off.vocab.token_bytes[t]) for t in last} == {1}
    assert c.accept_token(off.tokenizer.convert_tokens_to_ids("e"))
    assert _allowed(c, off) == {ids["[ARGS]"]}  # the id is whole: [ARGS], nothing else
    assert c.accept_token(ids["[ARGS]"])
    for tid in off.tokenizer.encode('{"cmd": "ls"}', add_special_tokens=False):
        assert c.accept_token(tid), c.error
    assert c.calls == ["shell_exec"]


@pytest.mark.parametrize("bad", ["{", "a1B2c3D4e5", "a-"])
def test_anything_else_after_call_id_is_rejected(official, bad) -> None:
    off = official("tekken_args")
    env = load_envelope(ENV)
    plan = plan_tools(TOOLS, "required", [], True, None, env)
    c = off.compiler(ENV).build(TOOLS, plan, off.eos(ENV))
    name = "shell_exec"[len(plan.prefill) - len(env.opening) :]
    for tid in off.tokenizer.encode(name, add_special_tokens=False) + [
        off.tokenizer.convert_tokens_to_ids("[CALL_ID]")
    ]:
        assert c.accept_token(tid), c.error
    ok = True
    for ch in bad:  # one character at a time: every piece a single token
        ok = c.accept_token(off.tokenizer.convert_tokens_to_ids(ch))
        if not ok:
            break
    assert not ok and c.error and "arguments of 'shell_exec'" in c.error


def test_the_alphabet_is_read_off_the_envelope_regex() -> None:
    chars, n, least = id_alphabet("[a-zA-Z0-9]{9}")
    assert n == least == 9 and len(chars) == 62 and ord("q") in chars and ord("_") not in chars
    assert id_alphabet("[0-9]{1,4}")[1:] == (4, 1)  # Kimi's running index: 1 to 4 digits
    with pytest.raises(ValueError, match="bounded length"):
        id_alphabet("[a-z]+")
    with pytest.raises(ValueError, match="at least 1"):
        id_alphabet("[0-9]{5,4}")
