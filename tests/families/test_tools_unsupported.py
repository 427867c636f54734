"""A family version whose calls the masks cannot write refuses tools with a 400 (family data:
``rules.tools_unsupported``), instead of forcing another version's call format on the model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from server.chat.prepare import Preparer
from server.config import load_settings
from server.errors import InvalidRequest
from server.families.render import renderer_for
from server.protocol import ChatCompletionRequest

TOOLS = [{"type": "function", "function": {"name": "shell_exec", "parameters": {"type": "object"}}}]


class _Reached(Exception):
    """Raised by the stub engine: preparation got past the family checks to tokenization."""


def _preparer(ref: str) -> Preparer:
    def tokenize(*_a, **_k):
        raise _Reached

    engine = SimpleNamespace(
        constraints=SimpleNamespace(factory=lambda *_a: None), tokenizer=tokenize, block_size=32
    )
    settings = load_settings(device="cpu")
    return Preparer(engine, settings, renderer_for(ref), "mistral_name_args", family_ref=ref)  # type: ignore[arg-type]


def _request(tools: bool) -> ChatCompletionRequest:
    body = {
        "model": load_settings(device="cpu").served_model_name,
        "messages": [{"role": "user", "content": "hi"}],
    }
    if tools:
        body["tools"] = TOOLS
    return ChatCompletionRequest.model_validate(body)


def test_mistral_v11_refuses_tools_with_a_400_that_says_why() -> None:
    with pytest.raises(InvalidRequest) as err:
        _preparer("mistral:v11").chat(_request(tools=True), {})
    assert err.value.param == "tools" and "[CALL_ID]" in str(err.value) and "mistral:v11" in str(err.value)


@pytest.mark.parametrize(("ref", "tools"), [("mistral:v11", False), ("mistral:v13", True)])
def test_other_requests_pass_the_family_check(ref: str, tools: bool) -> None:
    with pytest.raises(_Reached):  # the stub tokenizer: the family check let it through
        _preparer(ref).chat(_request(tools=tools), {})
