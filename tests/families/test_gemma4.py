"""Gemma 4: the prompt is the model's own chat template, the calls are written under our masks.

* The prompt: our sandboxed renderer of a model's template (``model_family``'s ``template`` path,
  which the ``gemma4`` family uses) writes what transformers' ``apply_chat_template`` writes with
  vLLM's ``examples/tool_chat_template_gemma4.jinja`` (grammars/templates/gemma4.jinja) on the
  corpus as an SDK sends it, token for token on the test vocabulary (SmolLM2's + Gemma 4's
  special tokens: no Gemma 4 vocabulary can be fetched here).
* The calls: seeded random walks through the masks (``required``, a named tool, ``auto`` with
  parallel calls) write ``<|tool_call>call:NAME{…}<tool_call|>`` whose arguments follow the
  schema; the reply parser reads them back; the text is exactly what the template renders for
  those arguments (the history writes the reply back unchanged). vLLM's own ``gemma4`` parser
  reads the same calls: tests/engines/vllm/test_gemma4_parser.py.
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from server.chat.toolcalls import parse_tool_calls
from server.constrain.envelope_compiler import EnvelopeCompiler
from server.constrain.plan import ToolPlan
from server.families.envelope import load_envelope
from server.families.family import load_family
from server.families.gemma_arguments import parse_gemma_arguments, render_gemma_arguments
from server.families.model_template import ModelTemplateRenderer
from server.families.select import ModelFacts, detect_family
from server.families.test_model import family_test_tokenizer
from server.package_data import GRAMMARS_DIR
from server.protocol import ChatMessage
from tests.families.conversations import conversations
from tests.families.test_template_parity import vllm_messages

FAMILY = load_family("gemma4")
ENV = load_envelope("gemma4")
TEMPLATE = (GRAMMARS_DIR / "templates" / "gemma4.jinja").read_text()


def _tool(name: str, params: dict | None) -> dict:
    fn: dict = {"name": name, "description": name}
    if params is not None:
        fn["parameters"] = params
    return {"type": "function", "function": fn}


# what a Gemma call's arguments can hold: free strings (any text but the delimiter), enums,
# integers, numbers, booleans, nested objects, arrays, optional keys, upper-case keys (dictsort)
TOOLS = [
    _tool(
        "shell_exec",
        {
            "type": "object",
            "properties": {
                "cmd": {"type": "string"},
                "timeout": {"type": "integer"},
                "Cwd": {"type": "string"},
            },
            "required": ["cmd"],
        },
    ),
    _tool(
        "browser_open",
        {
            "type": "object",
            "properties": {
                "url": {"type": "string", "enum": ['https://a.org/ü?q="1"', "https://b.org"]},
                "opts": {
                    "type": "object",
                    "properties": {"wait": {"type": "number"}, "all": {"type": "boolean"}},
                    "required": ["all"],
                },
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["url", "opts"],
        },
    ),
    _tool("list_tabs", None),
]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in TOOLS}
NAMES = tuple(SCHEMAS)


@pytest.fixture(scope="module")
def gemma():
    tok = family_test_tokenizer("gemma4")
    return tok, EnvelopeCompiler(tok, len(tok), ENV)


def walk(gemma, plan: ToolPlan, seed: int, steps: int = 200) -> tuple[str, bool]:
    """A seeded random walk through the masks: (the text written, whether it ended by itself)."""
    tok, compiler = gemma
    eos = tuple(tok.convert_tokens_to_ids(t) for t in ENV.end_tokens)
    c = compiler.build(TOOLS, plan, eos)
    specials = {tok.convert_tokens_to_ids(t) for t in ENV.special_tokens} - set(eos)
    rng = np.random.default_rng(seed)
    out: list[int] = []
    for _ in range(steps):
        bm = np.zeros((1, compiler.vocab.words), dtype=np.int32)
        c.fill_next_token_bitmask(bm, 0)
        allowed = np.flatnonzero(np.unpackbits(bm[0].view(np.uint8), bitorder="little")[: len(tok)])
        # a uniform pick would almost never close a free string (one token in the vocabulary does):
        # special tokens (the delimiter, the call's close) and one-byte tokens (",", "}") are favoured
        special = [i for i in allowed if i in specials]
        short = [i for i in allowed if len(compiler.vocab.token_bytes[i]) == 1]
        r = rng.random()
        pool = special if r < 0.25 and special else short if r < 0.6 and short else allowed
        t = int(rng.choice(pool))
        assert c.accept_token(t), c.error
        if t in eos:
            return str(tok.decode(out, skip_special_tokens=False)), True
        out.append(t)
        if c.is_terminated():
            return str(tok.decode(out, skip_special_tokens=False)), True
    return str(tok.decode(out, skip_special_tokens=False)), False


def _plans() -> list[tuple[str, ToolPlan]]:
    return [
        ("required", ToolPlan("required", NAMES, False, ENV.opening)),
        ("named", ToolPlan("required", ("browser_open",), False, ENV.opening + "browser_open")),
        ("parallel", ToolPlan("required", NAMES, True, ENV.opening)),
    ]


@pytest.mark.parametrize(("label", "plan"), _plans())
@pytest.mark.parametrize("seed", range(8))
def test_masks_write_calls_the_parser_reads_and_the_template_renders_back(gemma, label, plan, seed) -> None:
    text, ended = walk(gemma, plan, seed)
    reply = plan.prefill + text
    parsed = parse_tool_calls(reply, ENV, TOOLS)
    if not ended:  # cut by the step budget: the calls written so far are whole
        pytest.skip("the walk ran out of steps inside a call") if not parsed.tool_calls else None
    assert parsed.tool_calls, reply
    for call in parsed.tool_calls:
        assert call.name in plan.allowed
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    if ended:
        assert parsed.content is None, reply  # required: nothing but calls
        # the history writes the reply back as it was written (the template's format_argument)
        again = ENV.render_calls([(c.name, c.arguments, "") for c in parsed.tool_calls])
        assert again == reply


@pytest.mark.parametrize("seed", range(6))
def test_auto_gives_text_or_calls_and_none_gives_no_call(gemma, seed) -> None:
    text, _ = walk(gemma, ToolPlan("auto", NAMES, True, ""), seed, steps=40)
    for call in parse_tool_calls(text, ENV, TOOLS).tool_calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    none, _ = walk(gemma, ToolPlan("none", (), True, ""), seed, steps=20)
    assert "<|tool_call>" not in none and not parse_tool_calls(none, ENV, TOOLS).tool_calls


@pytest.mark.parametrize(
    "args",
    [
        {"cmd": "echo \"hi\"\nprintf '%s' ü € 🙂 <tag> {x} [y]", "timeout": 30, "Cwd": "/tmp"},
        {"url": "https://b.org", "opts": {"all": False, "wait": -0.25}, "tags": ["a", "b,c", ""]},
        {},
    ],
)
def test_arguments_render_as_the_template_and_parse_back(args: dict) -> None:
    """``render_gemma_arguments`` is the template's ``format_argument`` (dictsort, <|"|> strings)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    call = {
        "role": "assistant",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}],
    }
    rendered = _compile_jinja_template(TEMPLATE).render(
        messages=[call], bos_token="", add_generation_prompt=False
    )
    body = render_gemma_arguments(json.dumps(args))
    assert f"<|tool_call>call:f{{{body}}}<tool_call|>" in rendered
    assert parse_gemma_arguments(body) == args


