"""agentserve's tool masks as a vLLM v1 logits processor (the only masking module importing vllm).

Written against vLLM 0.32.0's interface (``vllm/v1/sample/logits_processor/interface.py``).

A request opts in through ``SamplingParams.extra_args`` (stock OpenAI server: the body
field ``vllm_xargs``) with one JSON-safe entry, ``ToolSpec.to_extra_args()``
(``server/constrain/spec.py``; the key is ``EXTRA_ARGS_KEY``)::

    {"agentserve": {"tools": [<OpenAI tool dicts>], "plan": <ToolPlan.to_dict()>,
                    "envelope": "hermes", "backend": "xgrammar", "eos_token_ids": [2]}}

vLLM runs this class inside its engine-core process, so the constraint cannot be passed
as an object: it is built here from that spec by a ``Compiler`` kept for the
processor's lifetime (the tokenizer is loaded once, lazily, from the model's folder).
``envelope``, ``backend`` and ``eos_token_ids`` are optional (defaults: ``DEFAULT_ENVELOPE``,
xgrammar, the model's EOS ids). ``validate_params`` checks the spec with ``ToolSpec.from_json``.

Per step: ``update_state`` follows the persistent batch (removed, then added, then moved
rows); ``apply`` first advances each constrained row's constraint with the output
tokens appended since the last step (the output list is vLLM's live list; async
scheduling may leave a ``-1`` placeholder at its end, which is consumed on a later
step), then fills the bitmask row of each constrained request and masks all of them
with one batched op (``bitmask.MaskApplier``, shared with the hf engine). Nothing raises
inside ``apply``: a rejected token, a constraint that cannot be built, or a row with no
allowed token leaves only EOS allowed for that row, so the request ends, and the error
is logged (with ``extra_args["agentserve"]["request_id"]`` when given).
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from server.constrain.bitmask import MaskApplier, pack_ids
from server.constrain.compiler import Compiler
from server.constrain.spec import EXTRA_ARGS_KEY, ToolSpec
from server.engines.vllm.startup import PROCESSOR_FQCN
from server.families.end_tokens import reply_end_ids

log = logging.getLogger(__name__)


def request_spec(params: SamplingParams | None) -> Any:
    """The agentserve entry of a request's extra_args (a JSON string is decoded), or None."""
    extra = getattr(params, "extra_args", None)
    if not extra:
        return None
    spec = extra.get(EXTRA_ARGS_KEY)
    if isinstance(spec, str):  # stock vLLM's vllm_xargs allows no nested objects: a JSON string then
        try:
            return json.loads(spec)
        except json.JSONDecodeError as exc:
            raise ValueError(f'vllm_xargs["{EXTRA_ARGS_KEY}"] is not valid JSON ({exc})') from None
    return spec


def check_spec(spec: Any) -> None:
    """Raise ValueError (vLLM turns it into HTTP 400) naming the bad field and the fix."""
    ToolSpec.from_json(spec)


class _Row:
    """One constrained request in the batch. Always truthy (vLLM's dict helpers test truthiness)."""

    __slots__ = ("constraint", "output_ids", "consumed", "eos", "error", "tag")

    def __init__(self, constraint: Any, output_ids: list[int], eos: tuple[int, ...], tag: str) -> None:
        self.constraint = constraint
        self.output_ids = output_ids  # vLLM's live list of this request's output tokens
        self.consumed = 0
        self.eos = eos
        self.error: str | None = None
        self.tag = tag

    def __bool__(self) -> bool:
        return True

    def fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
            log.warning("agentserve constraint ended request%s: %s", self.tag, message)

    def advance(self) -> None:
        """Feed the constraint the output tokens appended since the last step."""
        out = self.output_ids
        while self.consumed < len(out):
            tok = out[self.consumed]
            if tok < 0:  # async-scheduling placeholder, filled in before a later step
                return
            self.consumed += 1
            c = self.constraint
            if self.error is not None or c is None or c.is_terminated():
                continue
            try:
                ok = c.accept_token(tok)
            except Exception as exc:  # the protocol says it never raises; be safe in the engine core
                ok, c.error = False, f"{type(exc).__name__}: {exc}"
            if not ok:
                self.fail(c.error or f"token {tok} was rejected by the tool constraint")

    @property
    def ends(self) -> bool:
        """True when only EOS may follow (error, or a constraint that has finished)."""
        return self.error is not None or self.constraint is None or self.constraint.is_terminated()


