"""Preparing a request (CPU work, raises the 400s): validate, render + tokenize, session key.

The result, ``Prepared`` (server/chat/prepared.py), is everything the generate and respond
steps need; nothing here touches the engine's decode loop. A chat request's tools and
reasoning are planned and its constraint built by ``ToolSetup`` (server/chat/tool_setup.py);
the reply's token budget is fitted to the window by ``fit_sampling`` (server/chat/window.py).
"""

from __future__ import annotations

import logging
import time
import uuid
from array import array
from collections.abc import Callable, Mapping
from typing import Any

from server.auth import cache_salt, namespaced_session
from server.cache_diag import Prompt, fingerprint
from server.chat.kept_tools import NAMED_SOURCES, KeptTools, ToolMemory, keep
from server.chat.limits import check_request_limits
from server.chat.prepared import Prepared
from server.chat.reply_tokens import keep_reply
from server.chat.returned import sent_back
from server.chat.sampling import check_fields
from server.chat.tool_setup import ToolSetup
from server.chat.window import fit_sampling
from server.config import Settings
from server.constrain.compiler import Compiler
from server.constrain.custom.grammar import prompt_tools
from server.constrain.response_format import text_schema
from server.engines.base import Engine, SamplingParams, constraint_errors_as_400
from server.errors import InvalidRequest, MaxTokensOverWindow, ModelNotFound, PromptTooLong
from server.families.defaults import DEFAULT_ENVELOPE
from server.families.envelope import load_envelope
from server.families.rendered import PromptRenderer, RenderedPrompt, Segment
from server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from server.response_types import MaxTokensClamped
from server.session_key import SessionKey, response_digest, session_key

log = logging.getLogger(__name__)


