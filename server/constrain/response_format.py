"""Structured outputs: ``response_format`` as a mask on the reply's text (JSON following a schema).

``text_schema(kind, json_schema)`` turns the request's ``response_format`` into the JSON
schema the text must follow (``json_object`` → any object; ``json_schema`` → its
``schema``), or None for free text; a bad one is a 400 naming the field.

``JsonTextMatcher`` enforces it while decoding, through the same arguments backend as
the tool calls (the schema is compiled with no envelope text around it):

* no call possible (no tools, ``tool_choice: "none"``, a state that allows none): the
  reply is one JSON value, then end of sequence. Tokens that would complete the
  envelope's call tag (``<tool_call>`` inside a JSON string) stay banned, so the reply
  can never be parsed as a call.
* calls possible (``auto``): the first token decides. It either starts a call (the
  envelope's opening: the call tag, or the trigger token) — from then on the tool
  constraint runs alone, exactly as without ``response_format`` — or starts the JSON.
  Text before a call is not possible then (it would have to be JSON too). Envelopes
  whose calls have no marker (``trigger: start``, Llama 3: a call *is* a JSON object)
  cannot tell a call from JSON text by the first token: that combination is a 400.
* calls required (``required``, a named tool): the reply is calls only; there is no
  text for the schema, and the tool constraint runs alone (the compiler returns it).
* a reasoning family: the model reasons freely first; all of the above applies to the answer
  after the reasoning closes (the compiler wraps this constraint in the reasoning gate).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jsonschema import SchemaError
from jsonschema.validators import validator_for

from server.constrain.arguments.seam import ArgumentsBackend, ArgumentsMatcher, CallFrame
from server.constrain.envelope_masks import EnvelopeMasks
from server.constrain.errors import ConstraintError
from server.constrain.tool_matcher import Phase

ANY_OBJECT: dict[str, Any] = {"type": "object"}
TEXT_TOOL = "response_format"  # the name the backend's compile errors and caches see


def text_schema(kind: str, json_schema: Any) -> dict[str, Any] | None:
    """The schema the reply's text must follow, or None (``text``). ConstraintError for a bad one."""
    if kind == "text":
        return None
    if kind == "json_object":
        return dict(ANY_OBJECT)
    param = "response_format.json_schema"
    if not isinstance(json_schema, dict):
        raise ConstraintError(
            'response_format type "json_schema" needs "json_schema": {"name": ..., "schema": {...}}',
            param=param,
        )
    name = json_schema.get("name")
    if not isinstance(name, str) or not name:
        raise ConstraintError(
            'response_format.json_schema needs a "name" (a string, as OpenAI requires)', param=param + ".name"
        )
    schema = json_schema.get("schema", ANY_OBJECT)
    if not isinstance(schema, dict):
        raise ConstraintError(
            f"response_format.json_schema.schema must be a JSON schema object, got {type(schema).__name__}",
            param=param + ".schema",
        )
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        raise ConstraintError(
            f"response_format.json_schema.schema is not a valid JSON schema at {where}: {exc.message}",
            param=param + ".schema",
        ) from None
    return schema


def compile_text(backend: ArgumentsBackend, schema: dict[str, Any]) -> Any:
    """The schema compiled for the reply's text; a schema the backend cannot enforce is a 400."""
    try:
        return backend.compile(TEXT_TOOL, schema, CallFrame())
    except ConstraintError as exc:
        raise ConstraintError(
            f"response_format.json_schema.schema cannot be enforced by the {backend.name} backend: "
            f"{exc.message}",
            param="response_format.json_schema.schema",
        ) from None


