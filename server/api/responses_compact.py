"""``POST /v1/responses/compact``: the conversation compacted into a summary the served model writes.

The body is a Responses body; the summary request, the ``response.compaction`` object and what its
``compaction`` item holds are in server/dialects/responses/compact.py. Served on the one serving
path (admission, prefix cache, cache report), never streamed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request, Response

from server.api.responses import ResponseJob, request_body, response_store, stored_history
from server.api.routes import serve_prepared
from server.chat.prepared import Prepared
from server.chat.service import ChatService
from server.dialects.responses.compact import compacted, summary_body
from server.dialects.responses.response import usage

router = APIRouter()


@router.post("/v1/responses/compact")
async def compact_response(request: Request) -> Response:
    service: ChatService = request.app.state.service
    tenant: str = request.state.tenant
    body = await request_body(request)
    history = stored_history(response_store(request.app.state), tenant, body)
    summarize = summary_body(body)
    # the summary gets default_max_tokens (or what the window holds), not the rest of the window
    overrides = {"max_tokens_default": "server"}
    headers = request.headers
    job = await asyncio.to_thread(ResponseJob, service, headers, tenant, summarize, history, overrides)
    items = job.conv.input_items[:-1]  # the conversation, less the summary request

    def to_json(p: Prepared, chat: dict[str, Any]) -> dict[str, Any]:
        message = (chat.get("choices") or [{}])[0].get("message") or {}
        extra = {k: chat[k] for k in ("cache", "max_tokens_clamped") if chat.get(k) is not None}
        summary = message.get("content") or ""
        return compacted(job.ctx.id, job.ctx.created_at, items, summary, usage(chat.get("usage")), extra)

    return await serve_prepared(request, job.prepare, to_json)
