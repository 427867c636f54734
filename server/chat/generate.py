"""The decode/stop loop: a prepared request → the engine → decoded text deltas, stop strings applied.

``generate_text`` yields text as it becomes safe to send (an incomplete UTF-8 sequence
waits for its next token; text that could still become a stop string is held back) and
fills an ``GenerationResult`` as it goes: the text, the finish reason, token counts, cached tokens,
and (when asked) each generated token's logprobs in OpenAI's shape, cut where a stop string cuts
the text. An engine error ends the request with ``GenerationError`` (never a silently short reply).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from server.cache_diag import CacheReport
from server.chat.detokenize import ReplyText
from server.chat.prepared import Prepared
from server.constrain.compiler import Compiler
from server.constrain.vocab import TokenVocab
from server.engines.base import Engine, GenerationRequest, TokenLogprob
from server.errors import GenerationError
from server.metrics import Metrics
from server.response_types import TokenLogprobOut, TopLogprob


@dataclass
class GenerationResult:
    """What one generation produced (filled by ``generate_text``, read by the respond step)."""

    text: str = ""
    finish_reason: str = "stop"
    stop_string: str | None = None  # the stop string that ended the reply, if one did
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # of completion_tokens, those up to and including the reasoning's close
    cached_tokens: int = 0
    first_token_at: float | None = None
    explanation: CacheReport | None = None
    logprobs: list[TokenLogprobOut] | None = None  # per generated token, when the request asked
    token_ends: list[int] = field(default_factory=list)  # text length after each token (logprobs)
    token_ids: list[int] = field(default_factory=list)  # the generated ids (the next prompt keeps them)
    emitted_chars: int = 0  # text sent so far (streaming)
    logprobs_taken: int = 0

    def take_logprobs(self, final: bool = False) -> list[TokenLogprobOut]:
        """Logprobs of the tokens whose text was sent since the last call (all of them when final)."""
        if self.logprobs is None:
            return []
        n = self.logprobs_taken
        end = len(self.logprobs)
        if not final:
            end = n
            while end < len(self.logprobs) and self.token_ends[end] <= self.emitted_chars:
                end += 1
        self.logprobs_taken = end
        return self.logprobs[n:end]


class LogprobText:
    """Token ids → OpenAI logprob entries: the token's text and its exact bytes."""

    def __init__(self, tokenizer: Any, vocab: TokenVocab) -> None:
        self.tokenizer = tokenizer
        self.token_bytes: Sequence[bytes] = vocab.token_bytes

    def bytes_of(self, token_id: int) -> bytes:
        raw = self.token_bytes[token_id] if 0 <= token_id < len(self.token_bytes) else b""
        return raw or str(self.tokenizer.decode([token_id], skip_special_tokens=False)).encode()

    def top(self, token_id: int, logprob: float) -> TopLogprob:
        raw = self.bytes_of(token_id)
        return TopLogprob(token=raw.decode("utf-8", "replace"), logprob=logprob, bytes=list(raw))

    def entry(self, lp: TokenLogprob) -> TokenLogprobOut:
        head = self.top(lp.token_id, lp.logprob)
        tops = [self.top(t, v) for t, v in lp.top]
        return TokenLogprobOut(**head.model_dump(), top_logprobs=tops)


async def generate_text(
    engine: Engine,
    compiler: Compiler,
    metrics: Metrics,
    p: Prepared,
    out: GenerationResult,
    on_first_token: Callable[[Prepared, GenerationResult, float], None] | None = None,
) -> AsyncIterator[str]:
    """Yield decoded text deltas (stop strings applied); fill ``out`` as it goes.

    ``on_first_token(p, out, seconds)`` is called once, when the prefill is done (the cache report).
    """
    start = time.perf_counter()
    reply = ReplyText(engine.tokenizer)  # decodes a window per token, not the whole reply
    emitted = 0
    hold = max((len(s) for s in p.stops), default=1) - 1
    stops = StopFinder(p.stops)
    fmt = LogprobText(engine.tokenizer, compiler.vocab) if p.sampling.logprobs is not None else None
    if fmt is not None:
        out.logprobs = []
    request = GenerationRequest(
        p.request_id,
        p.prompt_ids,
        p.sampling,
        p.take_constraint(compiler),  # compiled at prepare time: the engine compiles nothing
        p.cache_salt,
        p.session.key,
        retain_s=p.retain_s,
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
            text, complete = reply.push(chunk.token_ids)
            if fmt is not None and out.logprobs is not None:
                out.logprobs.extend(fmt.entry(lp) for lp in chunk.logprobs or ())
                out.token_ends.extend([len(text)] * len(chunk.token_ids))
            if not complete and chunk.finish_reason is None:
                continue  # an incomplete UTF-8 sequence: wait for the next token
            cut = stops.find(text)
            if cut is not None:
                out.stop_string = next(s for s in p.stops if s and text.find(s) == cut)
                text, out.finish_reason = text[:cut], "stop"
                out.text = text
                _cut_logprobs(out, cut)
                if len(text) > emitted:
                    yield text[emitted:]
                break
            out.text = text
            safe = len(text) if chunk.finish_reason or not p.stops else max(emitted, len(text) - hold)
            if safe > emitted:
                out.emitted_chars = safe
                yield text[emitted:safe]
                emitted = safe
            if chunk.finish_reason is not None:
                out.finish_reason = chunk.finish_reason
    finally:
        await gen.aclose()  # type: ignore[attr-defined]
        metrics.running.dec()
        out.completion_tokens = len(reply.ids)
        out.token_ids = reply.ids
        reasoning = p.plan.reasoning if p.plan is not None and p.kind == "chat" else None
        if reasoning is not None:
            out.reasoning_tokens = reasoning_tokens(
                reply.ids, reasoning.close.strip(), LogprobText(engine.tokenizer, compiler.vocab)
            )
        metrics.e2e.observe(time.perf_counter() - start)


def _cut_logprobs(out: GenerationResult, cut: int) -> None:
    """Keep the logprobs of the tokens whose text starts before a stop string at ``cut``."""
    if out.logprobs is None:
        return
    keep = 0
    while keep < len(out.logprobs) and (out.token_ends[keep - 1] if keep else 0) < cut:
        keep += 1
    del out.logprobs[keep:]
    del out.token_ends[keep:]


class StopFinder:
    """Where the first stop string starts, searching only the text not searched before plus a
    window of the longest stop's length - 1 (a stop ending in the new text may start there): a
    token costs O(stops x (window + new text)), not O(reply); limits.max_stop_sequences and
    limits.max_stop_chars bound both factors."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.back = max((len(s) for s in self.stops), default=1) - 1
        self.searched = 0  # length of the text already searched

    def find(self, text: str) -> int | None:
        if not self.stops:
            return None
        if len(text) < self.searched:  # a re-decode shortened the text: search it again
            self.searched = 0
        start = max(0, self.searched - self.back)
        self.searched = len(text)
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        return min(hits) if hits else None


def reasoning_tokens(ids: Sequence[int], close_tag: str, text: LogprobText) -> int:
    """How many of the reply's tokens are reasoning: those up to the one that completes the close
    tag (every token when the reasoning never closed, e.g. cut by max_tokens)."""
    tag = close_tag.encode()
    tail = b""  # the last len(tag) - 1 bytes written: a tag completed by this token starts there or later
    for i, tid in enumerate(ids):
        written = tail + text.bytes_of(tid)
        if tag in written:
            return i + 1
        tail = written[-(len(tag) - 1) :] if len(tag) > 1 else b""
    return len(ids)
