"""The tool matcher on the real tokenizer: scripted token sequences through every phase."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from server.chat.tool_choice import ToolPlan, plan_tools
from server.constrain.errors import ConstraintError
from server.constrain.tool_matcher import Phase
from server.constrain.vocab import TokenVocab
from server.engines.base import constraint_errors_as_400
from server.errors import InvalidRequest

from .decode import EOS


def plan(tools, choice, hermes, parallel=False):
    return plan_tools(tools, choice, [{"role": "user", "content": "hi"}], parallel, None, hermes)


def feed(constraint, tokenizer, text: str) -> bool:
    """Feed the natural tokenization of text; also check each token was in the mask first."""
    bitmask = xgr.allocate_token_bitmask(1, len(tokenizer))
    for tid in tokenizer.encode(text):
        constraint.fill_next_token_bitmask(bitmask, 0)
        allowed = TokenVocab.unpack(bitmask[0].numpy(), len(tokenizer))
        accepted = constraint.accept_token(tid)
        assert accepted == (tid in allowed), (tokenizer.decode([tid]), constraint.error)
        if not accepted:
            return False
    return True


def mask_of(constraint, tokenizer) -> set[int]:
    bitmask = xgr.allocate_token_bitmask(1, len(tokenizer))
    constraint.fill_next_token_bitmask(bitmask, 0)
    return TokenVocab.unpack(bitmask[0].numpy(), len(tokenizer))


def test_required_call_with_crossing_tokens(compiler, tokenizer, swe_tools, hermes):
    p = plan(swe_tools, "required", hermes)
    assert p.prefill == '<tool_call>\n{"name": "'
    c = compiler.build(swe_tools, p, EOS)
    # natural tokens: 'open' '_' 'site' '",' (crossing) 'Ġ"' 'arguments' ... '}}' (crossing)
    assert feed(c, tokenizer, 'open_site", "arguments": {"url": "https://x.org"}}\n</tool_call>')
    assert c.calls == ["open_site"] and c.is_terminated() and c.error is None
    assert mask_of(c, tokenizer) == set(EOS)
    assert c.accept_token(2) and c.phase == Phase.DONE


def test_prefix_name_closes_before_its_extension(compiler, tokenizer, swe_tools, hermes):
    c = compiler.build(swe_tools, plan(swe_tools, "required", hermes), EOS)
    assert feed(c, tokenizer, 'open", "arguments": {"path": "a.py"}}\n</tool_call>')
    assert c.calls == ["open"]


def test_named_tool_is_prefilled_whole(compiler, tokenizer, swe_tools, hermes):
    p = plan(swe_tools, {"type": "function", "function": {"name": "search_dir"}}, hermes)
    assert p.prefill.endswith('"search_dir') and p.allowed == ("search_dir",)
    c = compiler.build(swe_tools, p, EOS)
    allowed = {tokenizer.decode([t]) for t in mask_of(c, tokenizer)}
    assert allowed == {'"', '",'}  # only the end of the name
    assert feed(c, tokenizer, '", "arguments": {"search_term": "x"}}\n</tool_call>')


def test_wrong_name_is_rejected_without_raising(compiler, tokenizer, prefixed_tools, hermes):
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "function", "function": {"name_prefix": "browser_"}}],
        },
    }
    p = plan(prefixed_tools, choice, hermes)
    assert p.prefill == '<tool_call>\n{"name": "browser'
    c = compiler.build(prefixed_tools, p, EOS)
    assert not feed(c, tokenizer, "_shell")  # '_' fine, 'shell' starts no browser tool
    assert "name phase" in c.error and "browser_open_site" in c.error
    assert c.accept_token(5) is False and c.is_terminated()
    assert mask_of(c, tokenizer) == set(EOS)


def test_mode_none_masks_the_call_tag(compiler, tokenizer, swe_tools, hermes):
    p = plan(swe_tools, "none", hermes)
    assert (p.mode, p.prefill) == ("none", "")
    c = compiler.build(swe_tools, p, EOS)
    assert feed(c, tokenizer, "Hello <tool_call")
    gt = tokenizer.convert_tokens_to_ids(">")
    assert gt not in mask_of(c, tokenizer)
    assert tokenizer.convert_tokens_to_ids("Ġ") in mask_of(c, tokenizer)
    assert not c.accept_token(gt) and "mode none" in c.error


def test_auto_text_then_call(compiler, tokenizer, swe_tools, hermes):
    c = compiler.build(swe_tools, plan(swe_tools, "auto", hermes), EOS)
    text = 'I will open it.<tool_call>\n{"name": "open_site", "arguments": {"url": "u"}}\n</tool_call>'
    assert feed(c, tokenizer, text)  # '.<' starts the tag inside a token
    assert c.calls == ["open_site"] and c.is_terminated()


def test_auto_plain_text_and_eos(compiler, tokenizer, swe_tools, hermes):
    c = compiler.build(swe_tools, plan(swe_tools, "auto", hermes), EOS)
    assert feed(c, tokenizer, "Just text, no call. a < b > c")
    assert set(EOS) <= mask_of(c, tokenizer)
    assert 1 not in mask_of(c, tokenizer)  # <|im_start|> is not text
    assert c.accept_token(0) and c.is_terminated()


def test_auto_subset_rejects_other_tools(compiler, tokenizer, swe_tools, hermes):
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {"name": "bash"}}]},
    }
    c = compiler.build(swe_tools, plan(swe_tools, choice, hermes), EOS)
    assert not feed(c, tokenizer, '<tool_call>\n{"name": "open')
    c = compiler.build(swe_tools, plan(swe_tools, choice, hermes), EOS)
    assert feed(c, tokenizer, '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>')


def test_arguments_follow_the_schema(compiler, tokenizer, swe_tools, hermes):
    c = compiler.build(swe_tools, plan(swe_tools, "required", hermes), EOS)
    assert feed(c, tokenizer, 'click_mouse", "arguments": {"x": 1, "y": 2, "button": "')  # schema order
    assert not feed(c, tokenizer, "middle")
    assert "arguments of 'click_mouse'" in c.error


def test_special_tokens_never_inside_arguments(compiler, tokenizer, swe_tools, hermes):
    c = compiler.build(swe_tools, plan(swe_tools, "required", hermes), EOS)
    assert feed(c, tokenizer, 'bash", "arguments": {"command": "ls')
    mask = mask_of(c, tokenizer)
    assert not mask & set(range(17)) and tokenizer.convert_tokens_to_ids("Ġ-") in mask
    assert not c.accept_token(3) and "arguments" in c.error


def test_parallel_calls(compiler, tokenizer, swe_tools, hermes):
    one = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    p = plan(swe_tools, "required", hermes, parallel=True)
    c = compiler.build(swe_tools, p, EOS)
    assert feed(c, tokenizer, one[len(p.prefill) :])
    assert not c.is_terminated() and set(EOS) <= mask_of(c, tokenizer)
    assert feed(c, tokenizer, "\n" + one.replace("ls", "pwd"))
    assert c.calls == ["bash", "bash"] and c.accept_token(2) and c.is_terminated()
    c = compiler.build(swe_tools, plan(swe_tools, "required", hermes, parallel=False), EOS)
    assert feed(c, tokenizer, one[len(p.prefill) :]) and c.is_terminated()
    assert not feed(c, tokenizer, "\n<") and "only end of sequence" in c.error


def test_tool_without_parameters_takes_an_empty_object(compiler, tokenizer, swe_tools, hermes):
    c = compiler.build(swe_tools, plan(swe_tools, "required", hermes), EOS)
    assert feed(c, tokenizer, 'submit", "arguments": {}}\n</tool_call>') and c.calls == ["submit"]
    tools = [{"type": "function", "function": {"name": "ping"}}]
    c = compiler.build(tools, plan(tools, "required", hermes), EOS)
    assert not feed(c, tokenizer, '", "arguments": {"a')


def test_no_tools_no_constraint(compiler, hermes):
    assert compiler.build([], plan([], None, hermes), EOS) is None


def test_bad_schema_is_a_400_naming_the_tool(compiler, hermes):
    tools = [{"type": "function", "function": {"name": "bad", "parameters": {"type": "strin"}}}]
    with pytest.raises(ConstraintError, match="'bad'") as err:
        compiler.build(tools, plan(tools, "required", hermes), EOS)
    assert err.value.param == "tools"
    with pytest.raises(InvalidRequest) as http, constraint_errors_as_400():  # what the client gets
        raise err.value
    assert http.value.status == 400 and http.value.param == "tools" and "'bad'" in http.value.message


def test_internal_errors_do_not_escape(compiler, swe_tools, hermes):
    c = compiler.build(swe_tools, plan(swe_tools, "required", hermes), EOS)
    assert c.accept_token(10**9) is False and c.error


def test_plan_round_trips_through_json(hermes, swe_tools):
    p = plan(swe_tools, "required", hermes)
    assert ToolPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_grammars_are_compiled_once(compiler, swe_tools, hermes):
    compiler.build(swe_tools, plan(swe_tools, "required", hermes), EOS)
    before = len(compiler.backend.cache)
    compiler.build(swe_tools, plan(swe_tools, "required", hermes), EOS)
    assert len(compiler.backend.cache) == before
    assert compiler.trie(tuple(t["function"]["name"] for t in swe_tools)) is compiler.trie(
        tuple(t["function"]["name"] for t in swe_tools)
    )
