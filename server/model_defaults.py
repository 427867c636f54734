"""A model's own request defaults: what a request that does not say gets (data, decided at start).

A model the project ships (``embedded``) may carry its defaults in ``configs/models/NAME.yaml``
(NAME: the ``model`` setting). Today that is one field, ``logit_bias``, keyed by token text (one
token of the model's vocabulary each), resolved to token ids through the tokenizer once, at start:
the embedded SmolLM2-135M seldom samples ``<|im_end|>`` by itself and writes to its token limit, so
its file raises that token. The deployment's ``default_logit_bias`` (same form) replaces the model's
(``{}``: none); a request's own ``logit_bias`` (``{}`` included) replaces both (server/chat/sampling.py).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from server.config import ConfigError, Settings
from server.package_data import CONFIGS_DIR

MODELS_DIR = CONFIGS_DIR / "models"  # one file per shipped model: configs/models/embedded.yaml
FIELDS = ("logit_bias",)
BIAS_LIMIT = 100.0  # OpenAI's range for logit_bias values


def shipped_defaults_file(model: str) -> Path | None:
    """The defaults file of a model the project ships (a bare name such as ``embedded``), else None."""
    if not model or "/" in model or "\\" in model or model.startswith("."):
        return None
    path = MODELS_DIR / f"{model}.yaml"
    return path if path.is_file() else None


def model_defaults(model: str) -> dict[str, Any]:
    """The shipped request defaults of ``model`` ({} for a model that has none); a ConfigError for a
    file holding anything but the known fields."""
    path = shipped_defaults_file(model)
    if path is None:
        return {}
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    unknown = sorted(set(data) - set(FIELDS)) if isinstance(data, dict) else ["(not a mapping)"]
    if unknown:
        raise ConfigError(f"{path}: unknown request defaults {unknown}: use {list(FIELDS)}")
    return dict(data)


def bias_ids(bias: dict[str, float], tokenizer: Any, where: str) -> tuple[tuple[int, float], ...]:
    """``{token text: bias}`` → sorted (token id, bias) pairs; a ConfigError for a text that is not one
    token of this vocabulary or a bias outside [-100, 100]."""
    out: dict[int, float] = {}
    for text, value in bias.items():
        ids = tokenizer.encode(str(text), add_special_tokens=False)
        if len(ids) != 1:
            raise ConfigError(
                f"{where}: {text!r} is {len(ids)} tokens of this model's vocabulary, not one: key the bias "
                f"by the text of a single token (POST /tokenize shows how a text splits)"
            )
        number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
        if not -BIAS_LIMIT <= number <= BIAS_LIMIT:
            raise ConfigError(f"{where}: the bias of {text!r} is {value!r}: use a number in [-100, 100]")
        out[int(ids[0])] = number
    return tuple(sorted(out.items()))


def default_logit_bias(
    settings: Settings, tokenizer: Any, shipped: bool = True
) -> tuple[tuple[int, float], ...]:
    """The logit_bias a request that sends none gets: the deployment's ``default_logit_bias`` when set,
    else the model's own (``configs/models/NAME.yaml``; ``shipped``: only for the model loaded from
    its folder, not one a test or benchmark builds in hand), else none."""
    if tokenizer is None:  # a model built in hand without a tokenizer: no text to resolve
        return ()
    if settings.default_logit_bias is not None:
        return bias_ids(settings.default_logit_bias, tokenizer, "default_logit_bias")
    if not shipped:
        return ()
    own = model_defaults(settings.model).get("logit_bias") or {}
    if not isinstance(own, dict):
        raise ConfigError(
            f"{shipped_defaults_file(settings.model)}: logit_bias must map token text to a bias"
        )
    return bias_ids(own, tokenizer, f"{shipped_defaults_file(settings.model)} logit_bias")
