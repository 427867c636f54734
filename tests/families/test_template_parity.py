"""Our prompt tokens == the chat template shipped with the weights, token for token.

The official side is the vendor's own chat template (tests/fixtures/templates/, see the
README there for where each comes from and its licence) rendered by transformers'
``apply_chat_template`` on the messages as vLLM prepares them: the request exactly as an SDK
sends it (keys in the client's order, nothing sorted on either side), tool-call arguments
turned from JSON strings into dicts (vLLM does so before every template). Our side is the
family file, rendered by the server's renderer, tokenized by the same vocabulary.

Where a template cannot express a case, the test says so and checks what we do instead
(``UNEXPRESSIBLE``): Llama 3.1's template raises on several calls in one assistant message.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from server.families.render import FamilyRenderer
from server.protocol import ChatMessage
from tests.families.conversations import conversations

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "templates"
CASES = conversations()


def _vocab(name: str) -> Any:
    from server.families import tokenizers

    return {"llama3": tokenizers.llama3_tokenizer, "qwen": tokenizers.qwen_tokenizer}[name]()


# family ref -> (template file, vocabulary, extra template arguments)
PAIRS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama3_json": ("llama-3.1-instruct.jinja", "llama3", {"date_string": "26 Jul 2024"}),
    "hermes:qwen2.5": ("qwen2.5-instruct.jinja", "qwen", {}),
    "hermes:qwen3": ("qwen3.jinja", "qwen", {}),
}


def vllm_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as vLLM hands them to a chat template (string content format): a missing
    or null content is "" (the text parts joined), tool-call arguments parsed into dicts."""
    out = []
    for m in messages:
        m = {**m, "content": m.get("content") or ""}
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def unexpressible(ref: str, messages: list[dict[str, Any]]) -> str | None:
    """Why the vendor template cannot render this conversation, or None."""
    if ref == "llama3_json" and any(len(m.get("tool_calls") or []) > 1 for m in messages):
        return "several calls in one assistant message (the template raises)"
    return None


@pytest.fixture(scope="module")
def vocabs() -> dict[str, Any]:
    return {}


def _tokenizer(vocabs: dict[str, Any], name: str) -> Any:
    if name not in vocabs:
        vocabs[name] = _vocab(name)
    return vocabs[name]


def official_tokens(
    tok: Any, template: str, messages: list[dict], tools: list[dict], extra: dict
) -> list[int]:
    text = tok.apply_chat_template(
        vllm_messages(messages),
        tools=tools or None,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=True,
        **extra,
    )
    ids: list[int] = tok(text, add_special_tokens=False)["input_ids"]
    return ids


def our_tokens(tok: Any, ref: str, messages: list[dict], tools: list[dict]) -> list[int]:
    rendered = FamilyRenderer(ref).render([ChatMessage(**m) for m in messages], tools)
    ids: list[int] = tok(rendered.text, add_special_tokens=False)["input_ids"]
    return ids


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("ref", list(PAIRS))
def test_prompt_tokens_equal_the_vendor_template(ref: str, case: int, vocabs: dict[str, Any]) -> None:
    file, vocab, extra = PAIRS[ref]
    tok = _tokenizer(vocabs, vocab)
    template = (TEMPLATES / file).read_text()
    messages, tools = CASES[case]
    ours = our_tokens(tok, ref, messages, tools)
    why = unexpressible(ref, messages)
    if why is not None:
        with pytest.raises(Exception, match="single tool-calls"):
            official_tokens(tok, template, messages, tools, extra)
        _check_split_calls(tok, ref, template, messages, tools, extra, ours)
        return
    want = official_tokens(tok, template, messages, tools, extra)
    assert ours == want, (tok.decode(ours), tok.decode(want))


def _check_split_calls(
    tok: Any, ref: str, template: str, messages: list[dict], tools: list[dict], extra: dict, ours: list[int]
) -> None:
    """Llama: several calls render as consecutive one-call assistant turns, token for token
    what the template writes for that (equivalent) conversation."""
    split: list[dict[str, Any]] = []
    for m in messages:
        calls = m.get("tool_calls") or []
        if len(calls) > 1:
            split += [{**m, "tool_calls": [c]} for c in calls]
        else:
            split.append(m)
    assert ours == official_tokens(tok, template, split, tools, extra)


def test_llama_date_is_pinned_not_the_clock() -> None:
    messages, tools = CASES[0]
    msgs = [ChatMessage(**m) for m in messages]
    assert "Today Date: 26 Jul 2024" in FamilyRenderer("llama3_json").render(msgs, tools).text
    later = FamilyRenderer("llama3_json", date="1 Jan 2030").render(msgs, tools).text
    assert "Today Date: 1 Jan 2030" in later


def test_corpus_covers_the_features() -> None:
    """The corpus has what the parity must cover (so it means something)."""
    calls = [c for msgs, _ in CASES for m in msgs for c in m.get("tool_calls") or []]
    args = [c["function"]["arguments"] for c in calls]
    assert len(CASES) >= 30
    assert any(msgs[0]["role"] == "system" for msgs, _ in CASES)
    assert any(msgs[0]["role"] == "user" for msgs, _ in CASES)
    assert any(len(t) >= 3 for _, t in CASES) and any(not t for _, t in CASES)
    assert any("parameters" not in t["function"] for _, ts in CASES for t in ts)  # no parameters
    assert any(len(m.get("tool_calls") or []) > 1 for msgs, _ in CASES for m in msgs)  # parallel
    assert any(not a.isascii() for a in args) and any('\\"' in a and "\\n" in a for a in args)
    assert any(list(json.loads(a)) != sorted(json.loads(a)) for a in args)  # keys not sorted
    assert any(len(m.get("content") or "") > 5000 for msgs, _ in CASES for m in msgs)  # long result
    assert any(sum(m["role"] == "user" for m in msgs) >= 3 for msgs, _ in CASES)
    assert any(m["role"] == "assistant" and m.get("content") for msgs, _ in CASES for m in msgs)


def parity_counts(
    renderer: Callable[[str, list[dict], list[dict]], str] | None = None,
) -> dict[str, tuple[int, int]]:
    """(equal, expressible) per family over the corpus: for the report (python -m ...)."""
    out = {}
    vocabs: dict[str, Any] = {}
    for ref, (file, vocab, extra) in PAIRS.items():
        tok = _tokenizer(vocabs, vocab)
        template = (TEMPLATES / file).read_text()
        equal = total = 0
        for messages, tools in CASES:
            if unexpressible(ref, messages):
                continue
            total += 1
            try:
                text = (
                    renderer(ref, messages, tools)
                    if renderer
                    else FamilyRenderer(ref).render([ChatMessage(**m) for m in messages], tools).text
                )
            except Exception:
                continue
            if tok(text, add_special_tokens=False)["input_ids"] == official_tokens(
                tok, template, messages, tools, extra
            ):
                equal += 1
        out[ref] = (equal, total)
    return out


if __name__ == "__main__":
    for ref, (equal, total) in parity_counts().items():
        print(f"{ref}: {equal}/{total}")
