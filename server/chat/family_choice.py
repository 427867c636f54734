"""The deployment's model family, chosen once at start (config ``model_family`` or detection)."""

from __future__ import annotations

import logging
from typing import Any

from server.config import ConfigError, Settings
from server.families.defaults import DEFAULT_FAMILY
from server.families.model_template import ModelTemplateRenderer
from server.families.render import FamilyRenderer
from server.families.rendered import PromptRenderer
from server.families.select import MODEL_TEMPLATE, Selection, chat_template_of, select_family
from server.families.spec import FamilyError, load_family
from server.model_store import EMBEDDED, tokenizer_folder

log = logging.getLogger(__name__)


def choose_family(settings: Settings, tokenizer: Any) -> Selection:
    """The family for ``settings.model``; a ConfigError naming the choices when none fits."""
    try:
        if settings.model == EMBEDDED and settings.model_family in ("", "auto"):
            return Selection(load_family(DEFAULT_FAMILY), "embedded default (SmolLM2)")
        folder = None if settings.model == EMBEDDED else tokenizer_folder(settings.model, progress=False)
        selection = select_family(settings.model_family, folder, tokenizer)
    except FamilyError as exc:
        raise ConfigError(str(exc)) from None
    return selection


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
