"""Deterministic prompt rendering for the chat service: the model family's renderer.

The layout of every family is data (grammars/families/NAME.yaml) rendered by one
renderer (server/families/render.py). ``render_chat`` keeps the old call shape: the third
argument is a family (name, ``Family`` or ``FamilyRenderer``) or, as before, an
``Envelope`` whose family has the same name (``hermes``).

Fidelity: the client's JSON is rendered in the client's key order (as the vendors' chat
templates do), with fixed separators; nothing time-dependent is added. The rendered text
carries labelled segments so a cache miss can be explained ("system message changed at character 41").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from server.families.defaults import DEFAULT_FAMILY
from server.families.envelope import Envelope
from server.families.family import Family, load_family
from server.families.render import renderer_for, template_arguments
from server.families.rendered import PromptRenderer, RenderedPrompt
from server.protocol import ChatMessage

__all__ = ["GENERATION_PROMPT", "template_arguments", "render_chat"]

GENERATION_PROMPT = load_family(DEFAULT_FAMILY).layout.generation_prompt


def _renderer(family: Envelope | Family | PromptRenderer | str) -> PromptRenderer:
    if isinstance(family, PromptRenderer):  # a FamilyRenderer or a ModelTemplateRenderer
        return family
    if isinstance(family, Envelope):
        return renderer_for(family.name)
    if isinstance(family, Family):
        return renderer_for(family.ref)
    return renderer_for(family)


def render_chat(
    messages: Sequence[ChatMessage],
    tools: Sequence[dict[str, Any]] | None,
    family: Envelope | Family | PromptRenderer | str = DEFAULT_FAMILY,
    add_generation_prompt: bool = True,
    reasoning_effort: str | None = None,
) -> RenderedPrompt:
    return _renderer(family).render(messages, tools, add_generation_prompt, reasoning_effort)
