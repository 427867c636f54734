"""The chat service: request → prepared prompt + tool spec → engine → OpenAI response.

Lifecycle of one request (docs/architecture.md, "Request lifecycle"); one module per step:
  1. prepare (``prepare.py``): validate (model, n, limits), render the messages
     deterministically, plan tools (explicit tool_choice, else the state machine) into a
     mode, allowed tools and a prefill appended after the unchanged prompt, tokenize,
     check the context window (400, never truncation), build the ``ToolSpec`` once
     (compiles and caches the masks: bad schemas are 400s here), derive the session key;
  2. generate (``generate.py``): the engine decodes under the spec's constraint, reusing
     the cached prefix; text is decoded incrementally and stop strings applied;
  3. account (here): cache report against the session's previous prompt, metrics; the
     session remembers this prompt for the next report;
  4. respond (``respond.py``): OpenAI JSON or stream chunks, tool calls parsed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from server.cache_diag import CacheReporter
from server.cache_diag.replies import Parts
from server.chat.family_choice import envelope_name, make_renderer, tool_calls_note
from server.chat.generate import GenerationResult, generate_text
from server.chat.interruptible import INTERRUPTED, Interruptible
from server.chat.prepare import Preparer
from server.chat.prepared import Prepared
from server.chat.reply_tokens import decode
from server.chat.respond import StreamChunks, complete_response
from server.chat.returned import returned_reply
from server.config import Settings
from server.constrain.compiler import Compiler
from server.engines.base import Engine
from server.families.envelope import load_envelope
from server.metrics import Metrics
from server.protocol import ChatCompletionRequest, CompletionRequest

log = logging.getLogger(__name__)


class ChatService:
    def __init__(self, engine: Engine, settings: Settings, metrics: Metrics) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.family_selection = engine.facts.family  # decided before the engine (families/model_facts.py)
        self.family = self.family_selection.family
        self.renderer = make_renderer(settings, self.family_selection, engine.tokenizer)
        envelope = self.envelope_ref = envelope_name(settings, self.family_selection)
        self.envelope = load_envelope(envelope) if envelope is not None else None
        self.tool_calls = tool_calls_note(envelope)  # GET /v1/models says it too
        how = self.family_selection.how
        if envelope is not None:
            log.info("model family %s (%s); tool-call envelope %s", self.family.ref, how, envelope)
        else:  # never silently: a client's tools are not enforced
            log.warning("model family %s (%s); tool calls %s", self.family.ref, how, self.tool_calls)
        self.cache_report = CacheReporter(
            block_size=engine.block_size,
            enabled=settings.prefix_cache.enabled,
            sessions=settings.session_table_size,
            sessions_bytes=settings.session_table_mb * 2**20,
            sessions_bytes_per_tenant=(settings.session_table_tenant_mb or 0) * 2**20 or None,
            responses_bytes_per_tenant=settings.response_fingerprints_mb * 2**20,
            tier=engine.cache_location(),
        )
        # the service's own compiler, over the model's tokenizer, logits width and end ids:
        # every request's ToolSpec is compiled here, once (the engine compiles nothing)
        self.compiler = Compiler(engine.tokenizer, engine.vocab_size, engine.eos_token_ids)
        self.preparer = Preparer(
            engine,
            self.compiler,
            settings,
            self.renderer,
            envelope,
            self.family.call_id,
            self.family.ref,
            baseline=self.cache_report.baseline,
        )

    # -- 1. prepare (CPU work, raises 400s) ------------------------------------------------------
    def prepare_chat(
        self,
        req: ChatCompletionRequest,
        headers: Mapping[str, str],
        tenant: str = "",
        raw_body: Mapping[str, Any] | None = None,
        previous_response: str | None = None,
    ) -> Prepared:
        return self.preparer.chat(req, headers, tenant, raw_body, previous_response)

    def prepare_completion(
        self,
        req: CompletionRequest,
        headers: Mapping[str, str],
        tenant: str = "",
        raw_body: Mapping[str, Any] | None = None,
    ) -> Prepared:
        return self.preparer.completion(req, headers, tenant, raw_body)

    # -- 3. accounting -----------------------------------------------------------------------------
    def _finish_accounting(self, p: Prepared, out: GenerationResult) -> None:
        reply: list[int] = []
        returned: Parts | None = None
        cut = False
        if p.kind == "chat" and p.session_prompt.ids is not None:  # prefill + generated: kept by the engine
            reply = [*p.prompt_ids[len(p.session_prompt.ids) :], *out.token_ids]
            # what the client gets back (the next turn's copy of the reply is compared with it)
            returned, cut = returned_reply(complete_response(p, out, "", self.envelope))
        out.explanation = report = self.cache_report.report(
            session=p.session.key,
            tenant=p.tenant,
            response_id=p.request_id,
            prompt=p.session_prompt,
            cached_tokens=out.cached_tokens,
            compare_with=p.compare_with,
            block_size=self.engine.block_size,
            reply=reply,
            reply_text=decode(self.engine.tokenizer, reply) if reply else "",
            returned=returned,
            cut=cut,
        )
        m = self.metrics
        m.prefix_queries.inc(len(p.prompt_ids))
        m.prefix_hits.inc(out.cached_tokens)
        m.prompt_tokens.inc(len(p.prompt_ids))
        m.generation_tokens.inc(out.completion_tokens)
        m.observe_cache(report.diagnosis.type, report.diagnosis.missed_tokens)

    def _reply_finished(self, p: Prepared, tool_names: list[str]) -> None:
        """Tell the engine's cache what the session now waits on: these tools, or a person (none)."""
        self.engine.reply_finished(p.session.key, tool_names)

    def _on_first_token(self, p: Prepared, out: GenerationResult, seconds: float) -> None:
        self.cache_report.observe_prefill(len(p.prompt_ids) - out.cached_tokens, seconds)

    # -- 2 + 4. generate and respond ---------------------------------------------------------------
    async def complete(self, p: Prepared) -> dict[str, Any]:
        out = GenerationResult()
        self.engine.request_arrived(p.session.key)  # the session is back, even while it waits
        async for _ in generate_text(self.engine, self.compiler, self.metrics, p, out, self._on_first_token):
            pass
        self._finish_accounting(p, out)
        response = complete_response(p, out, p.model or self.settings.served_model_name, self.envelope)
        message = response["choices"][0].get("message") or {}
        self._reply_finished(
            p, [(c.get("function") or c.get("custom"))["name"] for c in message.get("tool_calls") or []]
        )
        return response

    async def stream(self, p: Prepared, stop: asyncio.Event | None = None) -> AsyncIterator[dict[str, Any]]:
        """Yield OpenAI stream chunks (dicts); the route turns them into SSE lines. ``stop`` set
        mid-way cancels the engine request and ends the reply ``interrupted``, with its usage."""
        out = GenerationResult()
        self.engine.request_arrived(p.session.key)
        chunks = StreamChunks(p, p.model or self.settings.served_model_name, self.envelope)
        for c in chunks.start():
            yield c
        texts = generate_text(self.engine, self.compiler, self.metrics, p, out, self._on_first_token)
        stopper = Interruptible(stop) if stop is not None else None
        async for text in texts if stopper is None else stopper.items(texts):
            for c in chunks.text(text, out):
                yield c
        if stopper is not None and stopper.cut:  # the engine request is cancelled; what it wrote stays
            out.finish_reason = INTERRUPTED
        for c in chunks.close(out):
            yield c
        self._reply_finished(p, [c.name for c in chunks.parser.calls] if chunks.parser else [])
        self._finish_accounting(p, out)
        for c in chunks.final(out):
            yield c
