"""Mistral reasoning (Magistral 2509 / Ministral 3: ``mistral:v13_think``) as family data.

Prompt: token for token mistral-common's ``encode_chat_completion`` with the reasoning as a
``ThinkChunk`` before the turn's text (every past turn's: mistral-common keeps them all), on
the bundled tekken vocabulary labelled v13 with [THINK] / [/THINK] as Magistral's tekken.json
has them. Detection: a v13 vocabulary with both tokens. Masks: the reasoning gate lets the model
think inside [THINK]…[/THINK] (special tokens) and then call; the reply parser keeps the
reasoning out of the content and never reads a call inside it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from server.chat.reasoning_reply import ReasoningSplitter
from server.chat.toolcalls import parse_tool_calls
from server.constrain.plan import ReasoningPlan, ToolPlan
from server.families.envelope import load_envelope
from server.families.family import load_family
from server.families.render import FamilyRenderer
from server.protocol import ChatMessage

pytest.importorskip("mistral_common")
from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer  # noqa: E402

REF = "mistral:v13_think"
FAMILY = load_family(REF)
R = FAMILY.reasoning
ENVELOPE = load_envelope(FAMILY.envelope)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}},
                "required": ["path"],
            },
        },
    }
]
# the masks' walk: an enum keeps the random arguments short
MASK_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "enum": ["a.txt", "é.txt"]}},
                "required": ["path"],
            },
        },
    }
]
CALL = {
    "id": "a1B2c3D4e",
    "type": "function",
    "function": {"name": "read_file", "arguments": '{"path": "é.txt"}'},
}
CASES: list[tuple[list[dict], list[dict]]] = [
    (  # newlines around the reasoning and before the text: kept as written (trim: false)
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "\n\nHello!", "reasoning_content": "\nThe user greets me.\n"},
            {"role": "user", "content": "Again"},
        ],
        [],
    ),
    (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "The user greets me."},
            {"role": "user", "content": "Again"},
        ],
        [],
    ),
    (
        [
            {"role": "system", "content": "Think first."},
            {"role": "user", "content": "Read é.txt"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "I need the file.",
                "tool_calls": [CALL],
            },
            {"role": "tool", "tool_call_id": "a1B2c3D4e", "content": 'line 1\nline "2"'},
            {
                "role": "assistant",
                "content": "It has 2 lines.",
                "reasoning_content": "Two lines, one quoted.",
            },
            {"role": "user", "content": "Thanks"},
        ],
        TOOLS,
    ),
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from server.families.tokenizers import write_tekken
    from tests.tokenizer_cache import tekken  # converted once, cached on disk by the file's hash

    path = write_tekken("v13_think", tmp_path_factory.mktemp("tekken") / "tekken.json")
    return MistralTokenizer.from_file(str(path)), tekken(path), path


def _official(messages: list[dict], tools: list[dict]) -> ChatCompletionRequest:
    """The OpenAI messages with each reasoning as a ThinkChunk before the text (mistral-common's form)."""
    out = []
    for m in messages:
        m = dict(m)
        thought = m.pop("reasoning_content", None)
        if m.get("tool_calls"):
            m["content"] = None
        if thought is not None:
            text = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            m["content"] = [{"type": "thinking", "thinking": thought}, *text]
        out.append(m)
    return ChatCompletionRequest.from_openai(messages=out, tools=tools or None)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_prompt_tokens_equal_mistral_common_with_think_chunks(case: int, tokenizers) -> None:
    official, ours, _ = tokenizers
    messages, tools = CASES[case]
    rendered = FamilyRenderer(REF).render([ChatMessage(**m) for m in messages], tools)
    got = ours(rendered.text, add_special_tokens=False)["input_ids"]
    want = official.encode_chat_completion(_official(messages, tools)).tokens
    assert got == want, (ours.convert_ids_to_tokens(got), ours.convert_ids_to_tokens(want))
    think = ours.convert_tokens_to_ids("[THINK]")
    assert got.count(think) == sum(1 for m in messages if m.get("reasoning_content"))  # every turn's


def test_detected_by_the_think_tokens_of_a_v13_vocabulary(tokenizers, tmp_path) -> None:
    from server.families.select import ModelFacts, _version
    from server.families.tokenizers import write_tekken

    _, ours, _ = tokenizers
    base = load_family("mistral")
    vocab = frozenset(ours.get_vocab())
    template = "{{ '[SYSTEM_PROMPT]Think inside [THINK]…[/THINK] first.' }}"  # as Magistral's default prompt

    def version(tokens: frozenset[str], tekken: str, chat_template: str = template) -> str | None:
        return _version(
            base, ModelFacts(special_tokens=tokens, chat_template=chat_template, tekken_version=tekken)
        )

    assert version(vocab, "v13") == "v13_think"
    assert version(vocab - {"[THINK]", "[/THINK]"}, "v13") == "v13"
    assert version(vocab, "v13", chat_template="") == "v13"  # the tokens alone: not a reasoning model
    assert version(vocab, "v11") == "v11"  # the rule refines v13 only
    assert json.loads(write_tekken("v13", tmp_path / "t.json").read_text())["config"]["version"] == "v13"


def _walk(c, vocab, seed: int, steps: int) -> list[int]:
    rng = np.random.default_rng(seed)
    ids: list[int] = []
    for _ in range(steps):
        bm = np.zeros((1, vocab.words), dtype=np.int32)
        c.fill_next_token_bitmask(bm, 0)
        allowed = np.flatnonzero(np.unpackbits(bm[0].view(np.uint8), bitorder="little")[: vocab.vocab_size])
        tid = int(rng.choice(allowed))
        assert c.accept_token(tid), c.error
        ids.append(tid)
        if c.is_terminated():
            break
    return ids


@pytest.fixture(scope="module")
def compiler(tokenizers):
    from server.constrain.envelope_compiler import EnvelopeCompiler

    return EnvelopeCompiler(tokenizers[1], len(tokenizers[1]), ENVELOPE)


@pytest.mark.parametrize("seed", range(3))
def test_masks_let_it_think_then_call(tokenizers, compiler, seed: int) -> None:
    _, ours, _ = tokenizers
    eos = (ours.convert_tokens_to_ids("</s>"),)
    plan = ToolPlan(
        "required", ("read_file",), False, ENVELOPE.opening, None, ReasoningPlan(R.open, R.close, 6)
    )
    ids = _walk(compiler.build(MASK_TOOLS, plan, eos), compiler.vocab, seed, steps=80)
    think, close = ours.convert_tokens_to_ids(["[THINK]", "[/THINK]"])
    assert ids[0] == think and close in ids[1:8], ours.convert_ids_to_tokens(ids)
    text = ours.decode(ids[:-1] if ids[-1] in eos else ids, skip_special_tokens=False)
    splitter = ReasoningSplitter(ReasoningPlan(R.open, R.close))
    answer = splitter.feed(text)[1] + splitter.finish()[1]
    assert splitter.reasoning is not None and "[THINK]" not in answer and "[/THINK]" not in answer
    parsed = parse_tool_calls(answer, ENVELOPE, MASK_TOOLS)
    assert [c.name for c in parsed.tool_calls] == ["read_file"] and not parsed.content, text
    assert json.loads(parsed.tool_calls[0].arguments)["path"] in ("a.txt", "é.txt")


def test_a_call_written_inside_the_reasoning_is_reasoning() -> None:
    body = '[TOOL_CALLS]read_file[ARGS]{"path": "x"}'
    splitter = ReasoningSplitter(ReasoningPlan(R.open, R.close))
    answer = splitter.feed(R.open + body + R.close + "Done.")[1] + splitter.finish()[1]
    assert splitter.reasoning == body and answer == "Done."
    assert parse_tool_calls(answer, ENVELOPE, TOOLS).tool_calls == ()


def test_the_reply_splits_as_written_and_renders_back_the_same() -> None:
    """trim: false — the reasoning and the answer keep their newlines, so the history renders the
    turn exactly as the model wrote it (streamed in any chunks, the same split)."""
    written = R.open + "\nStep 1.\n\n" + R.close + "\n\nHello!"
    whole = ReasoningSplitter(ReasoningPlan(R.open, R.close, None, trim=R.trim))
    answer = whole.feed(written)[1] + whole.finish()[1]
    assert (whole.reasoning, answer) == ("\nStep 1.\n\n", "\n\nHello!")
    streamed = ReasoningSplitter(ReasoningPlan(R.open, R.close, None, trim=R.trim))
    parts = [streamed.feed(written[i : i + 3]) for i in range(0, len(written), 3)] + [streamed.finish()]
    assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == (whole.reasoning, answer)
    assert R.split(written) == (whole.reasoning, answer) and R.render(*R.split(written)) == written
    turn = ChatMessage(role="assistant", content=answer, reasoning_content=whole.reasoning)
    rendered = FamilyRenderer(REF).render([ChatMessage(role="user", content="Hi"), turn], None).text
    assert written + "</s>" in rendered
