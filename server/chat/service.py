"""The chat service: request -> prompt tokens + constraint -> engine -> OpenAI response.

Lifecycle of one request (see README "Request lifecycle"):
  1. validate (model, n, limits) and render the messages deterministically;
  2. the tool plan (explicit tool_choice, else the state machine) gives a mode, the
     allowed tools and a prefill that is appended after the unchanged prompt;
  3. tokenize, check the context window (400, never truncation);
  4. the engine generates under the token constraint, reusing the cached prefix;
  5. text is decoded incrementally, stop strings applied, tool calls parsed;
  6. usage + cache report; the session remembers this prompt for the next report.
"""

from __future__ import annotations

import logging
import time
import uuid
from array import array
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from server.auth import cache_salt, namespaced_session
from server.cache_diag import CacheReport, CacheReporter, Prompt, fingerprint
from server.chat.family_choice import choose_family, envelope_name, make_renderer
from server.chat.template import render_chat
from server.chat.toolcalls import CallDelta, ContentDelta, StreamingToolCallParser
from server.config import Settings
from server.engines.base import Engine, GenerationRequest, SamplingParams
from server.errors import ContextLengthExceeded, GenerationError, InvalidRequest, ModelNotFound
from server.families.envelope import load_envelope
from server.families.render import call_id
from server.families.rendered import RenderedPrompt, Segment
from server.masking.constraint import ConstraintFactory
from server.masking.interface import TokenConstraint
from server.masking.state_machine import StateMachine, StateMachineError, load_state_machine
from server.masking.tool_choice import ToolPlan, plan_tools
from server.metrics import Metrics
from server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from server.session_key import SessionKey, canonical_json, session_key

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    kind: str  # "chat" | "text"
    request_id: str
    created: int
    prompt_ids: list[int]
    session_prompt: Prompt
    session: SessionKey
    sampling: SamplingParams
    stops: list[str]
    stream: bool
    include_usage: bool
    prefill: str = ""
    plan: ToolPlan | None = None
    constraint: TokenConstraint | None = None
    cache_salt: str = ""
    compare_with: str | None = None  # a response id to diagnose the cache against
    tenant: str = ""
    call_id_style: Mapping[str, Any] | None = None  # the family's call-id format


@dataclass
class Outcome:
    text: str = ""
    finish_reason: str = "stop"
    completion_tokens: int = 0
    cached_tokens: int = 0
    first_token_at: float | None = None
    explanation: CacheReport | None = None


