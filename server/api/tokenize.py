"""POST /tokenize and POST /detokenize (vLLM-compatible): see the prompt the model sees.

/tokenize takes either ``messages`` (+ ``tools``, ``add_generation_prompt``, default true),
rendered exactly as /v1/chat/completions renders them (the model family's layout), or a
``prompt`` string (tokenized as /v1/completions does: no special tokens added unless
``add_special_tokens``). It returns ``tokens``, ``count``, ``max_model_len``, the family, and
with ``return_text`` the rendered text and its labelled segments; ``return_token_strs`` adds
the token strings. /detokenize takes ``tokens`` (at most the context window's worth) and returns
``prompt``; both take an admission slot and work in a thread.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from server.config import LimitsSettings
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


def _check_limits(body: TokenizeRequest, limits: LimitsSettings) -> None:
    """The size limits of chat (docs/security.md), before anything is rendered."""
    if body.messages is not None and len(body.messages) > limits.max_messages:
        raise InvalidRequest(
            f"{len(body.messages)} messages sent; the limit is {limits.max_messages} (limits.max_messages)",
            param="messages",
        )
    tools = body.tools or []
    if len(tools) > limits.max_tools:
        raise InvalidRequest(
            f"{len(tools)} tools sent; the limit is {limits.max_tools} (limits.max_tools)", param="tools"
        )
    for i, tool in enumerate(tools):
        size = len(tool.model_dump_json(exclude_none=True).encode())
        if size > limits.max_tool_schema_bytes:
            raise InvalidRequest(
                f"tools[{i}] is {size} bytes of JSON; the limit is {limits.max_tool_schema_bytes} "
                f"(limits.max_tool_schema_bytes)",
                param=f"tools[{i}]",
            )


def _render(service: Any, body: TokenizeRequest) -> tuple[str, list[int], list[dict[str, Any]]]:
    tok = service.engine.tokenizer
    segments: list[dict[str, Any]] = []
    if body.messages is not None:
        tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
        rendered = service.renderer.render(body.messages, tools, body.add_generation_prompt)
        text = rendered.text
        segments = [{"start": s.start, "end": s.end, "label": s.label} for s in rendered.segments]
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
    else:
        text = body.prompt or ""
        ids = list(tok(text, add_special_tokens=body.add_special_tokens)["input_ids"])
    return text, ids, segments


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
    if body.messages is not None and not body.messages:
        raise InvalidRequest("messages is empty: send at least one message", param="messages")
    _check_limits(body, request.app.state.settings.limits)
    # the same admission as chat (a slot, 429 past the queue), and the rendering off the event loop
    ticket = request.app.state.admission.reserve(request.state.tenant)
    try:
        await ticket.acquire()
        text, ids, segments = await asyncio.to_thread(_render, service, body)
    finally:
        ticket.release()
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
    if len(body.tokens) > engine.max_model_len:
        raise InvalidRequest(
            f"{len(body.tokens)} token ids sent; at most the context window, {engine.max_model_len}",
            param="tokens",
        )
    bad = [t for t in body.tokens if not 0 <= t < engine.vocab_size]
    if bad:
        raise InvalidRequest(f"token ids must be in [0, {engine.vocab_size}); got {bad[:5]}", param="tokens")
    # the same admission as /tokenize, and the decode off the event loop (8 MiB of ids took ~4 s on it)
    ticket = request.app.state.admission.reserve(request.state.tenant)
    try:
        await ticket.acquire()
        text = await asyncio.to_thread(engine.tokenizer.decode, body.tokens, skip_special_tokens=False)
    finally:
        ticket.release()
    return {"prompt": text}
