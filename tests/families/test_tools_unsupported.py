"""A family version whose calls the masks cannot write refuses tools with a 400 (family data:
``rules.tools_unsupported``), instead of forcing another version's call format on the model.
No shipped family needs it since Mistral v11's [CALL_ID] calls are masked (mistral_call_id)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from server.chat.prepare import Preparer
from server.config import load_settings
from server.errors import InvalidRequest
from server.families.family import load_family
from server.families.render import FamilyRenderer, renderer_for
from server.protocol import ChatCompletionRequest

TOOLS = [{"type": "function", "function": {"name": "shell_exec", "parameters": {"type": "object"}}}]


class _Reached(Exception):
    """Raised by the stub engine: preparation got past the family checks to tokenization."""


def _preparer(ref: str, unsupported: str | None = None) -> Preparer:
    def tokenize(*_a, **_k):
        raise _Reached

    engine = SimpleNamespace(tokenizer=tokenize, block_size=32)
    compiler = SimpleNamespace(for_envelope=lambda *_a: None)
    settings = load_settings(device="cpu")
    renderer = renderer_for(ref)
    if unsupported:  # a family whose calls the masks could not write
        family = load_family(ref)
        renderer = FamilyRenderer(replace(family, rules=replace(family.rules, tools_unsupported=unsupported)))
    envelope = load_family(ref).envelope
    return Preparer(engine, compiler, settings, renderer, envelope, family_ref=ref)  # type: ignore[arg-type]


def _request(tools: bool) -> ChatCompletionRequest:
    body = {
        "model": load_settings(device="cpu").served_model_name,
        "messages": [{"role": "user", "content": "hi"}],
    }
    if tools:
        body["tools"] = TOOLS
    return ChatCompletionRequest.model_validate(body)


def test_a_family_marked_unsupported_refuses_tools_with_a_400_that_says_why() -> None:
    with pytest.raises(InvalidRequest) as err:
        _preparer("mistral:v13", "its calls carry [X]").chat(_request(tools=True), {})
    assert err.value.param == "tools" and "[X]" in str(err.value) and "mistral:v13" in str(err.value)


@pytest.mark.parametrize(
    ("ref", "tools"), [("mistral:v11", True), ("mistral:v11", False), ("mistral:v13", True)]
)
def test_other_requests_pass_the_family_check(ref: str, tools: bool) -> None:
    with pytest.raises(_Reached):  # the stub tokenizer: the family check let it through
        _preparer(ref).chat(_request(tools=tools), {})
