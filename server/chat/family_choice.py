"""What chat makes of the model family decided at start (``families/model_facts.py``): the tool-call
envelope and the prompt renderer."""

from __future__ import annotations

import logging
from typing import Any

from server.config import ConfigError, Settings
from server.families.model_template import ModelTemplateRenderer
from server.families.render import FamilyRenderer
from server.families.rendered import PromptRenderer
from server.families.select import MODEL_TEMPLATE, Selection, chat_template_of
from server.model_store import EMBEDDED, tokenizer_folder

log = logging.getLogger(__name__)


def envelope_name(settings: Settings, selection: Selection) -> str:
    """The family's envelope, unless the config names one explicitly (the family's own name too)."""
    return settings.envelope if settings.envelope is not None else selection.family.envelope


def make_renderer(settings: Settings, selection: Selection, tokenizer: Any) -> PromptRenderer:
    """The renderer of the chosen family (``model``: the model folder's own chat template)."""
    if selection.family.name != MODEL_TEMPLATE:
        return FamilyRenderer(selection.family, keep_reasoning=settings.keep_reasoning)
    folder = None if settings.model == EMBEDDED else tokenizer_folder(settings.model, progress=False)
    template = (chat_template_of(folder) if folder else "") or str(
        getattr(tokenizer, "chat_template", "") or ""
    )
    if not template.strip():
        raise ConfigError(
            "model_family: model needs the model's chat template (chat_template.jinja or "
            "tokenizer_config.json chat_template) and this model has none: pick a family instead"
        )
    specials = {
        k: str(getattr(tokenizer, k))
        for k in ("bos_token", "eos_token", "unk_token", "pad_token")
        if getattr(tokenizer, k, None) is not None
    }
    return ModelTemplateRenderer(template, specials)
