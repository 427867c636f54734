"""``tool_choice`` as sent, parsed into types at the edge (``parse_tool_choice``; a malformed one is
a 400 that lists the accepted forms): a mode, one named function, or an allowed list (names or,
as an extension, name prefixes). The request types that carry it are in ``server/protocol.py``;
what chat makes of it is ``server/chat/tool_choice.py``. Unknown keys are ignored (pydantic's
default), as in every request type."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from server.errors import InvalidRequest

ToolChoiceMode = Literal["none", "auto", "required"]
TOOL_CHOICE_FORMS = (
    '"none", "auto", "required", {"type": "function", "function": {"name": NAME}}, or '
    '{"type": "allowed_tools", "allowed_tools": {"mode": "auto"|"required", "tools": '
    '[{"type": "function", "function": {"name": NAME}} or {"type": "function", "function": '
    '{"name_prefix": PREFIX}}, ...]}}'
)


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """``{"type": "function", "function": {"name": X}}``: exactly tool X."""

    type: Literal["function"]
    function: FunctionName


class AllowedToolRef(BaseModel):
    """An entry of ``allowed_tools.tools``: a tool by name, or (extension) every tool with a prefix.

    Accepted shapes: ``{"type": "function", "function": {"name": X}}``, the Responses API's
    ``{"type": "function", "name": X}``, and ``{"type": "function", "function": {"name_prefix": P}}``.
    """

    model_config = ConfigDict(frozen=True)
    name: str | None = None
    name_prefix: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _flatten(cls, entry: Any) -> Any:
        fn = entry.get("function", entry) if isinstance(entry, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return {"name": fn["name"]}
        if isinstance(fn, dict) and isinstance(fn.get("name_prefix"), str) and fn["name_prefix"]:
            return {"name_prefix": fn["name_prefix"]}
        raise ValueError(f"malformed entry in allowed_tools.tools: {entry!r}")


class AllowedTools(BaseModel):
    mode: Literal["auto", "required"]
    tools: list[AllowedToolRef]


class AllowedToolsChoice(BaseModel):
    """``{"type": "allowed_tools", "allowed_tools": {"mode": ..., "tools": [...]}}``."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


ToolChoice = ToolChoiceMode | NamedToolChoice | AllowedToolsChoice


def parse_tool_choice(value: Any) -> ToolChoice | None:
    """A tool_choice as sent (or already parsed) → its type; InvalidRequest naming the forms."""
    if value is None or isinstance(value, NamedToolChoice | AllowedToolsChoice):
        return value
    if isinstance(value, str) and value in ("none", "auto", "required"):
        return value  # type: ignore[return-value]
    if isinstance(value, dict):
        try:
            if value.get("type") == "function":
                return NamedToolChoice.model_validate(value)
            if value.get("type") == "allowed_tools":
                return AllowedToolsChoice.model_validate(value)
        except ValidationError as exc:
            detail = exc.errors()[0].get("msg", "")
            raise InvalidRequest(
                f"malformed tool_choice {value!r} ({detail}): use {TOOL_CHOICE_FORMS}", param="tool_choice"
            ) from None
    raise InvalidRequest(f"malformed tool_choice {value!r}: use {TOOL_CHOICE_FORMS}", param="tool_choice")
