"""POST /tokenize and POST /detokenize (vLLM-compatible): see the prompt the model sees.

/tokenize takes either ``messages`` (+ ``tools``, ``add_generation_prompt``, default true),
rendered exactly as /v1/chat/completions renders them (the model family's layout), or a
``prompt`` string (tokenized as /v1/completions does: no special tokens added unless
``add_special_tokens``). It returns ``tokens``, ``count``, ``max_model_len``, the family, and
with ``return_text`` the rendered text and its labelled segments; ``return_token_strs`` adds
the token strings. /detokenize takes ``tokens`` and returns ``prompt``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from server.errors import InvalidRequest, ModelNotFound
from server.protocol import ChatMessage, Tool

router = APIRouter()


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True
    prompt: str | None = None
    add_special_tokens: bool = False
    return_text: bool = False
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[int] = Field(min_length=0)


def _check_model(request: Request, model: str | None) -> None:
    served = request.app.state.settings.served_model_names()
    if model is not None and model not in served:
        listed = " or ".join(repr(n) for n in served)
        raise ModelNotFound(f"model {model!r} is not served here: use {listed}", param="model")


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    _check_model(request, body.model)
    service = request.app.state.service
    tok = service.engine.tokenizer
    if (body.messages is None) == (body.prompt is None):
        raise InvalidRequest(
            "send exactly one of 'messages' (a chat, rendered as /v1/chat/completions does) "
            "or 'prompt' (text)",
            param="messages",
        )
    segments: list[dict[str, Any]] = []
    if body.messages is not None:
        if not body.messages:
            raise InvalidRequest("messages is empty: send at least one message", param="messages")
        tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
        rendered = service.renderer.render(body.messages, tools, body.add_generation_prompt)
        text = rendered.text
        segments = [{"start": s.start, "end": s.end, "label": s.label} for s in rendered.segments]
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
    else:
        text = body.prompt or ""
        ids = list(tok(text, add_special_tokens=body.add_special_tokens)["input_ids"])
    out: dict[str, Any] = {
        "count": len(ids),
        "max_model_len": service.engine.max_model_len,
        "tokens": ids,
        "family": service.family.ref,
    }
    if body.return_token_strs:
        out["token_strs"] = tok.convert_ids_to_tokens(ids)
    if body.return_text:
        out["text"] = text
        if segments:
            out["segments"] = segments
    return out


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    _check_model(request, body.model)
    engine = request.app.state.service.engine
    bad = [t for t in body.tokens if not 0 <= t < engine.vocab_size]
    if bad:
        raise InvalidRequest(f"token ids must be in [0, {engine.vocab_size}); got {bad[:5]}", param="tokens")
    return {"prompt": engine.tokenizer.decode(body.tokens, skip_special_tokens=False)}
