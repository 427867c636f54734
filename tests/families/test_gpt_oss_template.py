"""gpt-oss (Harmony) through ``model_family: model``: our renderer of a model's own chat template
(server/families/model_template.py) writes exactly what transformers' ``apply_chat_template``
writes with the official gpt-oss template (tests/fixtures/templates/gpt-oss.jinja, see NOTICE),
on the corpus as an SDK sends it (vLLM's message preparation), with the same pinned date.

What this does not cover: vLLM renders gpt-oss with the openai-harmony library, not with this
template (not installed here, and its o200k_harmony vocabulary cannot be fetched).
``model_family: model`` takes the masks and the parser of the family detected from the vocabulary
(``harmony`` for gpt-oss: server/families/select.py); the ``harmony`` family renders the same
prompt itself (tests/families/test_harmony_parity.py).
The template renders only the first call of an assistant message (it says "We assume max 1 tool
call per message"): conversations with several calls in one message are left out.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from server.families.model_template import DEFAULT_DATE, ModelTemplateRenderer
from server.protocol import ChatMessage
from tests.families.conversations import conversations
from tests.families.test_template_parity import vllm_messages

TEMPLATE = (Path(__file__).parent.parent / "fixtures" / "templates" / "gpt-oss.jinja").read_text()
CASES = [c for c in conversations() if all(len(m.get("tool_calls") or []) <= 1 for m in c[0])]
PINNED = datetime.strptime(DEFAULT_DATE, "%d %b %Y")


def _pinned_strftime(fmt: str) -> str:
    return PINNED.strftime(fmt)


def test_the_corpus_has_calls_and_results() -> None:
    assert len(CASES) >= 15
    assert sum(any(m.get("tool_calls") for m in msgs) for msgs, _ in CASES) >= 3


@pytest.mark.parametrize("case", range(len(CASES)))
def test_model_template_renderer_equals_apply_chat_template(tokenizer, case: int, monkeypatch) -> None:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    # the clock, pinned as the server pins it (a strftime_now argument does not reach the macros)
    monkeypatch.setitem(_compile_jinja_template(TEMPLATE).globals, "strftime_now", _pinned_strftime)
    messages, tools = CASES[case]
    ours = ModelTemplateRenderer(TEMPLATE).render([ChatMessage(**m) for m in messages], tools).text
    want = tokenizer.apply_chat_template(
        vllm_messages(messages),
        tools=tools or None,
        chat_template=TEMPLATE,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert ours == want
    assert f"Current date: {PINNED:%Y-%m-%d}" in ours and ours.endswith("<|start|>assistant")
