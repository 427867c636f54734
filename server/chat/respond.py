"""OpenAI response objects (``server.response_types`` models) from a prepared request and its outcome.

``complete_response`` builds the whole reply (tool calls parsed from prefill + text);
``StreamChunks`` builds the stream: the role chunk, content and tool-call deltas as
text arrives, the final chunk (finish reason + extensions) and, when asked for, the
usage chunk. Extensions on every reply: ``cache`` (cached tokens, where and why the
session's prefix diverged) and ``tool_state`` (the tool plan) for chat; ``max_tokens_clamped``
when the window lowered max_tokens. With ``logprobs``,
``choices[].logprobs`` holds every generated token (content and tool-call text alike, up to a
stop string), in OpenAI's chat shape or the legacy completions shape; in a stream each token's
entry rides on the first chunk sent after its text was released.
"""

from __future__ import annotations

from typing import Any

from server.chat.generate import GenerationResult
from server.chat.prepared import Prepared
from server.chat.reasoning_reply import ReasoningSplitter
from server.chat.toolcalls import (
    CallDelta,
    ContentDelta,
    Events,
    ParsedCall,
    StreamingToolCallParser,
    TextReplyParser,
    reply_parser,
)
from server.custom_tools import custom_input, custom_names
from server.families.envelope import Envelope
from server.families.render import call_id
from server.response_types import (
    AssistantMessage,
    CacheInfo,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChoiceLogprobs,
    CompletionChunk,
    CompletionLogprobs,
    CompletionResponse,
    CompletionTokensDetails,
    CustomCallOut,
    FunctionCallOut,
    IncompleteToolCall,
    PromptTokensDetails,
    TextChoice,
    TokenLogprobOut,
    ToolCallDelta,
    ToolCallOut,
    ToolStateInfo,
    Usage,
)


def _tools(p: Prepared) -> list[dict[str, Any]] | None:
    """The request's tools: their schemas type Qwen3-Coder's XML argument values."""
    return p.tool_spec.tools if p.tool_spec is not None else None


def _call(p: Prepared, index: int, call: ParsedCall) -> ToolCallOut:
    # an id the model wrote itself (Mistral v3's envelope) is the call's id: the history renders it back
    cid = call.id or call_id(p.call_id_style or {}, p.request_id, index)
    text = custom_input(call.arguments) if call.name in custom_names(_tools(p)) else None
    if text is not None:  # a custom tool: its input as the model wrote it (server/custom_tools.py)
        return ToolCallOut(id=cid, type="custom", custom=CustomCallOut(name=call.name, input=text))
    return ToolCallOut(id=cid, function=FunctionCallOut(name=call.name, arguments=call.arguments))


def finish_parser(
    parser: StreamingToolCallParser | TextReplyParser, finish: str, envelope: Envelope | None
) -> tuple[Events, IncompleteToolCall | None]:
    """Flush the parser. A reply cut ("length", or "interrupted" by the client) inside a call keeps
    the call's text out of the content and returns it as an ``IncompleteToolCall`` (name + arguments
    as written, unaltered)."""
    cut = finish in ("length", "interrupted") and parser.in_call
    events = parser.finish(unfinished_as_content=not cut)
    return events, (incomplete_call(parser.unfinished or "", envelope) if cut and envelope else None)


def incomplete_call(text: str, envelope: Envelope) -> IncompleteToolCall:
    """Name and arguments so far of a cut call's text (``<tool_call>\n{"name": "x", "arguments": {"a``)."""
    opener = envelope.name_open or envelope.call_start  # Mistral v11/v13: the name follows [TOOL_CALLS]
    at = text.rfind(opener) if opener else 0
    body = text[at + len(opener) :] if at >= 0 else ""
    close = envelope.name_close.split("{call_id}")[-1]  # v11: the arguments follow the id's [ARGS]
    name, sep, args = body.partition(close)
    if "{call_id}" in envelope.name_close:  # [CALL_ID]ID between the name and [ARGS]
        name = name.split(envelope.name_close[0])[0]
    if not sep and envelope.name_close:  # cut inside the name or inside name_close ('"', '[ARGS'):
        name = name.split(envelope.name_close[0])[0]  # names hold no quote and no '['
    return IncompleteToolCall(name=name, arguments_so_far=args)


def chat_logprobs(entries: list[TokenLogprobOut] | None) -> ChoiceLogprobs | None:
    return ChoiceLogprobs(content=entries) if entries is not None else None


