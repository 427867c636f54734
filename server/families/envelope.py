"""The tool-call envelope of a model family, loaded from grammars/envelopes/NAME.yaml."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

GRAMMARS_DIR = Path(__file__).resolve().parents[2] / "grammars"


@dataclass(frozen=True)
class Envelope:
    name: str
    call_start: str  # "<tool_call>\n"
    name_open: str  # '{"name": "'
    name_close: str  # '", "arguments": '
    call_end: str  # "}\n</tool_call>"
    call_separator: str
    tool_response_open: str
    tool_response_close: str
    tools_preamble: str
    tools_postamble: str

    @property
    def call_tag(self) -> str:
        """The text that opens a call, without trailing whitespace ("<tool_call>")."""
        return self.call_start.strip()

    @property
    def call_close_tag(self) -> str:
        """The text that closes a call ("</tool_call>")."""
        return self.call_end.lstrip("}").strip()


@cache
def load_envelope(name: str) -> Envelope:
    path = Path(name) if name.endswith(".yaml") else GRAMMARS_DIR / "envelopes" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (GRAMMARS_DIR / "envelopes").glob("*.yaml"))
        raise ValueError(f"unknown tool-call envelope {name!r}: use one of {known} or a path to a .yaml file")
    data = yaml.safe_load(path.read_text())
    return Envelope(**data)
