"""Preparing a request (CPU work, raises the 400s): validate, render + tokenize, plan tools, session key.

The result, ``Prepared``, is everything the generate and respond steps need; nothing
here touches the engine's decode loop. Tools are planned (``plan_tools``) and the
engine's constraint builder compiles the request's ``ToolSpec`` once (name trie and
argument grammars, cached by schema): a bad tool choice or an unenforceable schema is a
400 here, before the request waits for a decode slot, and the compiled constraint goes
to the engine with the request (``Prepared.constraint``), which does not compile it again.
"""

from __future__ import annotations

import logging
import time
import uuid
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from server.auth import cache_salt, namespaced_session
from server.cache_diag import Prompt, fingerprint
from server.chat.limits import MACHINE_NAME as _MACHINE_NAME
from server.chat.limits import check_request_limits
from server.chat.reasoning import with_reasoning
from server.chat.sampling import check_fields, sampling_params
from server.chat.state_machine import StateMachine, StateMachineError, load_state_machine
from server.chat.template import render_chat
from server.chat.tool_choice import plan_tools
from server.config import Settings
from server.constrain.custom_grammar import check_format, prompt_tools
from server.constrain.interface import TokenConstraint
from server.constrain.plan import ToolPlan
from server.constrain.response_format import text_schema
from server.constrain.spec import ToolSpec
from server.engines.base import Engine, SamplingParams, constraint_errors_as_400
from server.errors import ContextLengthExceeded, InvalidRequest, ModelNotFound
from server.families.envelope import load_envelope
from server.families.rendered import RenderedPrompt, Segment
from server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from server.response_types import MaxTokensClamped
from server.session_key import SessionKey, canonical_json, session_key
from server.tool_keys import CUSTOM_KEY

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
    tool_spec: ToolSpec | None = None
    # tool_spec compiled (a fresh matcher): handed to the engine by the first generation (``take_constraint``)
    constraint: TokenConstraint | None = None
    cache_salt: str = ""
    call_id_style: Mapping[str, Any] | None = None  # the family's call-id format
    compare_with: str | None = None  # a response id to diagnose the cache against
    tenant: str = ""
    model: str = ""  # the served name the request used (an alias or served_model_name): echoed back
    # max_tokens lowered to fit the window (limits.max_tokens_over_window: clamp): every dialect reports it
    max_tokens_clamped: MaxTokensClamped | None = None
    retain_s: float = 0.0  # the client's retention hint for the session's KV (seconds; 0: none)
    retention_unused: str | None = None  # why the engine does not use that hint (None: used, or no hint)

    def take_constraint(self) -> TokenConstraint | None:
        """The compiled constraint, once: a matcher is stateful, so a second generation compiles anew."""
        constraint, self.constraint = self.constraint, None
        return constraint