def text_logprobs(entries: list[TokenLogprobOut] | None, offset: int = 0) -> CompletionLogprobs | None:
    """The legacy completions shape; ``offset``: where the first token's text starts."""
    if entries is None:
        return None
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return CompletionLogprobs(
        tokens=[e.token for e in entries],
        token_logprobs=[e.logprob for e in entries],
        top_logprobs=[{t.token: t.logprob for t in e.top_logprobs} for e in entries],
        text_offset=offsets,
    )


def usage(p: Prepared, out: GenerationResult) -> Usage:
    n = len(p.prompt_ids)
    return Usage(
        prompt_tokens=n,
        completion_tokens=out.completion_tokens,
        total_tokens=n + out.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=out.cached_tokens),
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=out.reasoning_tokens),
    )


def retention_hint(p: Prepared) -> dict[str, Any]:
    """``cache.retention_hint`` of a request that sent one: the seconds asked, at most how long they
    hold (``held_s``, when ``limits.max_retention_s`` cut them), whether the engine's prefix cache
    uses them, and if not why (``Engine.retention_hints``)."""
    if p.retain_s <= 0:
        return {}
    asked = max(p.retain_requested_s, p.retain_s)
    hint: dict[str, Any] = {"requested_s": asked, "used": p.retention_unused is None}
    if p.retain_s < asked:  # capped: limits.max_retention_s
        hint["held_s"] = p.retain_s
    if p.retention_unused is not None:
        hint["reason"] = p.retention_unused
    return {"retention_hint": hint}


def extensions(p: Prepared, out: GenerationResult) -> dict[str, Any]:
    e = out.explanation
    ext: dict[str, Any] = {
        "cache": CacheInfo(
            cached_tokens=out.cached_tokens,
            prompt_tokens=len(p.prompt_ids),
            session_key_source=p.session.source,
            **(e.fields() if e else {}),
            **retention_hint(p),
            **({"kept_tools": p.kept_tools} if p.kept_tools is not None else {}),
        )
    }
    if p.plan is not None:
        ext["tool_state"] = ToolStateInfo(mode=p.plan.mode, allowed=list(p.plan.allowed), state=p.plan.state)
    if p.max_tokens_clamped is not None:
        ext["max_tokens_clamped"] = p.max_tokens_clamped
    return ext


def complete_response(
    p: Prepared, out: GenerationResult, model: str, envelope: Envelope | None
) -> dict[str, Any]:
    head = {"id": p.request_id, "created": p.created, "model": model, **extensions(p, out)}
    if p.kind == "text":
        lp = text_logprobs(out.logprobs)
        text = TextChoice(text=out.text, logprobs=lp, finish_reason=out.finish_reason)
        return CompletionResponse(**head, choices=[text], usage=usage(p, out)).model_dump()
    parser = reply_parser(envelope, _tools(p))
    splitter = _splitter(p)
    reply = _prefill(p) + out.text
    if splitter is not None:
        reply = splitter.feed(reply)[1] + splitter.finish()[1]
    parser.feed(reply)
    _, cut = finish_parser(parser, out.finish_reason, envelope)
    parsed = parser.result()
    finish = out.finish_reason
    calls = None
    if parsed.tool_calls:
        calls = [_call(p, i, c) for i, c in enumerate(parsed.tool_calls)]
        if finish == "stop":
            finish = "tool_calls"
    thought = splitter.reasoning if splitter is not None else None
    message = AssistantMessage(
        content=parsed.content, tool_calls=calls, reasoning_content=thought, reasoning=thought
    )
    choice = ChatChoice(
        message=message,
        logprobs=chat_logprobs(out.logprobs),
        finish_reason=finish,
        incomplete_tool_call=cut,
        stop_reason=out.stop_string,
    )
    return ChatCompletionResponse(**head, choices=[choice], usage=usage(p, out)).model_dump()


def _prefill(p: Prepared) -> str:
    """The prompt's prefill as the reply's first text (less a "reasoning off" tail, not the reply's)."""
    lead = p.plan.lead if p.plan is not None else ""
    return p.prefill[len(lead) :] if lead and p.prefill.startswith(lead) else p.prefill


def _splitter(p: Prepared) -> ReasoningSplitter | None:
    plan = p.plan.reasoning if p.plan is not None else None
    return ReasoningSplitter(plan) if plan is not None and p.kind == "chat" else None


