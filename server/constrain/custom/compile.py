"""``CustomCompiler``: custom tools' grammars over one vocabulary, compiled once per (format, call frame)."""

from __future__ import annotations

import json
import threading
from typing import Any

from server.constrain.arguments.seam import CallFrame
from server.constrain.compile_cache import CompileCache
from server.constrain.custom.grammar import check_format, llg_grammar
from server.constrain.custom.llg_vocab import LlgVocab
from server.constrain.custom.matcher import CustomCompiled
from server.constrain.errors import ConstraintError
from server.constrain.vocab import TokenVocab
from server.tool_keys import INPUT


class CustomCompiler:
    """llguidance's view of the vocabulary (built on first use, ~0.3 s on 49k tokens) and the
    compiled custom tools, cached per (format, frame) in this instance (one per vocabulary:
    ``Compiler`` shares its own among its envelopes)."""

    def __init__(self, vocab: TokenVocab, cache_size: int = 256) -> None:
        self.vocab = vocab
        self._llg: LlgVocab | None = None
        self._lock = threading.Lock()
        # charged the grammar's text and the lazy odd-token scans
        self._compiled = CompileCache(cache_size, size=lambda c: 4 * len(c.grammar) + 65536)

    @property
    def llg(self) -> LlgVocab:
        with self._lock:
            if self._llg is None:
                self._llg = LlgVocab(self.vocab)
            return self._llg

    def compile(self, tool: str, fmt: dict[str, Any], frame: CallFrame) -> CustomCompiled:
        """The pieces for one custom tool in one envelope (the frame the arguments backend gets)."""
        key = (json.dumps(fmt, sort_keys=True), frame)
        found: CustomCompiled = self._compiled.get_or_make(
            key, lambda: self._compile(tool, fmt, frame), f"the grammar of custom tool {tool!r}"
        )
        return found

    def _compile(self, tool: str, fmt: dict[str, Any], frame: CallFrame) -> CustomCompiled:
        if "{call_id}" in frame.suffix:
            raise ConstraintError(
                f"custom tool {tool!r}: this model's envelope has the model write a call id, which custom "
                "tools do not support yet; use a function tool",
                param="tools",
            )
        if frame.style == "tagged":
            raise ConstraintError(
                f"custom tool {tool!r}: this model's envelope (tagged arguments: GLM, MiniMax) does not "
                "support custom tools yet; use a function tool",
                param="tools",
            )
        check_format(fmt, f"tool {tool!r} custom.format")
        if frame.style not in ("json", "xml_parameters"):
            raise ConstraintError(
                f"custom tool {tool!r}: this model's envelope writes {frame.style!r} arguments, which custom "
                "tools do not support yet; use a function tool",
                param="tools",
            )
        if frame.style == "xml_parameters":
            before, close, encoding = frame.prefix + f"<parameter={INPUT}>\n", "", "xml"
        else:
            before, close, encoding = frame.prefix + '{"' + INPUT + '": "', "}", "json"
        ends = (
            tuple(close + frame.suffix + t for t in frame.tails) if frame.tails else (close + frame.suffix,)
        )
        return CustomCompiled(
            self.llg, llg_grammar(fmt), before.encode(), tuple(e.encode() for e in ends), encoding
        )