class Preparer:
    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        renderer: Any,
        envelope: str,
        call_id_style: Mapping[str, Any] | None = None,
        family_ref: str = "",
    ) -> None:
        """``renderer``: the family's prompt renderer; ``envelope``: the name of its call envelope."""
        self.engine = engine
        self.settings = settings
        self.renderer = renderer
        self.envelope_name = envelope
        self.envelope = load_envelope(envelope)
        self.call_id_style = call_id_style
        self.family_ref = family_ref
        self.warned_retention = False  # the first unused retention hint is logged, once
        self.default_machine = (
            load_state_machine(settings.tool_state_machine) if settings.tool_state_machine else None
        )
        # the vocabulary and the configured envelope's factory now, not on the first tool request
        engine.constraints.factory(envelope, settings.grammar_backend)

    def _retention(self, req: SamplingFields) -> dict[str, Any]:
        """The request's retention hint, and why the engine does not use it (said in the response)."""
        retain_s = req.retention_hint_s()
        unused = self.engine.retention_hints() if retain_s > 0 else None
        if unused is not None and not self.warned_retention:
            self.warned_retention = True
            log.warning("a request's retention hint (%.0f s) is not used: %s", retain_s, unused)
        return {"retain_s": retain_s, "retention_unused": unused}

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

    def _tokenize(self, rendered: RenderedPrompt) -> tuple[list[int], array[int]]:
        enc = self.engine.tokenizer(rendered.text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), array("l", (s for s, _ in enc["offset_mapping"]))

    def _sampling(
        self, req: SamplingFields, prompt_len: int
    ) -> tuple[SamplingParams, MaxTokensClamped | None]:
        """The sampling parameters, and the clamp when max_tokens was lowered to fit the window."""
        room = self.engine.max_model_len - prompt_len
        if room < 1:
            raise ContextLengthExceeded(
                f"the prompt is {prompt_len} tokens but the context window is {self.engine.max_model_len}: "
                f"shorten the conversation (nothing was truncated)",
                param="messages",
            )
        asked = req.requested_max_tokens()
        name = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        cap = self.settings.limits.max_tokens
        if asked is not None and cap is not None and asked > cap:
            raise InvalidRequest(
                f"{name}={asked} is over this server's limit of {cap} (limits.max_tokens): ask for fewer",
                param=name,
            )
        clamped = None
        if asked is not None and asked > room and self.settings.limits.max_tokens_over_window == "clamp":
            clamped = MaxTokensClamped(requested=asked, granted=room)
            log.info(
                "%s=%d lowered to %d: the prompt holds %d of the %d-token context window "
                "(limits.max_tokens_over_window: clamp)",
                name,
                asked,
                room,
                prompt_len,
                self.engine.max_model_len,
            )
            asked = room
        if asked is not None and asked > room:
            raise ContextLengthExceeded(
                f"prompt ({prompt_len} tokens) + {name} ({asked}) exceeds the context window "
                f"({self.engine.max_model_len}): lower {name} to at most {room} or shorten the prompt "
                f"(this server refuses rather than lowers it: limits.max_tokens_over_window is reject)",
                param=name,
            )
        max_tokens = asked if asked is not None else min(self.settings.default_max_tokens, room)
        return sampling_params(req, max_tokens, self.engine), clamped

    def _prompt(
        self,
        req: SamplingFields,
        tenant: str,
        ids: list[int],
        offsets: array[int],
        rendered: RenderedPrompt,
        messages: list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Prompt:
        """The prompt as the cache report keeps it (fingerprint + ids/text for the session baseline)."""
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
        return Prompt(fp, array("l", ids), rendered.text, offsets)

    def _check_tools(self, tools: list[dict[str, Any]]) -> None:
        """Size limits; names (missing, malformed, duplicate) are checked by ``tool_names`` in plan_tools."""
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
            fmt = tool.get(CUSTOM_KEY)
            if isinstance(fmt, dict) and fmt.get("type") == "grammar":  # a custom tool's grammar compiles
                check_format(fmt, f"tools[{i}].custom.format")

    def _machine(self, name: str | None) -> StateMachine | None:
        """The request's state machine: the configured default, another by name, or "off"."""
        if name is None:
            return self.default_machine
        if name == "off":
            return None
        if not _MACHINE_NAME.fullmatch(name):  # a name from grammars/, never a path (x.yml, ../x, C:\\x)
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
        return SessionKey(namespaced_session(tenant, key.key), key.source, key.digest)

    def _tool_spec(
        self, tools: list[dict[str, Any]], plan: ToolPlan, budget: int, json_text: dict[str, Any] | None
    ) -> tuple[ToolSpec | None, TokenConstraint | None]:
        """The request's ToolSpec and its constraint, compiled once by the engine's builder (400s here).

        The engine decodes under that constraint (``GenerationRequest.constraint``): nothing
        compiles the spec again in this process. ``json_text``: the schema of the reply's
        text (response_format), None for free text.
        """
        if not tools and json_text is None and plan.reasoning is None:
            return None, None
        spec = ToolSpec(
            tools,
            plan,
            self.envelope_name,
            self.settings.grammar_backend,
            self.engine.eos_token_ids,
            budget=budget,
            text_schema=json_text,
        )
        return spec, self.engine.constraints.build(spec)

    # -- requests -------------------------------------------------------------------------------
    @constraint_errors_as_400()
    def chat(
        self,
        req: ChatCompletionRequest,
        headers: Mapping[str, str],
        tenant: str = "",
        raw_body: Mapping[str, Any] | None = None,
    ) -> Prepared:
        self._check_common(req)
        rf = req.response_format
        json_text = text_schema(rf.type, rf.json_schema) if rf is not None else None
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
        self._check_tools(tools)
        rules = getattr(getattr(self.renderer, "family", None), "rules", None)
        if tools and rules is not None and rules.tools_unsupported:  # family data: masks cannot serve it
            raise InvalidRequest(
                f"tool calling is not supported for this model's family ({self.family_ref}) yet: "
                f"{rules.tools_unsupported}",
                param="tools",
            )
        rendered = render_chat(req.messages, prompt_tools(tools), self.renderer)  # custom tools: as functions
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        machine = self._machine(req.tool_state_machine)
        plan = plan_tools(tools, req.tool_choice, messages, req.parallel_tool_calls, machine, self.envelope)
        family = getattr(self.renderer, "family", None)
        plan = with_reasoning(plan, getattr(family, "reasoning", None), req, json_text is not None)
        ids, offsets = self._tokenize(rendered)
        prefill = plan.prompt_prefill  # with reasoning: the masks force the call's opening later
        prefill_ids = self.engine.tokenizer(prefill, add_special_tokens=False)["input_ids"] if prefill else []
        prompt_ids = ids + list(prefill_ids)
        sampling, clamped = self._sampling(req, len(prompt_ids))
        spec, constraint = self._tool_spec(tools, plan, sampling.max_tokens, json_text)
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
            prefill=prefill,
            plan=plan,
            tool_spec=spec,
            constraint=constraint,
            cache_salt=cache_salt(tenant, self.settings.auth),
            call_id_style=self.call_id_style,
            compare_with=req.comparison_response_id(),
            tenant=tenant,
            model=req.model,
            max_tokens_clamped=clamped,
            **self._retention(req),
        )

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