def test_detected_from_the_vocabulary() -> None:
    specials = frozenset(["<|im_start|>", "<|im_end|>", *FAMILY.test_model["add_special"]])
    found = detect_family(ModelFacts(special_tokens=specials))
    assert found is not None and found.family.ref == "gemma4"
    assert detect_family(ModelFacts(special_tokens=specials - {'<|"|>'})).family.ref == "hermes"  # type: ignore[union-attr]


CASES = conversations()


@pytest.mark.parametrize("case", range(len(CASES)))
def test_prompt_equals_apply_chat_template(gemma, case: int) -> None:
    tok, _ = gemma
    messages, tools = CASES[case]
    ours = ModelTemplateRenderer(TEMPLATE, {"bos_token": tok.bos_token}).render(
        [ChatMessage(**m) for m in messages], tools
    )
    want = tok.apply_chat_template(
        vllm_messages(messages),
        tools=tools or None,
        chat_template=TEMPLATE,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert ours.text == want
    assert (
        tok(ours.text, add_special_tokens=False)["input_ids"]
        == tok(want, add_special_tokens=False)["input_ids"]
    )


def test_a_tool_loop_stays_in_the_model_turn_and_the_call_renders_as_written(gemma) -> None:
    """After a call the model writes <|tool_response> (an end token); the next prompt has the call
    as written, then the results, and no new turn header (the template's layout)."""
    tok, _ = gemma
    args = '{"cmd": "ls", "timeout": 3}'
    call = {"id": "c1", "type": "function", "function": {"name": "shell_exec", "arguments": args}}
    head = [{"role": "user", "content": "list"}]
    loop = [
        *head,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    ]
    r = ModelTemplateRenderer(TEMPLATE, {"bos_token": tok.bos_token})
    prompt = r.render([ChatMessage(**m) for m in head], TOOLS).text
    after = r.render([ChatMessage(**m) for m in loop], TOOLS).text
    reply = ENV.render_calls([("shell_exec", '{"cmd": "ls", "timeout": 3}', "")])
    assert prompt.endswith("<|turn>model\n<|channel>thought\n<channel|>")  # thinking off: an empty thought
    # the template drops that empty thought from the history: the turn re-renders from its header on
    base = prompt[: -len("<|channel>thought\n<channel|>")]
    assert after == base + reply + '<|tool_response>response:shell_exec{value:<|"|>a.py<|"|>}<tool_response|>'


@pytest.mark.parametrize("seed", range(3))
def test_streamed_reply_parses_as_the_whole(gemma, seed) -> None:
    """Fed a character at a time (as a stream delivers it), the parser gives the same calls and no
    content: a call is released only once its close tag is read."""
    from server.chat.toolcalls import CallDelta, ContentDelta, StreamingToolCallParser

    plan = ToolPlan("required", NAMES, True, ENV.opening)
    text, _ = walk(gemma, plan, seed)
    reply = plan.prefill + text
    parser = StreamingToolCallParser(ENV, TOOLS)
    events = [e for ch in reply for e in parser.feed(ch)] + parser.finish(unfinished_as_content=False)
    streamed = [e.call for e in events if isinstance(e, CallDelta)]
    whole = StreamingToolCallParser(ENV, TOOLS)
    whole.feed(reply)
    assert streamed == whole.calls and streamed
    assert not "".join(e.text for e in events if isinstance(e, ContentDelta)).strip()
