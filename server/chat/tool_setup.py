"""A chat request's constraint, planned and built (CPU work, raises the 400s).

Tools are checked (sizes, custom grammars) and planned (``plan_tools``), the request's reasoning
settings join the plan (``with_reasoning``), and the service's ``Compiler`` compiles the
request's ``ToolSpec`` once (name trie and argument grammars, cached by schema): a bad tool
choice or an unenforceable schema is a 400 here, before the request waits for a decode slot,
and the ``Constraint`` goes to the engine with the request, which compiles nothing.

What varies by family is read through the renderer's seam (``PromptRenderer.reasoning``,
``PromptRenderer.tools_unsupported``), never by the family's name.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from server.chat.limits import MACHINE_NAME as _MACHINE_NAME
from server.chat.reasoning_reply import with_reasoning
from server.chat.state_machine import StateMachine, StateMachineError, load_state_machine
from server.chat.tool_choice import plan_tools
from server.config import Settings
from server.constrain.compiler import Compiler
from server.constrain.constraint import Constraint
from server.constrain.custom.grammar import check_format
from server.constrain.plan import ToolPlan
from server.constrain.spec import ToolSpec
from server.errors import InvalidRequest
from server.families.defaults import DEFAULT_ENVELOPE
from server.families.envelope import Envelope
from server.families.rendered import PromptRenderer
from server.protocol import ChatCompletionRequest
from server.session_key import canonical_json
from server.tool_keys import CUSTOM_KEY


class ToolSetup:
    """Plans a chat request's tools and reasoning, and compiles its constraint."""

    def __init__(
        self,
        compiler: Compiler,
        settings: Settings,
        renderer: PromptRenderer,
        envelope_name: str | None,
        envelope: Envelope | None,
        family_ref: str,
    ) -> None:
        self.compiler = compiler
        self.settings = settings
        self.renderer = renderer
        self.envelope_name = envelope_name
        self.envelope = envelope
        self.family_ref = family_ref
        self.default_machine = (
            load_state_machine(settings.tool_state_machine) if settings.tool_state_machine else None
        )

    def check_tools(self, tools: list[dict[str, Any]]) -> None:
        """Size limits and the family's support; names (missing, malformed, duplicate) are checked
        by ``tool_names`` in plan_tools."""
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
        unsupported = self.renderer.tools_unsupported
        if tools and unsupported:  # family data: masks cannot serve it
            raise InvalidRequest(
                f"tool calling is not supported for this model's family ({self.family_ref}) yet: "
                f"{unsupported}",
                param="tools",
            )

    def machine(self, name: str | None) -> StateMachine | None:
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

    def plan(
        self,
        req: ChatCompletionRequest,
        tools: list[dict[str, Any]],
        messages: list[dict[str, Any]],
    ) -> ToolPlan:
        """The tool plan with the request's reasoning (the masks let the model reason first)."""
        machine = self.machine(req.tool_state_machine)
        plan = plan_tools(tools, req.tool_choice, messages, req.parallel_tool_calls, machine, self.envelope)
        return with_reasoning(plan, self.renderer.reasoning, req)

    def build(
        self, tools: list[dict[str, Any]], plan: ToolPlan, budget: int, json_text: dict[str, Any] | None
    ) -> Constraint | None:
        """The request's ToolSpec, compiled once (400s here); None: nothing to constrain.

        The engine decodes under it (``GenerationRequest.constraint``): nothing compiles the
        spec again in this process. ``json_text``: the schema of the reply's text
        (response_format), None for free text.
        """
        if self.envelope_name is None:  # no envelope: the tools are in the prompt, calls are not masked
            tools, plan = [], replace(plan, mode="none", allowed=(), prefill="")
        if not tools and json_text is None and plan.reasoning is None:
            return None
        spec = ToolSpec(
            tools,
            plan,
            self.envelope_name or DEFAULT_ENVELOPE,  # no calls: only response_format's text is masked
            self.settings.grammar_backend,
            self.compiler.eos_token_ids,
            budget=budget,
            text_schema=json_text,
        )
        return self.compiler.compile(spec)