class ChatService:
    def __init__(self, engine: Engine, settings: Settings, metrics: Metrics) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.family_selection = choose_family(settings, engine.tokenizer)
        self.family = self.family_selection.family
        self.renderer = make_renderer(settings, self.family_selection, engine.tokenizer)
        envelope = self.envelope_ref = envelope_name(settings, self.family_selection)
        self.envelope = load_envelope(envelope)
        how = self.family_selection.how
        log.info("model family %s (%s); tool-call envelope %s", self.family.ref, how, envelope)
        self.cache_report = CacheReporter(
            block_size=settings.prefix_cache.block_size,
            enabled=settings.prefix_cache.enabled,
            sessions=settings.session_table_size,
            tier=_cache_tier(engine),
            retention_s=getattr(engine, "cache_retention_s", None),
        )
        self.default_machine = (
            load_state_machine(settings.tool_state_machine) if settings.tool_state_machine else None
        )
        self.constraints = ConstraintFactory(
            engine.tokenizer,
            engine.vocab_size,
            self.envelope,
            backend=settings.grammar_backend,
            envelope_ref=envelope,
        )

    # -- preparation (CPU work, raises 400s) -----------------------------------------
    def _check_common(self, req: SamplingFields) -> None:
        if req.model != self.settings.served_model_name:
            raise ModelNotFound(
                f"model {req.model!r} is not served here: use {self.settings.served_model_name!r} "
                f"(GET /v1/models lists it)",
                param="model",
            )
        if req.n != 1:
            raise InvalidRequest(f"n={req.n} is not supported: only n=1; send separate requests", param="n")

    def _tokenize(self, rendered: RenderedPrompt) -> tuple[list[int], array]:
        enc = self.engine.tokenizer(rendered.text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), array("l", (s for s, _ in enc["offset_mapping"]))

    def _sampling(self, req: SamplingFields, prompt_len: int) -> SamplingParams:
        room = self.engine.max_model_len - prompt_len
        if room < 1:
            raise ContextLengthExceeded(
                f"the prompt is {prompt_len} tokens but the context window is {self.engine.max_model_len}: "
                f"shorten the conversation (nothing was truncated)",
                param="messages",
            )
        asked = req.requested_max_tokens()
        cap = self.settings.limits.max_tokens
        if asked is not None and cap is not None and asked > cap:
            raise InvalidRequest(
                f"max_tokens={asked} is over this server's limit of {cap} (limits.max_tokens): ask for fewer",
                param="max_tokens",
            )
        if asked is not None and asked > room:
            raise ContextLengthExceeded(
                f"prompt ({prompt_len} tokens) + max_tokens ({asked}) exceeds the context window "
                f"({self.engine.max_model_len}): lower max_tokens to at most {room} or shorten the prompt",
                param="max_tokens",
            )
        max_tokens = asked if asked is not None else min(self.settings.default_max_tokens, room)
        return SamplingParams(
            max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, seed=req.seed
        )

    def _prompt(
        self,
        req: SamplingFields,
        tenant: str,
        ids: list[int],
        offsets: array,
        rendered: RenderedPrompt,
        messages: list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Prompt:
        """The prompt as the cache report keeps it (fingerprint + ids/text for the session baseline)."""
        settings = {
            "cache_namespace": cache_salt(tenant, self.settings.auth),
            "family": self.family.ref,
            "envelope": self.envelope_ref,
            "tool_state_machine": getattr(req, "tool_state_machine", None)
            or self.settings.tool_state_machine,
        }
        fp = fingerprint(
            model=self.settings.served_model_name,
            settings=settings,
            ids=ids,
            offsets=offsets,
            rendered=rendered,
            messages=messages,
            tools=tools,
        )
        return Prompt(fp, array("l", ids), rendered.text, offsets)

    def _check_tools(self, tools: list[dict[str, Any]]) -> None:
        limits = self.settings.limits
        if len(tools) > limits.max_tools:
            raise InvalidRequest(
                f"{len(tools)} tools sent; the limit is {limits.max_tools} (limits.max_tools)", param="tools"
            )
        for i, tool in enumerate(tools):
            size = len(canonical_json(tool).encode())
            if size > limits.max_tool_schema_bytes:
                raise InvalidRequest(
                    f"tool {tool['function']['name']!r} is {size} bytes of JSON; the limit is "
                    f"{limits.max_tool_schema_bytes} (limits.max_tool_schema_bytes): shorten its schema",
                    param=f"tools[{i}]",
                )
        names = [t["function"]["name"] for t in tools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InvalidRequest(
                f"duplicate tool names {dupes}: every tool needs a unique name", param="tools"
            )

    def _machine(self, name: str | None) -> StateMachine | None:
        """The request's state machine: the configured default, another by name, or "off"."""
        if name is None:
            return self.default_machine
        if name == "off":
            return None
        if "/" in name or name.endswith(".yaml"):
            raise InvalidRequest(
                "tool_state_machine takes the name of a machine in grammars/ (or 'off'), not a path",
                param="tool_state_machine",
            )
        try:
            return load_state_machine(name)
        except StateMachineError as exc:
            raise InvalidRequest(str(exc), param="tool_state_machine") from None

    def _session(
        self, req: SamplingFields, raw_body: Mapping[str, Any] | None, headers: Mapping[str, str], tenant: str
    ) -> SessionKey:
        """The session key from the JSON body as sent (as the router computes it), tenant-prefixed.

        Callers without an HTTP body (in-process use) pass None: the parsed request stands in.
        """
        body = raw_body if raw_body is not None else req.model_dump(exclude_none=True)
        key = session_key(body, headers)
        return SessionKey(namespaced_session(tenant, key.key), key.source)

    def prepare_chat(
        self,
        req: ChatCompletionRequest,
        headers: Mapping[str, str],
        tenant: str = "",
        raw_body: Mapping[str, Any] | None = None,
    ) -> Prepared:
        self._check_common(req)
        if req.response_format is not None and req.response_format.type != "text":
            raise InvalidRequest(
                f"response_format type {req.response_format.type!r} is not supported yet: use tools with "
                f"tool_choice to get schema-valid JSON",
                param="response_format",
            )
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
        self._check_tools(tools)
        rendered = render_chat(req.messages, tools, self.renderer)
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        machine = self._machine(req.tool_state_machine)
        plan = plan_tools(tools, req.tool_choice, messages, req.parallel_tool_calls, machine, self.envelope)
        ids, offsets = self._tokenize(rendered)
        prefill_ids = (
            self.engine.tokenizer(plan.prefill, add_special_tokens=False)["input_ids"] if plan.prefill else []
        )
        prompt_ids = ids + list(prefill_ids)
        sampling = self._sampling(req, len(prompt_ids))
        constraint = self.constraints.build(tools, plan, self.engine.eos_token_ids) if tools else None
        return Prepared(
            kind="chat",
            request_id="chatcmpl-" + uuid.uuid4().hex[:24],
            created=int(time.time()),
            prompt_ids=prompt_ids,
            session_prompt=self._prompt(req, tenant, ids, offsets, rendered, messages, tools),
            session=self._session(req, raw_body, headers, tenant),
            sampling=sampling,
            stops=req.stop_list(),
            stream=req.stream,
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
            prefill=plan.prefill,
            plan=plan,
            constraint=constraint,
            cache_salt=cache_salt(tenant, self.settings.auth),
            compare_with=req.comparison_response_id(),
            tenant=tenant,
            call_id_style=self.family.call_id,
        )

    def prepare_completion(
        self,
        req: CompletionRequest,
        headers: Mapping[str, str],
        tenant: str = "",
        raw_body: Mapping[str, Any] | None = None,
    ) -> Prepared:
        self._check_common(req)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise InvalidRequest(
                    "only one prompt per request is supported: send one string", param="prompt"
                )
            prompt = prompt[0]
        if isinstance(prompt, str):
            rendered = RenderedPrompt(prompt, (Segment(0, len(prompt), "prompt"),), ())
            ids, offsets = self._tokenize(rendered)
        else:
            bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < self.engine.vocab_size]
            if bad:
                raise InvalidRequest(
                    f"prompt token ids must be in [0, {self.engine.vocab_size}); got {bad[:5]}",
                    param="prompt",
                )
            ids = list(prompt)
            text = self.engine.tokenizer.decode(ids)
            rendered = RenderedPrompt(text, (Segment(0, len(text), "prompt"),), ())
            offsets = array("l", range(len(ids)))
        if not ids:
            raise InvalidRequest("the prompt is empty: send at least one token of text", param="prompt")
        return Prepared(
            kind="text",
            request_id="cmpl-" + uuid.uuid4().hex[:24],
            created=int(time.time()),
            prompt_ids=ids,
            session_prompt=self._prompt(req, tenant, ids, offsets, rendered),
            session=self._session(req, raw_body, headers, tenant),
            sampling=self._sampling(req, len(ids)),
            stops=req.stop_list(),
            stream=req.stream,
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
            cache_salt=cache_salt(tenant, self.settings.auth),
            compare_with=req.comparison_response_id(),
            tenant=tenant,
        )

    # -- generation -----------------------------------------------------------------
    async def _generate_text(self, p: Prepared, out: Outcome) -> AsyncIterator[str]:
        """Yield decoded text deltas (stop strings applied); fill ``out`` as it goes."""
        start = time.perf_counter()
        tok = self.engine.tokenizer
        ids: list[int] = []
        emitted = 0
        hold = max((len(s) for s in p.stops), default=1) - 1
        request = GenerationRequest(p.request_id, p.prompt_ids, p.sampling, p.constraint, p.cache_salt)
        self.metrics.running.inc()
        gen = self.engine.generate(request)
        try:
            async for chunk in gen:
                out.cached_tokens = chunk.cached_tokens
                if out.first_token_at is None:
                    out.first_token_at = time.perf_counter()
                    self.metrics.ttft.observe(out.first_token_at - start)
                    self.cache_report.observe_prefill(
                        len(p.prompt_ids) - out.cached_tokens, out.first_token_at - start
                    )
                if chunk.error:
                    raise GenerationError(chunk.error)
                ids.extend(chunk.token_ids)
                text = tok.decode(ids, skip_special_tokens=False)
                if text.endswith("\ufffd") and chunk.finish_reason is None:
                    continue  # an incomplete UTF-8 sequence: wait for the next token
                cut = _first_stop(text, p.stops)
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
            await gen.aclose()
            self.metrics.running.dec()
            out.completion_tokens = len(ids)
            self.metrics.e2e.observe(time.perf_counter() - start)

    def _finish_accounting(self, p: Prepared, out: Outcome) -> None:
        out.explanation = report = self.cache_report.report(
            session=p.session.key,
            tenant=p.tenant,
            response_id=p.request_id,
            prompt=p.session_prompt,
            cached_tokens=out.cached_tokens,
            compare_with=p.compare_with,
            block_size=getattr(self.engine, "block_size", None)
            or getattr(self.engine, "cache_block_size", None),
        )
        m = self.metrics
        m.prefix_queries.inc(len(p.prompt_ids))
        m.prefix_hits.inc(out.cached_tokens)
        m.prompt_tokens.inc(len(p.prompt_ids))
        m.generation_tokens.inc(out.completion_tokens)
        m.observe_cache(report.diagnosis.type, report.diagnosis.missed_tokens)

    def _usage(self, p: Prepared, out: Outcome) -> dict[str, Any]:
        n = len(p.prompt_ids)
        return {
            "prompt_tokens": n,
            "completion_tokens": out.completion_tokens,
            "total_tokens": n + out.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": out.cached_tokens},
        }

    def _cache(self, p: Prepared, out: Outcome) -> dict[str, Any]:
        e = out.explanation
        return {
            "cached_tokens": out.cached_tokens,
            "prompt_tokens": len(p.prompt_ids),
            "session_key_source": p.session.source,
            **(e.fields() if e else {}),
        }

    def _extensions(self, p: Prepared, out: Outcome) -> dict[str, Any]:
        ext: dict[str, Any] = {"cache": self._cache(p, out)}
        if p.plan is not None:
            ext["tool_state"] = {"mode": p.plan.mode, "allowed": list(p.plan.allowed), "state": p.plan.state}
        return ext

    async def complete(self, p: Prepared) -> dict[str, Any]:
        out = Outcome()
        async for _ in self._generate_text(p, out):
            pass
        self._finish_accounting(p, out)
        if p.kind == "text":
            choice = {"index": 0, "text": out.text, "logprobs": None, "finish_reason": out.finish_reason}
            obj = "text_completion"
        else:
            parser = StreamingToolCallParser(self.envelope, getattr(p.constraint, "tools", None))
            parser.feed(p.prefill + out.text)
            parser.finish()
            parsed = parser.result()
            message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
            finish = out.finish_reason
            if parsed.tool_calls:
                message["tool_calls"] = [_call_json(p, i, c) for i, c in enumerate(parsed.tool_calls)]
                if finish == "stop":
                    finish = "tool_calls"
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion"
        return {
            "id": p.request_id,
            "object": obj,
            "created": p.created,
            "model": self.settings.served_model_name,
            "choices": [choice],
            "usage": self._usage(p, out),
            **self._extensions(p, out),
        }

    async def stream(self, p: Prepared) -> AsyncIterator[dict[str, Any]]:
        """Yield OpenAI stream chunks (dicts); the route turns them into SSE lines."""
        out = Outcome()
        chat = p.kind == "chat"
        obj = "chat.completion.chunk" if chat else "text_completion"
        base = {
            "id": p.request_id,
            "object": obj,
            "created": p.created,
            "model": self.settings.served_model_name,
        }

        def chunk(delta: dict[str, Any] | str, finish: str | None = None) -> dict[str, Any]:
            if chat:
                c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                c = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}
            return {**base, "choices": [c]}

        tools = getattr(p.constraint, "tools", None)  # the schemas type Qwen3-Coder's XML values
        parser = StreamingToolCallParser(self.envelope, tools) if chat else None
        if chat:
            yield chunk({"role": "assistant", "content": ""})

        def deltas(events: list[ContentDelta | CallDelta]) -> list[dict[str, Any]]:
            res = []
            for ev in events:
                if isinstance(ev, ContentDelta):
                    res.append(chunk({"content": ev.text}))
                else:
                    res.append(
                        chunk({"tool_calls": [{"index": ev.index, **_call_json(p, ev.index, ev.call)}]})
                    )
            return res

        if parser is not None and p.prefill:
            for c in deltas(parser.feed(p.prefill)):
                yield c
        async for text in self._generate_text(p, out):
            if parser is None:
                yield chunk(text)
            else:
                for c in deltas(parser.feed(text)):
                    yield c
        finish = out.finish_reason
        if parser is not None:
            for c in deltas(parser.finish()):
                yield c
            if parser.calls and finish == "stop":
                finish = "tool_calls"
        self._finish_accounting(p, out)
        final = chunk({} if chat else "", finish)
        final.update(self._extensions(p, out))
        yield final
        if p.include_usage:
            yield {**base, "choices": [], "usage": self._usage(p, out), **self._extensions(p, out)}


def _cache_tier(engine: Engine) -> str:
    """Where the engine's prefix cache keeps blocks (the tier an evicted block was lost from)."""
    tiers = getattr(engine, "cache_tiers", None)
    if tiers:
        return str(tiers[-1])
    if getattr(engine, "name", "") == "vllm":
        return "vLLM's KV cache"
    device = getattr(engine, "device", None)
    if device is not None:
        return f"the prefix cache in {getattr(device, 'type', device)} memory"
    return "the engine's KV cache"


def _call_json(p: Prepared, index: int, call: Any) -> dict[str, Any]:
    return {
        # an id the model wrote itself (Mistral v3's envelope) is the call's id: the history renders it back
        "id": getattr(call, "id", None) or call_id(p.call_id_style or {}, p.request_id, index),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def _first_stop(text: str, stops: list[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None
