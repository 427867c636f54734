"""A model family as data: grammars/families/NAME.yaml (prompt layout, detection, rules).

A family file says how a conversation is laid out for one kind of model (system, tools
block, user, assistant, assistant tool calls, tool results, generation prompt) as small
Jinja snippets, which models it covers, how it is recognised in a model folder, and
``envelope: NAME`` naming the call format in grammars/envelopes/ (how the model writes a
call; the masks and parsers read that file). A family may carry ``versions``: overrides
chosen by the tokenizer version (Mistral's tokenizers change the layout between v3 and
v13); ``NAME:VERSION`` picks one (``mistral:v13``).

Nothing here branches on a family's name: the renderer (server/families/render.py) only
reads these fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import yaml

from server.families.reasoning import Reasoning, parse_reasoning
from server.package_data import GRAMMARS_DIR

FAMILIES_DIR = GRAMMARS_DIR / "families"

TOOLS_PLACEMENTS = ("first_system", "own_user_turn", "first_user", "last_user")
PROMPTS = ("layout", "model_template")
SYSTEM_PLACEMENTS = ("turn", "last_user", "front")


class FamilyError(ValueError):
    """An unknown family or a malformed family file; the message names the choices."""


@dataclass(frozen=True)
class Detect:
    """How a model folder is recognised: every listed condition must hold."""

    special_tokens: tuple[str, ...] = ()  # all of these are tokens of the vocabulary
    template_contains: tuple[str, ...] = ()  # all of these occur in the model's chat template
    template_lacks: tuple[str, ...] = ()  # none of these occur in it
    model_types: tuple[str, ...] = ()  # config.json model_type is one of these (empty: any)
    priority: int = 0  # the highest-priority match wins (a more specific family ranks higher)


@dataclass(frozen=True)
class Rules:
    """What a conversation must satisfy to be expressible in this family (else a 400)."""

    call_id_pattern: str | None = None  # regex every assistant tool-call id must match
    call_id_hint: str = ""  # how to fix a bad id (shown in the 400)
    tool_result_needs_call: bool = False  # a tool message must answer an earlier call of this turn
    tool_result_needs_id: bool = False  # a tool message must carry tool_call_id
    calls_with_content: bool = True  # an assistant message may have both text and tool calls
    arguments_must_be_object: bool = False  # call arguments must be a JSON object
    tools_unsupported: str | None = None  # why tools cannot be served for this family yet (a 400)


@dataclass(frozen=True)
class Layout:
    """Where things go, and the Jinja snippet of each message kind."""

    bos: str = ""
    tools_placement: str = "first_system"
    system_placement: str = "turn"  # "last_user": all system text joins the last user message;
    # "front": every system message joins one system turn at the start (DeepSeek's templates)
    always_system_turn: bool = False  # render a system turn even with no system message
    default_system_only_with_tools: bool = False  # no system message: the default only if tools
    system_turn_with_tools: bool = False  # no system message but tools: a system turn for them
    merge_consecutive: tuple[str, ...] = ()  # roles whose consecutive messages become one
    merge_separator: str = "\n\n"
    empty_user_first: bool = False  # a conversation that does not start with a user gets ""
    group_tool_results: bool = False  # consecutive tool messages share one turn
    sort_tool_results_by_call: bool = False  # results follow the order of the calls
    generation_prompt: str = ""  # a Jinja snippet: `last` is the role of the conversation's last turn
    system: str = ""
    user: str = ""
    assistant: str = ""
    call: str = ""
    call_separator: str = ""
    tool_result: str = ""
    tool_results: str = ""  # used when group_tool_results: the whole group
    tools_block: str = ""
    tool_result_content: str = "text"  # "text" | "json_or_text" (parse JSON, dump it again)
    chunk_prefix: str = ""  # `sp` in the snippets: text before each separately encoded chunk
    arguments_json: str = "canonical"  # "canonical" | "ascii" (json.dumps default escaping)
    history_note: str = ""  # past assistant turns render otherwise than the model wrote them: why


@dataclass(frozen=True)
class Family:
    name: str
    envelope: str
    description: str
    models: tuple[str, ...]
    default_system: str
    date: str | None
    detect: Detect
    rules: Rules
    layout: Layout
    version: str | None = None
    versions: tuple[str, ...] = ()
    call_id: dict[str, Any] = field(default_factory=dict)  # how our replies' call ids look
    version_detect: tuple[dict[str, Any], ...] = ()  # [{version, special_tokens, template_contains}]
    test_model: dict[str, Any] = field(default_factory=dict)  # make-test-model: {vocab: llama3|tekken|qwen}
    reasoning: Reasoning | None = None  # how the model reasons before answering (reasoning.py)
    # "layout": rendered from ``layout``; "model_template": the model folder's own chat template
    # renders (server/families/model_template.py; Gemma 4), the family gives detection and the masks
    prompt: str = "layout"

    @property
    def ref(self) -> str:
        """``name`` or ``name:version`` (what ``model_family`` accepts)."""
        return f"{self.name}:{self.version}" if self.version else self.name


def family_names() -> list[str]:
    return sorted(p.stem for p in FAMILIES_DIR.glob("*.yaml"))


def family_choices() -> list[str]:
    """Every accepted ``model_family`` value: names, and name:version for versioned files."""
    out = []
    for name in family_names():
        data = _read(name)
        out.append(name)
        out += [f"{name}:{v}" for v in sorted((data.get("versions") or {}).keys())]
    return out


def _read(name: str) -> dict[str, Any]:
    path = FAMILIES_DIR / f"{name}.yaml"
    if not path.is_file():
        raise FamilyError(f"unknown model family {name!r}: use one of {family_choices()}")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise FamilyError(f"{path} is not a mapping")
    return data


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def _section(cls: type, data: dict[str, Any] | None, where: str) -> Any:
    data = dict(data or {})
    for key, value in list(data.items()):
        if isinstance(value, list):
            data[key] = tuple(value)
    try:
        return cls(**data)
    except TypeError as exc:
        raise FamilyError(f"{where}: {exc}") from None


@cache
def load_family(ref: str) -> Family:
    """The family ``NAME`` or ``NAME:VERSION`` (a versioned file without a version: its default)."""
    name, _, version = ref.partition(":")
    data = _read(name)
    versions = data.pop("versions", None) or {}
    default_version = data.pop("default_version", None)
    version = version or default_version
    if version:
        if version not in versions:
            raise FamilyError(
                f"family {name!r} has no version {version!r}: use one of "
                f"{[f'{name}:{v}' for v in sorted(versions)]}"
            )
        data = _merge(data, versions[version])
    where = f"grammars/families/{name}.yaml"
    layout = _section(Layout, data.get("layout"), where + " layout")
    if layout.tools_placement not in TOOLS_PLACEMENTS:
        raise FamilyError(f"{where}: tools_placement must be one of {TOOLS_PLACEMENTS}")
    if layout.system_placement not in SYSTEM_PLACEMENTS:
        raise FamilyError(f"{where}: system_placement must be one of {SYSTEM_PLACEMENTS}")
    prompt = str(data.get("prompt", "layout"))
    if prompt not in PROMPTS:
        raise FamilyError(f"{where}: prompt must be one of {PROMPTS}")
    return Family(
        name=name,
        envelope=str(data["envelope"]),
        description=str(data.get("description", "")),
        models=tuple(data.get("models") or ()),
        default_system=str(data.get("default_system") or ""),
        date=data.get("date"),
        detect=_section(Detect, data.get("detect"), where + " detect"),
        rules=_section(Rules, data.get("rules"), where + " rules"),
        layout=layout,
        version=version or None,
        versions=tuple(sorted(versions)),
        call_id=dict(data.get("call_id") or {}),
        version_detect=tuple(data.get("version_detect") or ()),
        test_model=dict(data.get("test_model") or {}),
        reasoning=_reasoning(data.get("reasoning"), where),
        prompt=prompt,
    )


def _reasoning(data: Any, where: str) -> Reasoning | None:
    try:
        return parse_reasoning(data, where)
    except ValueError as exc:
        raise FamilyError(str(exc)) from None
