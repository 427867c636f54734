"""``GET /v1/codex/models``: Codex's model catalog for the served model (a provider's ``model_catalog_url``).

Codex asks ``GET {model_catalog_url}?client_version=X`` with the provider's key; the answer is its
``ModelsResponse`` (server/dialects/responses/catalog.py). OpenAI's ``/v1/models`` is unchanged.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from server.dialects.responses.catalog import catalog

router = APIRouter()
PATH = "/v1/codex/models"


@router.get(PATH)
async def codex_models(request: Request) -> dict[str, Any]:
    settings = request.app.state.settings
    service = request.app.state.service
    reasoning = service.family.reasoning
    efforts = reasoning.efforts if reasoning is not None else None
    return catalog(settings.served_model_names(), service.engine.max_model_len, efforts)
