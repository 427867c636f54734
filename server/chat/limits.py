"""Per-request size limits checked before any rendering or tokenizing (each a 400 naming its setting).

Every limit is a field of ``limits`` in server/config/limits.py and is listed in docs/security.md.
"""

from __future__ import annotations

import json
import re
from typing import Any

from server.config import LimitsSettings
from server.constrain.pattern_cost import schema_pattern_cost
from server.errors import InvalidRequest
from server.families.markers import MARKERS
from server.protocol import SamplingFields

MACHINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # a request's tool_state_machine: a name only


def check_sent_tools(tools: Any, limits: LimitsSettings) -> None:
    """A dialect's ``tools`` as sent, counted before conversion: hosted / server tools this server
    drops count too (100,000 of them were 100,000 log lines and a 3.8 MiB answer)."""
    if isinstance(tools, list) and len(tools) > limits.max_tools:
        raise InvalidRequest(
            f"{len(tools)} tools sent (hosted ones included); the limit is {limits.max_tools} "
            f"(limits.max_tools): send fewer",
            param="tools",
        )


def check_request_limits(req: SamplingFields, limits: LimitsSettings) -> None:
    """Refuse a request whose stop strings, stop token ids, logit_bias or messages exceed the limits."""
    stops = req.stop_list()
    if len(stops) > limits.max_stop_sequences:
        raise InvalidRequest(
            f"{len(stops)} stop strings sent; the limit is {limits.max_stop_sequences} "
            f"(limits.max_stop_sequences): send fewer",
            param="stop",
        )
    longest = max((len(s) for s in stops), default=0)
    if longest > limits.max_stop_chars:
        raise InvalidRequest(
            f"a stop string is {longest} characters; the limit is {limits.max_stop_chars} "
            f"(limits.max_stop_chars): shorten it",
            param="stop",
        )
    if req.stop_token_ids is not None and len(req.stop_token_ids) > limits.max_stop_token_ids:
        raise InvalidRequest(
            f"{len(req.stop_token_ids)} stop_token_ids sent; the limit is {limits.max_stop_token_ids} "
            f"(limits.max_stop_token_ids): send fewer",
            param="stop_token_ids",
        )
    if req.logit_bias is not None and len(req.logit_bias) > limits.max_logit_bias:
        raise InvalidRequest(
            f"{len(req.logit_bias)} logit_bias entries sent; the limit is {limits.max_logit_bias} "
            f"(limits.max_logit_bias): send fewer",
            param="logit_bias",
        )
    for i, tool in enumerate(getattr(req, "tools", None) or []):
        function = getattr(tool, "function", None)
        parameters = getattr(function, "parameters", None)
        check_schema_bounds(parameters, limits, f"tools[{i}].function.parameters")
    rf = getattr(req, "response_format", None)
    schema = (getattr(rf, "json_schema", None) or {}).get("schema")
    if schema is not None:
        size = len(json.dumps(schema, separators=(",", ":")).encode())
        if size > limits.max_response_format_schema_bytes:
            raise InvalidRequest(
                f"response_format.json_schema.schema is {size} bytes of JSON; the limit is "
                f"{limits.max_response_format_schema_bytes} (limits.max_response_format_schema_bytes): "
                f"shorten the schema",
                param="response_format.json_schema.schema",
            )
        check_schema_bounds(schema, limits, "response_format.json_schema.schema")
    _check_noncharacters(req)
    messages = getattr(req, "messages", None)
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        raise InvalidRequest(
            f"{len(messages)} messages sent; the limit is {limits.max_messages} (limits.max_messages): "
            f"shorten the conversation",
            param="messages",
        )


# Lower bounds are what the shortest-call estimate and a grammar must write out; upper bounds
# cost nothing (xgrammar compiles maxLength 10**9 in 0.4 s) and real clients send big ones
# (Claude Code 2.1.328: maxLength 524288), so they are not limited.
BOUND_KEYS = ("minLength", "minItems", "minProperties", "minContains")


def check_schema_bounds(schema: Any, limits: LimitsSettings, param: str) -> None:
    """A 400 when a lower length / count bound anywhere in ``schema`` is over limits.max_schema_bound
    (the masks must write that much; the shortest-call estimate counts it)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in BOUND_KEYS and isinstance(value, int | float) and value > limits.max_schema_bound:
                    raise InvalidRequest(
                        f"{param}: {key} = {value} is over the limit of {limits.max_schema_bound} "
                        f"(limits.max_schema_bound): use a smaller bound",
                        param=param,
                    )
                stack.append(value)
    cost = schema_pattern_cost(schema)
    if cost > limits.max_schema_pattern_cost:
        raise InvalidRequest(
            f"{param}: its regular expressions ('pattern') expand to {cost} character positions, over the "
            f"limit of {limits.max_schema_pattern_cost} (limits.max_schema_pattern_cost): use smaller "
            "bounded repetitions ({m,n}), or '*' / '+'",
            param=param,
        )


def _check_noncharacters(req: SamplingFields) -> None:
    """U+FDD0..U+FDD2 mark segments inside the renderer: refused in tools and calls as in content
    (families that render JSON without escaping would otherwise break the prompt: a 500)."""
    for i, tool in enumerate(getattr(req, "tools", None) or []):
        if _has_marker(tool):
            raise InvalidRequest(
                f"tools[{i}] contains a Unicode noncharacter (U+FDD0..U+FDD2): remove it", param=f"tools[{i}]"
            )
    for i, msg in enumerate(getattr(req, "messages", None) or []):
        for call in getattr(msg, "tool_calls", None) or []:
            if _has_marker(call):
                raise InvalidRequest(
                    f"messages[{i}].tool_calls contains a Unicode noncharacter (U+FDD0..U+FDD2): remove it",
                    param=f"messages[{i}].tool_calls",
                )


def _has_marker(value: Any) -> bool:
    dump = getattr(value, "model_dump_json", None)
    text = dump() if callable(dump) else json.dumps(value, ensure_ascii=False, default=str)
    return any(c in text for c in MARKERS)
