"""The decode/stop loop: a prepared request → the engine → decoded text deltas, stop strings applied.

``generate_text`` yields text as it becomes safe to send (an incomplete UTF-8 sequence
waits for its next token; text that could still become a stop string is held back) and
fills an ``GenerationResult`` as it goes: the text, the finish reason, token counts, cached tokens.
An engine error ends the request with ``GenerationError`` (never a silently short reply).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from server.cache_diag import CacheReport
from server.chat.prepare import Prepared
from server.engines.base import Engine, GenerationRequest
from server.errors import GenerationError
from server.metrics import Metrics


@dataclass
class GenerationResult:
    """What one generation produced (filled by ``generate_text``, read by the respond step)."""

    text: str = ""
    finish_reason: str = "stop"
    completion_tokens: int = 0
    cached_tokens: int = 0
    first_token_at: float | None = None
    explanation: CacheReport | None = None


async def generate_text(
    engine: Engine,
    metrics: Metrics,
    p: Prepared,
    out: GenerationResult,
    on_first_token: Callable[[Prepared, GenerationResult, float], None] | None = None,
) -> AsyncIterator[str]:
    """Yield decoded text deltas (stop strings applied); fill ``out`` as it goes.

    ``on_first_token(p, out, seconds)`` is called once, when the prefill is done (the cache report).
    """
    start = time.perf_counter()
    tok = engine.tokenizer
    ids: list[int] = []
    emitted = 0
    hold = max((len(s) for s in p.stops), default=1) - 1
    request = GenerationRequest(
        p.request_id, p.prompt_ids, p.sampling, p.tool_spec, p.cache_salt, p.session.key
    )
    metrics.running.inc()
    gen = engine.generate(request)
    try:
        async for chunk in gen:
            out.cached_tokens = chunk.cached_tokens
            if out.first_token_at is None:
                out.first_token_at = time.perf_counter()
                metrics.ttft.observe(out.first_token_at - start)
                if on_first_token is not None:
                    on_first_token(p, out, out.first_token_at - start)
            if chunk.error:
                raise GenerationError(chunk.error)
            ids.extend(chunk.token_ids)
            text = tok.decode(ids, skip_special_tokens=False)
            if text.endswith("\ufffd") and chunk.finish_reason is None:
                continue  # an incomplete UTF-8 sequence: wait for the next token
            cut = first_stop(text, p.stops)
            if cut is not None:
                text, out.finish_reason = text[:cut], "stop"
                out.text = text
                if len(text) > emitted:
                    yield text[emitted:]
                break
            out.text = text
            safe = len(text) if chunk.finish_reason or not p.stops else max(emitted, len(text) - hold)
            if safe > emitted:
                yield text[emitted:safe]
                emitted = safe
            if chunk.finish_reason is not None:
                out.finish_reason = chunk.finish_reason
    finally:
        await gen.aclose()  # type: ignore[attr-defined]
        metrics.running.dec()
        out.completion_tokens = len(ids)
        metrics.e2e.observe(time.perf_counter() - start)


def first_stop(text: str, stops: list[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None
