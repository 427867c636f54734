"""The tool-call envelope of a model family, loaded from grammars/envelopes/NAME.yaml.

An envelope says how a model writes its tool calls; the masks, the parser and the
history renderer all read it, so what the model may write, what is parsed and what
is rendered back into the next prompt are the same text. A reply holding calls is::

    [text] calls_open  call_start name_open NAME name_close ARGS call_end
           (call_separator call_start name_open NAME name_close ARGS call_end)*  calls_close

* ``trigger`` — how a call begins: ``text`` (a tag in free text, ``<tool_call>``: the
  stripped ``call_start``), ``token`` (a special token, Mistral's ``[TOOL_CALLS]``: the
  first special token of ``calls_open + call_start``) or ``start`` (no marker: the
  reply *is* the call when it begins with the opening, Llama 3's ``{"name": "``).
* Strings may hold special tokens (listed in ``special_tokens``): each is one token id,
  never text (``[TOOL_CALLS]``, ``[ARGS]``).
* ``arguments`` — ``json`` (an object following the tool's schema),
  ``xml_parameters`` (Qwen3-Coder: ``<parameter=KEY>\\nVALUE\\n</parameter>\\n`` per
  argument, raw values typed by the schema) or ``tagged`` (``parameter_open`` with ``{key}``,
  the value, ``parameter_close`` per argument: GLM's ``<arg_key>K</arg_key><arg_value>V</arg_value>``,
  MiniMax's ``<parameter name="K">V</parameter>``; server/families/tagged_arguments.py), or
  ``gemma`` (Gemma 4: ``key:value`` pairs in dictsort order, strings between ``<|"|>``:
  server/families/gemma_arguments.py).
* ``grammar_tokens`` — special tokens the arguments grammar writes as part of its text (Gemma 4's
  ``<|"|>`` and the ``<tool_call|>`` of its ``call_end``); they must be in ``special_tokens``.
* ``call_id`` — a regex for an id the model writes itself, placed where ``call_end``
  (Mistral v3: 9 alphanumerics) or ``name_close`` says ``{call_id}`` (Mistral v11:
  ``[CALL_ID]{call_id}[ARGS]``, between two special tokens; Kimi K2: ``:{call_id}<|…|>``, after
  the byte that ends the name, a running index ``[0-9]{1,4}``); the parser returns it as the
  call id, or ``id_format`` with it (Kimi: ``functions.{name}:{call_id}``, the id its template
  writes back); ``call_id_counts``: that id is the call's running index over the conversation's
  calls, which the masks force (the plan's ``first_call_index`` + k).
* A reply's calls may form a section of special tokens (``sectioned``: ``calls_open``,
  ``call_start``, ``call_end`` and ``calls_close`` each one special token; Kimi K2, DeepSeek
  V3.1): the masks force ``call_end``, then allow the next ``call_start`` or ``calls_close``, then
  the end of the reply (server/chat/section_calls.py parses it).
* ``key_order`` — ``schema`` (properties in the schema's order: what models are trained on,
  and what the history renders back, since arguments keep their key order) or ``sorted``
  (an opt-in for a deployment whose clients sort argument keys themselves).
* ``call_after_text`` — false when a reply with calls holds nothing else (Mistral v3:
  the trigger token only as the reply's first token).
* ``end_tokens`` — special tokens that may end a reply (the engine must stop on them).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from server.package_data import GRAMMARS_DIR

TRIGGERS = ("text", "token", "start")
ARGUMENT_KINDS = ("json", "xml_parameters", "tagged", "gemma")


@dataclass(frozen=True)
class Envelope:
    name: str
    call_start: str  # "<tool_call>\n"
    name_open: str  # '{"name": "'
    name_close: str  # '", "arguments": '
    call_end: str  # "}\n</tool_call>"
    call_separator: str = ""
    trigger: str = "text"
    calls_open: str = ""
    calls_close: str = ""
    arguments: str = "json"
    parallel: bool = True
    key_order: str = "schema"
    call_id: str | None = None
    id_format: str = ""  # the call id from the id the model wrote: "functions.{name}:{call_id}" (Kimi)
    call_id_counts: bool = False  # the written id is the call's index in the conversation (forced)
    call_after_text: bool = True  # False: a reply with calls holds nothing else (trigger only at its start)
    special_tokens: tuple[str, ...] = ()
    end_tokens: tuple[str, ...] = ()
    grammar_tokens: tuple[str, ...] = ()  # special tokens inside the arguments grammar's text
    description: str = ""
    # prompt side, read by the family renderer (server/families/render.py)
    tool_response_open: str = ""
    tool_response_close: str = ""
    tools_preamble: str = ""
    tools_postamble: str = ""
    # arguments "tagged": each argument is parameter_open (with "{key}") + value + parameter_close
    parameter_open: str = ""
    parameter_close: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "special_tokens", tuple(self.special_tokens))
        object.__setattr__(self, "end_tokens", tuple(self.end_tokens))
        object.__setattr__(self, "grammar_tokens", tuple(self.grammar_tokens))
        where = f"envelope {self.name!r}"
        if not set(self.grammar_tokens) <= set(self.special_tokens):
            raise ValueError(f"{where}: grammar_tokens must be listed in special_tokens too")
        if self.trigger not in TRIGGERS:
            raise ValueError(f"{where}: trigger {self.trigger!r} is not one of {TRIGGERS}")
        if self.arguments not in ARGUMENT_KINDS:
            raise ValueError(f"{where}: arguments {self.arguments!r} is not one of {ARGUMENT_KINDS}")
        if self.key_order not in ("schema", "sorted"):
            raise ValueError(f"{where}: key_order must be 'schema' or 'sorted'")
        places = self.call_end.count("{call_id}") + self.name_close.count("{call_id}")
        if (self.call_id is None) != (places == 0) or places > 1:
            raise ValueError(f"{where}: call_id and one '{{call_id}}' in call_end or name_close go together")
        if "{call_id}" in self.name_close:  # [CALL_ID]{call_id}[ARGS], or Kimi's :{call_id}<|…|>
            before, after = self.name_close.split("{call_id}")
            ends_name = self.leading_special(before) == before or (
                len(before) == 1 and self.leading_special(before) is None
            )
            if not ends_name or self.leading_special(after) is None:
                raise ValueError(
                    f"{where}: a '{{call_id}}' in name_close sits between two special tokens "
                    f"('[CALL_ID]{{call_id}}[ARGS]') or between the byte that ends the name and a "
                    f"special token (':{{call_id}}<|tool_call_argument_begin|>')"
                )
        if self.call_id_counts and self.call_id is None:
            raise ValueError(f"{where}: call_id_counts numbers the id the model writes: it needs call_id")
        if self.id_format and (self.call_id is None or "{call_id}" not in self.id_format):
            raise ValueError(f"{where}: id_format writes the model's '{{call_id}}': it needs call_id")
        if self.trigger == "token" and self.trigger_token is None:
            raise ValueError(
                f"{where}: trigger 'token' needs calls_open or call_start to begin with a special token"
            )
        if self.trigger == "text" and not self.opening.startswith(self.call_tag):
            raise ValueError(f"{where}: the call tag {self.call_tag!r} must open the call")
        if not self.call_after_text and self.trigger != "token":
            raise ValueError(
                f"{where}: call_after_text false is for trigger 'token' (trigger 'start' implies it)"
            )
        if not self.name_close:
            raise ValueError(f"{where}: name_close is empty: the masks need to know where a name ends")
        if (self.arguments == "tagged") != bool(self.parameter_open and self.parameter_close):
            raise ValueError(f"{where}: arguments 'tagged' and parameter_open / parameter_close go together")
        if self.arguments == "tagged" and self.parameter_open.count("{key}") != 1:
            raise ValueError(f"{where}: parameter_open holds '{{key}}' once (where the argument's name goes)")

    # --- special tokens ---------------------------------------------------------------------
    def leading_special(self, text: str) -> str | None:
        """The special token ``text`` begins with, or None."""
        return next((t for t in self.special_tokens if text.startswith(t)), None)

    def strip_special(self, text: str) -> tuple[str | None, str]:
        tok = self.leading_special(text)
        return (tok, text[len(tok) :]) if tok else (None, text)

    @property
    def sectioned(self) -> bool:
        """calls_open, call_start, call_end and calls_close are each one special token (Kimi, DeepSeek)."""
        marks = (self.calls_open, self.call_start, self.call_end, self.calls_close)
        return all(m and self.leading_special(m) == m for m in marks)

    def call_id_of(self, name: str, written: str) -> str:
        """The call id the client gets from the id the model wrote (``id_format``, else as written)."""
        return (
            self.id_format.replace("{name}", name).replace("{call_id}", written)
            if self.id_format
            else written
        )

    def written_id(self, name: str, call_id: str) -> str:
        """The part of a call id the model writes (Kimi: the index of ``functions.NAME:IDX``)."""
        if not self.id_format:
            return call_id
        head, _, tail = self.id_format.replace("{name}", name).partition("{call_id}")
        if call_id.startswith(head) and call_id.endswith(tail) and len(call_id) >= len(head) + len(tail):
            return call_id[len(head) : len(call_id) - len(tail)]
        return call_id

    # --- derived strings ----------------------------------------------------------------------
    @property
    def call_tag(self) -> str:
        """The text that opens a call, without trailing whitespace ("<tool_call>")."""
        return self.call_start.strip()

    @property
    def call_close_tag(self) -> str:
        """The text that closes a call: the last line of call_end ("</tool_call>")."""
        lines = self.call_end.strip().splitlines()
        return lines[-1].strip() if lines else ""

    @property
    def opening(self) -> str:
        """Everything before the first call's name: the prefill of required / named modes."""
        return self.calls_open + self.call_start + self.name_open

    @property
    def next_opening(self) -> str:
        """Everything between the end of one call and the next call's name."""
        return self.call_separator + self.call_start + self.name_open

    @property
    def trigger_token(self) -> str | None:
        return self.leading_special(self.calls_open + self.call_start)

    @property
    def name_close_token(self) -> str | None:
        """The special token that ends a name (Mistral's ``[ARGS]``), or None (a text byte does)."""
        return self.leading_special(self.name_close)

    def end_text(self, call_id: str = "") -> str:
        return self.call_end.replace("{call_id}", call_id)

    def close_text(self, call_id: str = "") -> str:
        """name_close with the id in it (Mistral v11's ``[CALL_ID]ID[ARGS]``)."""
        return self.name_close.replace("{call_id}", call_id)

    # --- the canonical text of calls (what the masks let the model write) -------------------------
    def render_calls(self, calls: list[tuple[str, str, str]], content: str = "") -> str:
        """``calls`` = (name, arguments text, id) → the reply text, exactly as the masks produce it.

        ``arguments text`` is written as given for ``json`` (pass canonical JSON); for
        ``xml_parameters`` and ``gemma`` it is parsed and written in that form.
        """
        parts = []
        for name, args, call_id in calls:
            body = self.render_arguments(args)
            written = self.written_id(name, call_id)
            head = self.call_start + self.name_open + name + self.close_text(written)
            parts.append(head + body + self.end_text(written))
        text = self.calls_open + self.call_separator.join(parts) + self.calls_close if parts else ""
        return content + text

    def render_arguments(self, args: str) -> str:
        """A call's arguments (canonical JSON text) as this envelope writes them."""
        if self.arguments == "xml_parameters":
            from server.families.xml_arguments import render_xml_arguments

            return render_xml_arguments(args)
        if self.arguments == "tagged":
            from server.families.tagged_arguments import render_tagged_arguments

            return render_tagged_arguments(args, self.parameter_open, self.parameter_close)
        if self.arguments == "gemma":
            from server.families.gemma_arguments import render_gemma_arguments

            return render_gemma_arguments(args)
        return args


def _from_yaml(path: Path) -> Envelope:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: an envelope file is a mapping of fields")
    known = set(Envelope.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown fields {unknown}; the fields are {sorted(known)}")
    return Envelope(**data)


@cache
def load_envelope(name: str) -> Envelope:
    path = Path(name) if name.endswith(".yaml") else GRAMMARS_DIR / "envelopes" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (GRAMMARS_DIR / "envelopes").glob("*.yaml"))
        raise ValueError(f"unknown tool-call envelope {name!r}: use one of {known} or a path to a .yaml file")
    return _from_yaml(path)
