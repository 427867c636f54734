"""What is decided about the model before any engine exists: its tokenizer, its family (prompt
format, tool-call envelope, end-of-turn tokens), the ids that end a reply and the logit_bias a
request that sends none gets (the model's own default: ``server/model_defaults.py``).

The composition root (``server/app.py``) decides them once (``load_model_facts``) and hands them
to the engine's constructor; the chat service reads them from the engine (``Engine.facts``). No one
tells an engine its family afterwards, and the end-of-reply ids are computed in this one place.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.config import ConfigError, Settings
from server.families.defaults import DEFAULT_FAMILY
from server.families.end_tokens import family_end_tokens, reply_end_ids
from server.families.envelope import load_envelope
from server.families.family import FamilyError, load_family
from server.families.select import Selection, select_family
from server.model_defaults import default_logit_bias
from server.model_store import EMBEDDED, resolve_model, tokenizer_folder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelFacts:
    tokenizer: Any  # a transformers PreTrainedTokenizerBase
    family: Selection  # the family and how it was chosen (config or detection)
    end_ids: tuple[
        int, ...
    ]  # ids that end a reply: the tokenizer's EOS, the family's end tokens, the config's EOS
    # (token id, bias) for a request without logit_bias: default_logit_bias, else the model's own
    default_logit_bias: tuple[tuple[int, float], ...] = ()


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


def decide(
    settings: Settings, tokenizer: Any, config_eos: int | list[int] | None, shipped: bool = False
) -> ModelFacts:
    """The facts of a model whose tokenizer and configured EOS id(s) are in hand (tests and
    benchmarks that build a model themselves call this with the model's own). ``shipped``: the
    model is ``settings.model`` as loaded from its folder, so its shipped request defaults apply
    (configs/models/NAME.yaml); a model built in hand gets only the deployment's."""
    family = choose_family(settings, tokenizer)
    ends = family_end_tokens(family.family)
    envelope = settings.envelope or family.family.envelope
    if envelope:  # an envelope the config names (model_family: template) ends replies with its tokens too
        ends += load_envelope(envelope).end_tokens
    return ModelFacts(
        tokenizer,
        family,
        reply_end_ids(tokenizer, ends, config_eos),
        default_logit_bias(settings, tokenizer, shipped),
    )


def config_eos_of(folder: Path) -> int | list[int] | None:
    """The EOS id(s) the model folder's generation config names (transformers' own fallback: the
    model config's); None where the folder has neither (a GGUF's tokenizer folder)."""
    from transformers import GenerationConfig

    try:
        gen_eos: int | list[int] | None = GenerationConfig.from_pretrained(folder).eos_token_id
        return gen_eos
    except OSError:  # no generation_config.json
        pass
    try:
        from transformers import AutoConfig

        eos: int | list[int] | None = getattr(AutoConfig.from_pretrained(folder), "eos_token_id", None)
        return eos
    except (OSError, ValueError):  # no config.json, or one without a known model_type
        return None


def load_model_facts(settings: Settings, engine: str) -> ModelFacts:
    """Read the tokenizer and config of ``settings.model`` (the folder the engine will load: the
    model folder, or for the llamacpp engine the GGUF's tokenizer folder) and decide the facts."""
    from transformers import AutoTokenizer

    gguf_engine = engine == "llamacpp"
    folder = tokenizer_folder(settings.model) if gguf_engine else resolve_model(settings.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return decide(settings, tokenizer, None if gguf_engine else config_eos_of(folder), shipped=True)


def facts_of_model(settings: Settings, tokenizer: Any, model: Any) -> ModelFacts:
    """``decide`` for a model built in hand (random-weight tests and benchmarks): its generation
    config's EOS id(s)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return decide(settings, tokenizer, eos)
