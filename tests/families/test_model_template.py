# ruff: noqa: E501  (templates are written out literally)
"""model_family: model: the model's own chat template, with our guarantees."""

from __future__ import annotations

import json

import pytest

from server.errors import InvalidRequest
from server.families.model_template import REWROTE_HISTORY, ModelTemplateRenderer
from server.families.render import FamilyRenderer
from server.families.select import select_family
from server.protocol import ChatMessage

# A small Llama-3.2-style template (written for this test): it reads the clock with
# strftime_now and writes tools and call arguments with tojson.
CLOCK = (
    "{{ bos_token }}{% set d = strftime_now('%d %b %Y') %}<|start_header_id|>system<|end_header_id|>\n\n"
    "Today Date: {{ d }}\n{% if tools %}{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}<|eot_id|>"
    "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson }}{% endfor %}"
    "{% else %}{{ m.content }}{% endif %}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# Qwen3-style: the reasoning of earlier assistant turns is dropped once a later user turn exists.
DROPS_THINKING = (
    "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}"
    "{% endif %}{% endfor %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and loop.index0 < ns.last %}{{ m.content.split('</think>')[-1] }}"
    "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _msgs(*items: dict) -> list[ChatMessage]:
    return [ChatMessage(**m) for m in items]


def test_clock_is_pinned_and_json_keeps_the_clients_key_order() -> None:
    r = ModelTemplateRenderer(CLOCK, {"bos_token": "<s>"}, date="3 Mar 2025")
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "b": 1, "a": 2}}}
    ]
    msgs = _msgs(
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": '{"z": 1, "a": 2}'}}],
        },
    )
    out = r.render(msgs, tools)
    assert "Today Date: 03 Mar 2025" in out.text
    assert '{"z": 1, "a": 2}' in out.text  # arguments: an object, the client's key order
    assert json.dumps(tools[0]) in out.text  # tools: as sent, nothing sorted
    assert (
        out.text
        == ModelTemplateRenderer(CLOCK, {"bos_token": "<s>"}, date="3 Mar 2025").render(msgs, tools).text
    )
    assert [s.label for s in out.segments] == ["message 0 (user)", "message 1 (assistant)"]
    assert out.notes == ()


def test_a_template_that_rewrites_history_is_detected() -> None:
    r = ModelTemplateRenderer(DROPS_THINKING)
    turn1 = _msgs({"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>hm</think>ok"})
    assert r.render(turn1, None).notes == ()
    turn2 = _msgs(*[m.model_dump() for m in turn1], {"role": "user", "content": "b"})
    out = r.render(turn2, None)
    assert REWROTE_HISTORY in out.notes
    assert not out.text.startswith(r.render(turn1, None, add_generation_prompt=False).text)


def test_template_errors_and_bad_arguments_are_400s() -> None:
    r = ModelTemplateRenderer("{{ raise_exception('only user/assistant roles') }}")
    with pytest.raises(InvalidRequest, match="only user/assistant roles"):
        r.render(_msgs({"role": "user", "content": "x"}), None)
    bad = _msgs(
        {"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{nope"}}]}
    )
    with pytest.raises(InvalidRequest, match="not JSON"):
        ModelTemplateRenderer(CLOCK).render(bad, None)


def test_unknown_model_with_a_template_falls_back_to_it(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    (tmp_path / "chat_template.jinja").write_text(CLOCK)
    assert select_family("auto", tmp_path, None).family.ref == "template"
    assert select_family("model", tmp_path, None).family.ref == "template"


def test_family_renderer_and_model_template_agree_on_a_chatml_template() -> None:
    """The model-template path renders a plain ChatML template like the hermes family (no tools)."""
    chatml = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    msgs = _msgs({"role": "system", "content": "s"}, {"role": "user", "content": "u"})
    assert (
        ModelTemplateRenderer(chatml).render(msgs, None).text
        == FamilyRenderer("hermes").render(msgs, []).text
    )


@pytest.mark.slow  # heavy for the main suite's ~10 min (CI runs it in the slow step)
def test_a_long_conversation_renders_a_linear_number_of_prefixes(monkeypatch) -> None:
    """Every prefix used to be rendered (quadratic: 4,096 messages ~ 8M message renders)."""
    from server.families import model_template

    r = ModelTemplateRenderer(DROPS_THINKING.replace("m.content.split('</think>')[-1]", "m.content"))
    calls: list[int] = []
    real = r._render
    monkeypatch.setattr(r, "_render", lambda msgs, *a: calls.append(len(msgs)) or real(msgs, *a))
    n = 1000
    msgs = _msgs(*({"role": ("user", "assistant")[i % 2], "content": f"turn {i}"} for i in range(n)))
    out = r.render(msgs, None)
    assert len(calls) <= model_template.TAIL + model_template.SPREAD + 2
    assert sum(calls) <= 3 * n * (model_template.SPREAD + model_template.TAIL) // 2  # linear in n
    # the segments tile the text up to the generation prompt; the tail is labelled message by message
    assert out.segments[0].start == 0
    assert all(a.end == b.start for a, b in zip(out.segments, out.segments[1:], strict=False))
    assert out.segments[-1].label == f"message {n - 1} (assistant)"
    # a message deep in the history falls in one span that names it
    span = next(s for s in out.segments if s.start <= out.text.index("turn 100<") < s.end)
    first, last = (int(x) for x in span.label.split()[1].split("-"))
    assert first <= 100 <= last and last - first < n // model_template.SPREAD + 2


def test_prefix_points_cover_every_message_of_a_short_conversation() -> None:
    from server.families.model_template import prefix_points

    assert prefix_points(5) == [1, 2, 3, 4, 5]
    pts = prefix_points(1000)
    assert pts == sorted(set(pts)) and pts[-1] == 1000 and pts[-64:] == list(range(937, 1001))