class JsonTextMatcher:
    """A ``TokenMatcher``: the reply is JSON following a schema, or (``inner``) a tool call."""

    def __init__(
        self,
        masks: EnvelopeMasks,
        backend: ArgumentsBackend,
        compiled: Any,
        eos: tuple[int, ...],
        inner: Any = None,
    ) -> None:
        """``inner``: the request's ``ToolMatcher`` when a call may begin the reply, else None."""
        self.masks, self.eos, self.eos_set = masks, eos, frozenset(eos)
        self.matcher: ArgumentsMatcher = backend.matcher(compiled)
        self.inner = inner
        self.q = 0  # the call-tag watch state (text trigger)
        self.at_start = True
        self.done = False
        self._error: str | None = None
        self.call_row: np.ndarray | None = None
        if inner is not None:
            if masks.trigger == "start":
                raise ConstraintError(
                    f"response_format with tools that may be called ({masks.envelope.name} envelope: a call "
                    f"is itself a JSON object, so JSON text and a call cannot be told apart): send "
                    f'tool_choice "required" or "none", or leave response_format out',
                    param="response_format",
                )
            if masks.trigger_id is not None:  # trigger "token"
                self.call_row = masks.vocab.pack([masks.trigger_id])
            else:
                trie = inner.first_trie
                self.call_row = trie.mask_row(masks.first_node(trie), inner.subset)
        self.delegate = False  # True once the reply began a call: the tool constraint alone from there

    # --- TokenMatcher ---------------------------------------------------------------------------
    @property
    def budget(self) -> int | None:
        """The call's token budget (a reasoning gate lowers it by what the reasoning wrote)."""
        return getattr(self.inner, "budget", None)

    @budget.setter
    def budget(self, value: int | None) -> None:
        if self.inner is not None:
            self.inner.budget = value

    @property
    def error(self) -> str | None:
        return self.inner.error if self.delegate else self._error

    @error.setter
    def error(self, value: str | None) -> None:
        self._error = value

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None:
        if self.delegate:
            self.inner.fill_next_token_bitmask(bitmask, index)
            return
        m = self.masks
        if self.done or self._error is not None:
            _put(bitmask, index, m.eos_row(self.eos))
            return
        self.matcher.fill(bitmask, index)
        keep = m.text_row(self.q, None, 0, ())  # text tokens that cannot complete a call tag
        extra = []
        if self.matcher.is_terminated():  # the JSON may end here
            extra.append(m.eos_row(self.eos))
        if self.at_start and self.call_row is not None:
            extra.append(self.call_row)
        _combine(bitmask, index, keep, extra)

    def accept_token(self, token_id: int) -> bool:
        tid = int(token_id)
        if self.delegate:
            return bool(self.inner.accept_token(tid))
        if self.done or self._error is not None:
            return self._reject(f"token {self._what(tid)} came after the end of the reply")
        start, self.at_start = self.at_start, False
        if start and self.call_row is not None and _bit(self.call_row, tid):
            return self._begin_call(tid)
        if tid in self.eos_set:
            if not self.matcher.is_terminated():
                return self._reject("end of sequence before the JSON reply (response_format) is complete")
            self.done = True
            return True
        vocab = self.masks.vocab
        text = vocab.token_bytes[tid] if 0 <= tid < vocab.vocab_size else b""
        if not text or not self.matcher.accept_token(tid):
            return self._reject(
                f"token {self._what(tid)} does not continue the JSON reply (response_format schema)"
            )
        if self.masks.watch is not None:
            self.q, off = self.masks.watch.step(self.q, tid)
            if off >= 0:
                return self._reject(f"token {self._what(tid)} would open a tool call inside the JSON reply")
        return True

    def is_terminated(self) -> bool:
        if self.delegate:
            return bool(self.inner.is_terminated())
        return self.done or self._error is not None

    # --- internals ---------------------------------------------------------------------------------
    def _begin_call(self, tid: int) -> bool:

        inner, m = self.inner, self.masks
        self.delegate = True
        if m.trigger == "text":  # the reply starts at the call tag: walk the first call's trie from there
            inner.phase, inner.node, inner.at_start = Phase.CALL, m.first_node(inner.first_trie), False
        return bool(inner.accept_token(tid))

    def _what(self, tid: int) -> str:
        vocab = self.masks.vocab
        return vocab.describe(tid) if 0 <= tid < vocab.vocab_size else f"<out of range id {tid}>"

    def _reject(self, message: str) -> bool:
        self._error = message
        return False


def _bit(row: np.ndarray, tid: int) -> bool:
    return 0 <= tid < row.size * 32 and bool((int(row[tid >> 5]) >> (tid & 31)) & 1)


def _numpy(bitmask: Any) -> Any:
    if isinstance(bitmask, np.ndarray):
        return bitmask
    return bitmask.numpy() if bitmask.device.type == "cpu" else None


def _put(bitmask: Any, index: int, row: np.ndarray) -> None:
    arr = _numpy(bitmask)
    if arr is not None:
        arr[index] = row
    else:
        import torch

        bitmask[index].copy_(torch.from_numpy(row))


def _combine(bitmask: Any, index: int, keep: np.ndarray, extra: list[np.ndarray]) -> None:
    """Row ``index`` := (row & keep) | each of ``extra`` (in place, CPU or device bitmask)."""
    arr = _numpy(bitmask)
    if arr is None:  # a device bitmask: compute on the host, one copy back
        row = bitmask[index].cpu().numpy()
    else:
        row = arr[index]
    out = row & keep
    for e in extra:
        out |= e
    _put(bitmask, index, out)


def json_text_matcher(
    masks: EnvelopeMasks,
    backend: ArgumentsBackend,
    schema: dict[str, Any],
    eos: tuple[int, ...],
    tools_constraint: Any = None,
) -> Any:
    """The request's constraint when its text must follow ``schema`` (see the module docstring)."""

    compiled = compile_text(backend, schema)
    inner = tools_constraint
    if inner is not None and inner.phase != Phase.TEXT:
        return inner  # calls only (required / named): no text to constrain
    calls_possible = inner is not None and inner.first_trie is not None
    return JsonTextMatcher(masks, backend, compiled, eos, inner if calls_possible else None)
