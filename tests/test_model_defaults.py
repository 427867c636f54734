"""A model's own request defaults (configs/models/NAME.yaml) and the deployment's default_logit_bias:
resolved to token ids at start, replaced by a request's own logit_bias."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from server.chat.sampling import sampling_params
from server.config import ConfigError, load_settings
from server.model_defaults import MODELS_DIR, default_logit_bias, model_defaults, shipped_defaults_file
from server.protocol import ChatCompletionRequest

IM_END = 2  # <|im_end|> in the embedded model's vocabulary


def test_the_embedded_model_ends_its_replies_by_default(tokenizer):
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == IM_END
    assert model_defaults("embedded") == {"logit_bias": {"<|im_end|>": 5}}
    assert default_logit_bias(load_settings(), tokenizer) == ((IM_END, 5.0),)


def test_the_deployment_setting_replaces_the_models_default(tokenizer):
    assert default_logit_bias(load_settings(default_logit_bias={}), tokenizer) == ()
    settings = load_settings(default_logit_bias={"<|im_start|>": -5, "<|im_end|>": 3})
    assert default_logit_bias(settings, tokenizer) == ((1, -5.0), (IM_END, 3.0))


def test_a_model_without_a_defaults_file_gets_none(tokenizer, tmp_path):
    assert shipped_defaults_file(str(tmp_path)) is None and shipped_defaults_file("../embedded") is None
    assert default_logit_bias(load_settings(model=str(tmp_path)), tokenizer) == ()
    assert sorted(p.stem for p in MODELS_DIR.glob("*.yaml")) == ["embedded"]


@pytest.mark.parametrize(
    ("bias", "words"),
    [
        ({"hello world": 1}, "not one"),
        ({"<|im_end|>": 101}, "[-100, 100]"),
        ({"<|im_end|>": float("nan")}, "[-100, 100]"),
    ],
)
def test_a_bad_default_is_refused_at_start(tokenizer, bias, words):
    with pytest.raises(ConfigError, match="default_logit_bias") as caught:
        default_logit_bias(load_settings(default_logit_bias=bias), tokenizer)
    assert words in str(caught.value)


class Engine:
    vocab_size = 49152
    facts: Any = SimpleNamespace(default_logit_bias=((IM_END, 5.0),))

    def check_sampling(self, params: Any) -> None:
        return None


def _bias(**body: Any) -> tuple[tuple[int, float], ...]:
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    )
    return sampling_params(req, 16, Engine()).logit_bias  # type: ignore[arg-type]


def test_a_requests_own_logit_bias_replaces_the_default():
    assert _bias() == ((IM_END, 5.0),)  # none sent: the model's default
    assert _bias(logit_bias=None) == ((IM_END, 5.0),)  # null is not sent
    assert _bias(logit_bias={}) == ()  # {} turns it off
    assert _bias(logit_bias={"7": -1}) == ((7, -1.0),)  # the request's own, not merged