class Preparer:
    def __init__(
        self,
        engine: Engine,
        compiler: Compiler,
        settings: Settings,
        renderer: PromptRenderer,
        envelope: str | None,
        call_id_style: Mapping[str, Any] | None = None,
        family_ref: str = "",
        baseline: Callable[[str], Prompt | None] | None = None,
    ) -> None:
        """``compiler``: the service's (it compiles each request's ToolSpec once, here);
        ``renderer``: the family's prompt renderer; ``envelope``: the name of its call envelope (None:
        none, calls neither masked nor parsed: ``tool_choice.unmasked``);
        ``baseline``: a session's previous prompt + reply (its ids are kept: ``reply_tokens.py``)."""
        self.engine = engine
        self.settings = settings
        self.renderer = renderer
        self.envelope_name = envelope
        self.call_id_style = call_id_style
        self.family_ref = family_ref
        self.baseline = baseline
        self.warned_retention = False  # the first unused retention hint is logged, once
        cfg = settings.cache
        self.tool_memory = ToolMemory(cfg.kept_tools_sessions, cfg.kept_tools_mb * 2**20)
        loaded = load_envelope(envelope) if envelope is not None else None
        self.tools = ToolSetup(compiler, settings, renderer, envelope, loaded, family_ref)
        # the vocabulary and the configured envelope's compiler now, not on the first tool request
        # (an envelope whose special tokens the vocabulary lacks stops the start here)
        compiler.for_envelope(envelope or DEFAULT_ENVELOPE, settings.grammar_backend)

    def _retention(self, req: SamplingFields) -> dict[str, Any]:
        """The request's retention hint, and why the engine does not use it (said in the response)."""
        asked = req.retention_hint_s()
        unused = self.engine.retention_hints() if asked > 0 else None
        if unused is not None and not self.warned_retention:
            self.warned_retention = True
            log.warning("a request's retention hint (%.0f s) is not used: %s", asked, unused)
        retain_s = min(asked, self.settings.max_retention_s())  # every engine's hold: capped here
        return {"retain_s": retain_s, "retain_requested_s": asked, "retention_unused": unused}

    # -- checks ---------------------------------------------------------------------------------
    def _check_common(self, req: SamplingFields) -> None:
        names = self.settings.served_model_names()
        if req.model not in names:
            listed = " or ".join(repr(n) for n in names)
            raise ModelNotFound(
                f"model {req.model!r} is not served here: use {listed} (GET /v1/models lists them; "
                f"operators: served_model_aliases adds names)",
                param="model",
            )
        if req.n != 1:
            raise InvalidRequest(f"n={req.n} is not supported: only n=1; send separate requests", param="n")
        check_fields(req)  # refused parameters are 400s naming them; unknown ones are logged once
        check_request_limits(req, self.settings.limits)  # stop, logit_bias, messages: before rendering

    def _tokenize(self, rendered: RenderedPrompt, session: str = "") -> tuple[list[int], array[int]]:
        if session and self.baseline is not None:
            kept = keep_reply(self.engine.tokenizer, rendered.text, self.baseline(session))
            if kept is not None:
                return kept
        enc = self.engine.tokenizer(rendered.text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), array("l", (s for s, _ in enc["offset_mapping"]))

    def _sampling(
        self, req: SamplingFields, prompt_len: int
    ) -> tuple[SamplingParams, MaxTokensClamped | None]:
        return fit_sampling(req, prompt_len, self.engine, self.settings)

    def _prompt(
        self,
        req: SamplingFields,
        tenant: str,
        ids: list[int],
        offsets: array[int],
        rendered: RenderedPrompt,
        messages: list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
        session: str = "",
    ) -> Prompt:
        """The prompt as the cache report keeps it (fingerprint + ids/text for the session baseline;
        the session's previous reply as this request sent it back, to name who changed it)."""
        settings = {
            "cache_namespace": cache_salt(tenant, self.settings.auth),
            "family": self.family_ref,
            "envelope": self.envelope_name,
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
        base = self.baseline(session) if session and messages is not None and self.baseline else None
        echoed = None
        if base is not None and base.returned is not None:
            echoed = sent_back(messages or [], len(base.fp.messages))
        return Prompt(fp, array("l", ids), rendered.text, offsets, echoed=echoed)

    def _session(
        self, req: SamplingFields, raw_body: Mapping[str, Any] | None, headers: Mapping[str, str], tenant: str
    ) -> SessionKey:
        """The session key from the JSON body as sent (as the router computes it), tenant-prefixed.

        Callers without an HTTP body (in-process use) pass None: the parsed request stands in.
        """
        body = raw_body if raw_body is not None else req.model_dump(exclude_none=True)
        key = session_key(body, headers)
        return SessionKey(namespaced_session(tenant, key.key), key.source, key.digest)

    # -- requests -------------------------------------------------------------------------------
    @constraint_errors_as_400()
    def chat(
        self,
        req: ChatCompletionRequest,
        headers: Mapping[str, str],
        tenant: str = "",
        raw_body: Mapping[str, Any] | None = None,
        previous_response: str | None = None,
        keep_tools: bool = True,
    ) -> Prepared:
        """``previous_response``: the Responses ``previous_response_id`` the request continues (its
        session's digest finds the previous turn's tools; the session key is the chat body's).
        ``keep_tools``: False renders the tools as sent (the kept ones would not fit the window)."""
        self._check_common(req)
        rf = req.response_format
        json_text = text_schema(rf.type, rf.json_schema) if rf is not None else None
        sent = [t.model_dump(exclude_none=True) for t in req.tools or []]
        self.tools.check_tools(sent)
        session = self._session(req, raw_body, headers, tenant)
        kept = self._kept_tools(session, tenant, sent, previous_response) if keep_tools else None
        tools = kept.rendered if kept is not None else sent  # rendered; the plan allows only those sent
        rendered = self.renderer.render(  # custom tools: as functions
            req.messages, prompt_tools(tools), reasoning_effort=req.reasoning_effort
        )
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        plan = self.tools.plan(req, sent, messages)
        ids, offsets = self._tokenize(rendered, session.key)
        prefill = plan.prompt_prefill  # with reasoning: the masks force the call's opening later
        prefill_ids = self.engine.tokenizer(prefill, add_special_tokens=False)["input_ids"] if prefill else []
        prompt_ids = ids + list(prefill_ids)
        if kept is not None and not self._fits(req, len(prompt_ids)):  # the kept tools take the reply's room
            return self.chat(req, headers, tenant, raw_body, previous_response, keep_tools=False)
        sampling, clamped = self._sampling(req, len(prompt_ids))
        prepared = Prepared(
            kind="chat",
            request_id="chatcmpl-" + uuid.uuid4().hex[:24],
            created=int(time.time()),
            prompt_ids=prompt_ids,
            session_prompt=self._prompt(req, tenant, ids, offsets, rendered, messages, tools, session.key),
            session=session,
            sampling=sampling,
            stops=req.stop_list(),
            stream=req.stream,
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
            prefill=prefill,
            plan=plan,
            constraint=self.tools.build(tools, plan, sampling.max_tokens, json_text),
            cache_salt=cache_salt(tenant, self.settings.auth),
            call_id_style=self.call_id_style,
            compare_with=req.comparison_response_id(),
            tenant=tenant,
            model=req.model,
            max_tokens_clamped=clamped,
            kept_tools=kept.masked if kept is not None else None,
            **self._retention(req),
        )
        self.tool_memory.put(tenant, session.placement, tools)
        return prepared

    def _fits(self, req: SamplingFields, prompt_len: int) -> bool:
        """Does the reply get all it asks for after this prompt (no window error, no clamp)?"""
        try:
            return self._sampling(req, prompt_len)[1] is None
        except (PromptTooLong, MaxTokensOverWindow):
            return False

    def _kept_tools(
        self, session: SessionKey, tenant: str, sent: list[dict[str, Any]], previous_response: str | None
    ) -> KeptTools | None:
        """The previous turn's tool list when this request removed or reordered tools (kept_tools.py)."""
        # only where the masks hold the calls: without an envelope nothing would stop a removed tool
        envelope: str | None = self.envelope_name
        if not self.settings.cache.keep_removed_tools or envelope is None:
            return None
        digest = response_digest(previous_response) if previous_response else None
        if digest is None and session.source not in NAMED_SOURCES:
            return None
        previous = self.tool_memory.get(tenant, digest or session.placement)
        return keep(previous, sent) if previous is not None else None

    @constraint_errors_as_400()
    def completion(
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
            ids = [int(t) for t in prompt]
            text = self.engine.tokenizer.decode(ids)
            rendered = RenderedPrompt(text, (Segment(0, len(text), "prompt"),), ())
            offsets = array("l", range(len(ids)))
        if not ids:
            raise InvalidRequest("the prompt is empty: send at least one token of text", param="prompt")
        sampling, clamped = self._sampling(req, len(ids))
        return Prepared(
            kind="text",
            request_id="cmpl-" + uuid.uuid4().hex[:24],
            created=int(time.time()),
            prompt_ids=ids,
            session_prompt=self._prompt(req, tenant, ids, offsets, rendered),
            session=self._session(req, raw_body, headers, tenant),
            sampling=sampling,
            stops=req.stop_list(),
            stream=req.stream,
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
            cache_salt=cache_salt(tenant, self.settings.auth),
            compare_with=req.comparison_response_id(),
            tenant=tenant,
            model=req.model,
            max_tokens_clamped=clamped,
            **self._retention(req),
        )