class AgentserveLogitsProcessor(LogitsProcessor):  # type: ignore[misc]  # vllm is untyped to mypy
    """Tool masks for the requests whose extra_args carry an ``agentserve`` spec; others untouched."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        spec = request_spec(sampling_params)
        if spec is not None:
            check_spec(spec)

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        mc = vllm_config.model_config
        self.device = torch.device(device)
        self.vocab_size = int(mc.get_vocab_size())
        self._model_config = mc
        capacity = int(getattr(vllm_config.scheduler_config, "max_num_seqs", 0) or 256)
        # On a GPU two host bitmasks are used in turn (see server/constrain/bitmask.py).
        self._turns = 1 if self.device.type == "cpu" else 2
        self.masks = MaskApplier(self.vocab_size, capacity=capacity, pin=bool(is_pin_memory))
        self._tokenizer: Any = None
        self._builder: Compiler | None = None
        self._default_eos: tuple[int, ...] | None = None
        self._eos_rows: dict[tuple[int, ...], np.ndarray] = {}
        self.rows: dict[int, _Row] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # masks change the argmax

    # -- batch bookkeeping ----------------------------------------------------------------
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if not batch_update:
            return
        rows = self.rows
        for index in batch_update.removed:
            rows.pop(index, None)
        for index, params, _prompt_ids, output_ids in batch_update.added:
            rows.pop(index, None)  # an added request replaces whatever held the index
            if getattr(params, "extra_args", None) and EXTRA_ARGS_KEY in params.extra_args:
                row = self._new_row(params, output_ids)
                if row is not None:
                    rows[index] = row
        for a, b, direction in batch_update.moved:
            row_a, row_b = rows.pop(a, None), rows.pop(b, None)
            if row_a is not None:
                rows[b] = row_a
            if row_b is not None and direction == MoveDirectionality.SWAP:
                rows[a] = row_b

    def _new_row(self, params: SamplingParams, output_ids: list[int]) -> _Row | None:
        tag = ""
        try:  # validate_params has checked the spec in the front end; still, never raise here
            spec = request_spec(params)
            if spec is None:
                return None
            if not isinstance(spec, dict):
                raise ValueError(f"the spec is not an object: {spec!r:.80}")
            tag = f" {spec['request_id']}" if "request_id" in spec else ""
            eos = self._eos_for(spec)
            constraint = self.build_constraint(spec, eos)
        except Exception as exc:  # never raise in the engine core; end the request instead
            row = _Row(None, output_ids, self._default_eos or self._model_eos(), tag)
            row.fail(f"could not build the tool constraint: {type(exc).__name__}: {exc}")
            return row
        if constraint is None:
            return None
        return _Row(constraint, output_ids, eos, tag)

    # -- constraint construction (override in tests for a hand-made constraint) -----------
    def build_constraint(self, spec: dict[str, Any], eos: tuple[int, ...]) -> Any:
        """The TokenMatcher for one request's spec (None = nothing to enforce)."""
        if self._builder is None:
            self._builder = Compiler(self.tokenizer, self.vocab_size)
        return self._builder.build(replace(ToolSpec.from_json(spec), eos_token_ids=eos))

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            mc = self._model_config
            self._tokenizer = AutoTokenizer.from_pretrained(
                mc.tokenizer,
                revision=getattr(mc, "tokenizer_revision", None),
                trust_remote_code=bool(getattr(mc, "trust_remote_code", False)),
            )
        return self._tokenizer

    def _eos_for(self, spec: dict[str, Any]) -> tuple[int, ...]:
        given = spec.get("eos_token_ids")
        if given:
            return tuple(int(t) for t in given)
        if self._default_eos is None:
            self._default_eos = self._model_eos()
        return self._default_eos

    def _model_eos(self) -> tuple[int, ...]:
        """The model's EOS ids (``families.end_tokens.reply_end_ids``: tokenizer, then config), for a
        spec that carries none; the vllm engine always sends its own (the family's end tokens too)."""
        try:
            tok = self.tokenizer
        except Exception:  # no tokenizer: the model config's EOS alone
            log.exception("agentserve processor: cannot load the tokenizer")
            tok = None
        cfg_eos = getattr(getattr(self._model_config, "hf_config", None), "eos_token_id", None)
        return reply_end_ids(tok, (), cfg_eos)

    # -- the per-step mask ----------------------------------------------------------------
    def _eos_row(self, eos: tuple[int, ...]) -> np.ndarray:
        row = self._eos_rows.get(eos)
        if row is None:
            row = self._eos_rows[eos] = pack_ids(eos, self.vocab_size)
        return row

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        batch = logits.shape[0]
        index = sorted(i for i in self.rows if i < batch)
        if not index:
            return logits
        bitmask = self.masks.buffer(batch, self._turns)  # reused: constraints cache its numpy view
        host = bitmask.numpy()
        for i in index:
            row = self.rows[i]
            row.advance()
            if not row.ends:
                try:
                    row.constraint.fill_next_token_bitmask(bitmask, i)
                except Exception as exc:
                    row.fail(f"filling the mask failed: {type(exc).__name__}: {exc}")
                else:
                    if host[i].any():
                        continue
                    row.fail("the tool constraint allows no token here")
            if row.eos:
                host[i] = self._eos_row(row.eos)
            else:  # no EOS known at all (cannot happen with a real model): leave the row alone
                host[i] = -1
        return self.masks.apply_rows(logits, bitmask[:batch], index)


__all__ = ["AgentserveLogitsProcessor", "EXTRA_ARGS_KEY", "PROCESSOR_FQCN", "check_spec", "request_spec"]
