"""Llama 3 JSON tool calling: our prompt tokens == Meta's renderer (llama-models), token for token.

The official side is ``llama_models.llama3.chat_format.ChatFormat.encode_dialog_prompt`` over
``RawMessage``s, with the package's own ``Tokenizer`` (bundled tokenizer.model) and
``ToolUtils`` (calls in the json format). llama-models 0.3 ships no system-prompt generator,
so the system text and the tools turn given to it are written here from the package's
``llama3_1/prompt_format.md`` ("JSON based tool calling"), independently of our family file.
Our side renders with grammars/families/llama3_json.yaml and tokenizes the text with the HF
tokenizer built from the same tokenizer.model (server/families/tokenizers.py).
"""

from __future__ import annotations

import json

import pytest

from server.families.render import FamilyRenderer
from server.protocol import ChatMessage
from tests.families.conversations import canonical_function, conversations, sorted_args

pytest.importorskip("llama_models")
from llama_models.datatypes import RawMessage, StopReason, ToolCall  # noqa: E402
from llama_models.llama3.chat_format import ChatFormat  # noqa: E402
from llama_models.llama3.tokenizer import Tokenizer  # noqa: E402

DATE = "26 Jul 2024"
DEFAULT_SYSTEM = "You are a helpful assistant."


@pytest.fixture(scope="module")
def ours():
    from server.families.tokenizers import llama3_tokenizer

    return llama3_tokenizer()


@pytest.fixture(scope="module")
def official() -> ChatFormat:
    return ChatFormat(Tokenizer.get_instance())


def _official_messages(messages: list[dict], tools: list[dict]) -> list[RawMessage]:
    """The conversation as Meta's docs lay it out, built without our renderer."""
    first_system = messages[0]["content"] if messages[0]["role"] == "system" else DEFAULT_SYSTEM
    rest = messages[1:] if messages[0]["role"] == "system" else messages
    if tools:
        header = f"Environment: ipython\n\nCutting Knowledge Date: December 2023\nToday Date: {DATE}\n\n"
        system = f"{header}{first_system}\n"
    else:
        system = first_system
    raw = [RawMessage(role="system", content=system)]
    if tools:
        listing = "\n".join(
            json.dumps({"type": "function", "function": canonical_function(t)}, indent=4, ensure_ascii=False)
            for t in tools
        )
        raw.append(
            RawMessage(
                role="user",
                content="Answer the user's question by making use of the following functions if needed.\n"
                "If none of the function can be used, please say so.\n"
                f"Here is a list of functions in JSON format:\n{listing}\n\n"
                "Return function calls in JSON format.",
            )
        )
    for m in rest:
        if m["role"] == "assistant":
            calls = [
                ToolCall(
                    call_id=c["id"],
                    tool_name=c["function"]["name"],
                    arguments=sorted_args(c["function"]["arguments"]),
                )
                for c in m.get("tool_calls") or []
            ]
            stop = StopReason.end_of_message if calls else StopReason.end_of_turn
            raw.append(
                RawMessage(
                    role="assistant", content=m.get("content") or "", tool_calls=calls, stop_reason=stop
                )
            )
        else:
            raw.append(RawMessage(role=m["role"], content=m["content"]))
    return raw


CASES = conversations()


@pytest.mark.parametrize("case", range(len(CASES)))
def test_prompt_tokens_equal_llama_models(case: int, ours, official: ChatFormat) -> None:
    messages, tools = CASES[case]
    rendered = FamilyRenderer("llama3_json").render([ChatMessage(**m) for m in messages], tools)
    got = ours(rendered.text, add_special_tokens=False)["input_ids"]
    want = official.encode_dialog_prompt(_official_messages(messages, tools)).tokens
    assert got == want, (rendered.text, official.tokenizer.decode(want))


def test_corpus_covers_the_features() -> None:
    """The corpus has what the issue asks for (so the parity above means something)."""
    n_calls = [sum(len(m.get("tool_calls") or []) for m in msgs) for msgs, _ in CASES]
    multi = [any(len(m.get("tool_calls") or []) > 1 for m in msgs) for msgs, _ in CASES]
    assert len(CASES) >= 20
    assert any(msgs[0]["role"] == "system" for msgs, _ in CASES) and any(
        msgs[0]["role"] == "user" for msgs, _ in CASES
    )
    assert any(t for _, t in CASES) and any(not t for _, t in CASES)
    assert any(n == 1 for n in n_calls) and any(multi)
    assert any(sum(m["role"] == "user" for m in msgs) >= 3 for msgs, _ in CASES)
    assert any(m["role"] == "tool" for msgs, _ in CASES for m in msgs)
    assert any(m["role"] == "assistant" and m.get("content") for msgs, _ in CASES for m in msgs)


def test_date_is_pinned_not_the_clock() -> None:
    messages, tools = CASES[0]
    msgs = [ChatMessage(**m) for m in messages]
    assert "Today Date: 26 Jul 2024" in FamilyRenderer("llama3_json").render(msgs, tools).text
    assert (
        "Today Date: 1 Jan 2030" in FamilyRenderer("llama3_json", date="1 Jan 2030").render(msgs, tools).text
    )