class StreamChunks:
    """The stream's chunks (dicts), in order: ``start``, ``text`` per delta, ``close``, ``final``."""

    def __init__(self, p: Prepared, model: str, envelope: Envelope | None) -> None:
        self.p = p
        self.chat = p.kind == "chat"
        self.head = {"id": p.request_id, "created": p.created, "model": model}
        self.envelope = envelope
        self.parser = reply_parser(envelope, _tools(p)) if self.chat else None
        self.splitter = _splitter(p)
        self.finish_reason = "stop"
        self.incomplete: IncompleteToolCall | None = None
        self.pending: list[TokenLogprobOut] = []  # logprobs not yet sent (no chunk carried them yet)
        self.text_offset = 0

    def _chunk(
        self,
        delta: ChatDelta | str,
        finish: str | None = None,
        cut: Any = None,
        stop_reason: str | None = None,
        **ext: Any,
    ) -> dict[str, Any]:
        entries, self.pending = (self.pending or None), []
        if isinstance(delta, ChatDelta):
            choice = ChatChunkChoice(
                delta=delta,
                logprobs=chat_logprobs(entries),
                finish_reason=finish,
                incomplete_tool_call=cut,
                stop_reason=stop_reason,
            )
            return ChatCompletionChunk(**self.head, **ext, choices=[choice]).model_dump()
        lp = text_logprobs(entries, self.text_offset)
        self.text_offset += sum(len(e.token) for e in entries or ())
        text = TextChoice(text=delta, logprobs=lp, finish_reason=finish)
        return CompletionChunk(**self.head, **ext, choices=[text]).model_dump()

    def _deltas(self, events: list[ContentDelta | CallDelta]) -> list[dict[str, Any]]:
        res = []
        for ev in events:
            if isinstance(ev, ContentDelta):
                res.append(self._chunk(ChatDelta(content=ev.text)))
            else:
                call = _call(self.p, ev.index, ev.call)
                res.append(
                    self._chunk(ChatDelta(tool_calls=[ToolCallDelta(index=ev.index, **call.model_dump())]))
                )
        return res

    def start(self) -> list[dict[str, Any]]:
        """The role chunk and the prefill's deltas (chat); nothing for text completions."""
        if self.parser is None:
            return []
        first = [self._chunk(ChatDelta(role="assistant", content=""))]
        prefill = _prefill(self.p)
        return first + (self._split(prefill) if prefill else [])

    def _split(self, text: str, final: bool = False) -> list[dict[str, Any]]:
        """Chunks of a reasoning delta (when the family reasons), then of the answer's deltas."""
        assert self.parser is not None
        if self.splitter is None:
            return self._deltas(self.parser.feed(text))
        thought, answer = self.splitter.feed(text) if not final else self.splitter.finish()
        res = [self._chunk(ChatDelta(reasoning_content=thought, reasoning=thought))] if thought else []
        return res + (self._deltas(self.parser.feed(answer)) if answer else [])

    def text(self, text: str, out: GenerationResult | None = None) -> list[dict[str, Any]]:
        """Chunks for a text delta; ``out``: the generation, whose released logprobs ride along."""
        if out is not None:
            self.pending += out.take_logprobs()
        if self.parser is None:
            return [self._chunk(text)]
        return self._split(text)

    def close(self, out: GenerationResult) -> list[dict[str, Any]]:
        """What the parser still holds; sets the finish reason ("tool_calls" when calls were made)."""
        self.finish_reason = out.finish_reason
        self.pending += out.take_logprobs(final=True)
        if self.parser is None:
            return []
        res = self._split("", final=True) if self.splitter is not None else []
        events, self.incomplete = finish_parser(self.parser, out.finish_reason, self.envelope)
        res += self._deltas(events)
        if self.parser.calls and self.finish_reason == "stop":
            self.finish_reason = "tool_calls"
        return res

    def final(self, out: GenerationResult) -> list[dict[str, Any]]:
        """The final chunk (finish reason + extensions), then the usage chunk when asked for."""
        ext = extensions(self.p, out)
        end = self._chunk(
            ChatDelta() if self.chat else "", self.finish_reason, self.incomplete, out.stop_string, **ext
        )
        if not self.p.include_usage:
            return [end]
        kind = ChatCompletionChunk if self.chat else CompletionChunk
        return [end, kind(**self.head, **ext, choices=[], usage=usage(self.p, out)).model_dump()]
