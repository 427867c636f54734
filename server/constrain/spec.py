"""``ToolSpec``: the declarative tool constraint of one request, as it crosses the engine seam.

The chat service plans tools (``plan_tools``) and hands the engine a ``ToolSpec`` — the
tools, the plan, the envelope name, the arguments backend, the EOS ids and the schema of
the reply's text (``response_format``) — never a live constraint. Each engine builds the
constraint where it decodes (``Compiler``):
the hf engine in its own process, the vLLM engine's logits processor in vLLM's engine
core, from the JSON form carried in ``SamplingParams.extra_args[EXTRA_ARGS_KEY]``.

``ToolSpec.from_json`` is the one validator of that JSON form: it raises ``ValueError``
naming the bad field and the fix (vLLM turns it into HTTP 400 in ``validate_params``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from server.constrain.arguments.backends import backend_names
from server.constrain.plan import ToolPlan
from server.families.defaults import DEFAULT_ENVELOPE
from server.families.envelope import load_envelope

EXTRA_ARGS_KEY = "agentserve"  # the key of the spec in vLLM's SamplingParams.extra_args
_KEYS = ("tools", "plan", "envelope", "backend", "eos_token_ids", "request_id", "budget", "text_schema")


@dataclass(frozen=True)
class ToolSpec:
    tools: list[dict[str, Any]]  # OpenAI tool objects, in request order
    plan: ToolPlan
    envelope: str = DEFAULT_ENVELOPE  # a name in grammars/envelopes/ (or a path to a .yaml file)
    backend: str = "xgrammar"  # an arguments backend of server.constrain.arguments.backends
    eos_token_ids: tuple[int, ...] = ()  # () = the model's own (the engine fills them in)
    request_id: str | None = field(default=None, compare=False)  # only to tag log lines
    budget: int | None = None  # max_tokens of the reply: no parallel call is begun that cannot finish
    # response_format: the JSON schema the reply's text must follow (None: free text). A spec may
    # carry no tools and only this (server/constrain/response_format.py).
    text_schema: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON-safe form (what ``from_json`` reads back)."""
        out: dict[str, Any] = {
            "tools": self.tools,
            "plan": self.plan.to_dict(),
            "envelope": self.envelope,
            "backend": self.backend,
            "eos_token_ids": list(self.eos_token_ids),
        }
        if self.request_id is not None:
            out["request_id"] = self.request_id
        if self.budget is not None:
            out["budget"] = self.budget
        if self.text_schema is not None:
            out["text_schema"] = self.text_schema
        return out

    def to_extra_args(self) -> dict[str, Any]:
        return {EXTRA_ARGS_KEY: self.to_json()}

    @classmethod
    def from_json(cls, spec: Any) -> ToolSpec:
        """Parse and check the JSON form; ValueError names the bad field and the fix."""
        where = f'vllm_xargs["{EXTRA_ARGS_KEY}"]'
        if isinstance(spec, str):  # stock vLLM's vllm_xargs allows no nested objects: a JSON string then
            try:
                spec = json.loads(spec)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where} is not valid JSON ({exc})") from None
        if not isinstance(spec, dict):
            raise ValueError(f"{where} must be an object with 'tools' and 'plan', got {type(spec).__name__}")
        unknown = set(spec) - set(_KEYS)
        if unknown:
            raise ValueError(f"{where} has unknown keys {sorted(unknown)}: allowed are {', '.join(_KEYS)}")
        tools = spec.get("tools")
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise ValueError(
                f"{where}.tools must be a list of OpenAI tool objects "
                f'({{"type": "function", "function": {{"name": ..., "parameters": ...}}}})'
            )
        if not isinstance(spec.get("plan"), dict):
            raise ValueError(f"{where}.plan must be an object (ToolPlan.to_dict()), got {spec.get('plan')!r}")
        backend = spec.get("backend", "xgrammar")
        if backend not in backend_names():
            raise ValueError(f"{where}.backend {backend!r} is not known: use one of {backend_names()}")
        eos = spec.get("eos_token_ids")
        if eos is not None and (
            not isinstance(eos, list) or not all(isinstance(t, int) and t >= 0 for t in eos)
        ):
            raise ValueError(f"{where}.eos_token_ids must be a list of token ids, got {eos!r}")
        envelope = spec.get("envelope", DEFAULT_ENVELOPE)
        load_envelope(envelope)  # ValueError names the known envelopes
        try:
            plan = ToolPlan.from_dict(spec["plan"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{where}.plan is not a valid ToolPlan ({exc}): send ToolPlan.to_dict()"
            ) from None
        names = {t.get("function", {}).get("name") for t in tools}
        missing = sorted(set(plan.allowed) - names)
        if missing:
            raise ValueError(f"{where}.plan allows tools {missing} that are not in {where}.tools: add them")
        request_id = spec.get("request_id")
        budget = spec.get("budget")
        if budget is not None and (not isinstance(budget, int) or budget < 0):
            raise ValueError(f"{where}.budget must be a token count (int >= 0) or absent, got {budget!r}")
        text_schema = spec.get("text_schema")
        if text_schema is not None and not isinstance(text_schema, dict):
            raise ValueError(
                f"{where}.text_schema must be a JSON schema object or absent, got {text_schema!r}"
            )
        return cls(
            tools,
            plan,
            envelope,
            backend,
            tuple(eos or ()),
            str(request_id) if request_id is not None else None,
            budget,
            text_schema,
        )
