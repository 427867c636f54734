"""What chat makes of the model family decided at start (``families/model_facts.py``): the tool-call
envelope and the prompt renderer."""

from __future__ import annotations

import logging
from typing import Any

from server.config import ConfigError, Settings
from server.families.model_template import ModelTemplateRenderer
from server.families.render import FamilyRenderer
from server.families.rendered import PromptRenderer
from server.families.select import Selection, chat_template_of, is_template
from server.model_store import EMBEDDED, tokenizer_folder

log = logging.getLogger(__name__)


def envelope_name(settings: Settings, selection: Selection) -> str | None:
    """The family's envelope, unless the config names one explicitly (the family's own name too);
    None: no envelope (``model_family: template`` on a model no family matches, and none configured):
    tool calls are neither masked nor parsed."""
    if settings.envelope is not None:
        return settings.envelope
    return selection.family.envelope or None


def tool_calls_note(envelope: str | None) -> str:
    """How this deployment serves tool calls, in words (the start log, ``GET /v1/models``)."""
    if envelope is not None:
        return f"masked and parsed (envelope {envelope})"
    return (
        "not masked, not parsed: no tool-call envelope fits this model (model_family: template); tools "
        "reach the prompt through the model's own chat template and its calls come back as text. "
        "Set envelope: NAME in the config (grammars/envelopes/) when one matches the model's call format"
    )


def make_renderer(settings: Settings, selection: Selection, tokenizer: Any) -> PromptRenderer:
    """The renderer of the chosen family (``template``, or a family whose ``prompt`` is
    ``model_template``: the model folder's own chat template)."""
    if not is_template(selection.family.name) and selection.family.prompt != "model_template":
        return FamilyRenderer(selection.family, keep_reasoning=settings.keep_reasoning)
    folder = None if settings.model == EMBEDDED else tokenizer_folder(settings.model, progress=False)
    template = (chat_template_of(folder) if folder else "") or str(
        getattr(tokenizer, "chat_template", "") or ""
    )
    if not template.strip():
        raise ConfigError(
            f"model family {selection.family.ref} renders with the model's own chat template "
            "(chat_template.jinja or tokenizer_config.json chat_template) and this model has none: "
            "add it, or pick another family"
        )
    specials = {
        k: str(getattr(tokenizer, k))
        for k in ("bos_token", "eos_token", "unk_token", "pad_token")
        if getattr(tokenizer, k, None) is not None
    }
    return ModelTemplateRenderer(template, specials)
