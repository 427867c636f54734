"""Past reasoning in the prompt of a reasoning family (hermes:qwen3_thinking), against Qwen3's template.

* Default: token for token Qwen3's own chat template (tests/fixtures/templates/qwen3.jinja) on
  the parity corpus with reasoning added to the assistant turns, sent as a client sends it
  back (``reasoning_content``, or the reasoning inside ``content`` between the tags): the
  reasoning of turns before the last user message is dropped. The rendered prompt then carries
  the note ``template_rewrote_history`` naming the messages (the cache report's cue).
* ``keep_reasoning``: every turn keeps its reasoning, so each prompt of a growing session is
  a prefix of the next one (append-only), where the default's is not.
"""

from __future__ import annotations

from typing import Any

import pytest

from server.families.model_template import REWROTE_HISTORY
from server.families.render import FamilyRenderer
from server.protocol import ChatMessage
from tests.families.conversations import conversations
from tests.families.test_template_parity import TEMPLATES, official_tokens

REF = "hermes:qwen3_thinking"


def with_reasoning(messages: list[dict[str, Any]], inline: bool) -> list[dict[str, Any]]:
    """Reasoning on every assistant turn: a field, or inside the content between the tags."""
    out = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            thought = f"Step {i}: what does the user need?\nCheck the tools first."
            if inline:
                m = {**m, "content": f"<think>\n{thought}\n</think>\n\n{m.get('content') or ''}"}
            else:
                m = {**m, "reasoning_content": thought}
        out.append(m)
    return out


CASES = [c for c in conversations() if any(m["role"] == "assistant" for m in c[0])]


@pytest.fixture(scope="module")
def tok() -> Any:
    from server.families.tokenizers import qwen_tokenizer

    return qwen_tokenizer()


def _ours(tok: Any, messages: list[dict], tools: list[dict], keep: bool = False) -> tuple[list[int], Any]:
    rendered = FamilyRenderer(REF, keep_reasoning=keep).render([ChatMessage(**m) for m in messages], tools)
    return tok(rendered.text, add_special_tokens=False)["input_ids"], rendered


@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_equals_qwen3_template(tok: Any, case: int, inline: bool) -> None:
    messages, tools = CASES[case]
    messages = with_reasoning(messages, inline)
    ours, rendered = _ours(tok, messages, tools)
    want = official_tokens(tok, (TEMPLATES / "qwen3.jinja").read_text(), messages, tools, {})
    assert ours == want, (tok.decode(ours), tok.decode(want))
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    dropped = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i < last_user]
    assert (REWROTE_HISTORY in rendered.notes) == bool(dropped)
    if dropped:
        assert str(dropped) in " ".join(rendered.notes)


def test_keep_reasoning_is_append_only_and_the_default_is_not(tok: Any) -> None:
    messages, tools = next(c for c in CASES if _loop_then_user(c[0]))
    messages = with_reasoning(messages, inline=False)
    # every point where the model answers: before each assistant turn, and at the end
    cuts = [i for i, m in enumerate(messages) if m["role"] == "assistant"] + [len(messages)]
    for keep, append_only in ((True, True), (False, False)):
        prompts = [_ours(tok, messages[:n], tools, keep)[0] for n in cuts]
        pairs = list(zip(prompts, prompts[1:], strict=False))
        assert all(b[: len(a)] == a for a, b in pairs) == append_only, keep
    kept = FamilyRenderer(REF, keep_reasoning=True).render([ChatMessage(**m) for m in messages], tools)
    assert REWROTE_HISTORY not in kept.notes
    assert kept.text.count("<think>") == sum(m["role"] == "assistant" for m in messages)


def _loop_then_user(messages: list[dict]) -> bool:
    """An assistant turn that a later prompt shows (another assistant turn follows it before the
    next user message), then a new user message: the default history drops its reasoning."""
    roles = [m["role"] for m in messages]
    for i, role in enumerate(roles):
        users = [j for j in range(i + 1, len(roles)) if roles[j] == "user"]
        if role == "assistant" and users and "assistant" in roles[i + 1 : users[0]]:
            return True
    return False


def test_plain_qwen3_renders_no_reasoning_field(tok: Any) -> None:
    messages, tools = CASES[0]
    messages = with_reasoning(messages, inline=False)
    text = FamilyRenderer("hermes:qwen3").render([ChatMessage(**m) for m in messages], tools).text
    assert "<think>" not in text
