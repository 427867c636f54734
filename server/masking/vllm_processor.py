"""agentserve's tool masks as a vLLM v1 logits processor (the only masking module importing vllm).

Written against vLLM 0.32.0's interface (``vllm/v1/sample/logits_processor/interface.py``).

A request opts in through ``SamplingParams.extra_args`` (stock OpenAI server: the body
field ``vllm_xargs``) with one JSON-safe entry, built by ``ToolConstraint.to_extra_args()``::

    {"agentserve": {"tools": [<OpenAI tool dicts>], "plan": <ToolPlan.to_dict()>,
                    "envelope": "hermes", "backend": "xgrammar", "eos_token_ids": [2]}}

vLLM runs this class inside its engine-core process, so the constraint cannot be passed
as an object: it is rebuilt here from that spec with a ``ConstraintFactory`` cached per
(envelope, backend) for the processor's lifetime (the tokenizer is loaded once, lazily,
from the model's folder). ``envelope``, ``backend`` and ``eos_token_ids`` are optional
(defaults: hermes, xgrammar, the model's EOS ids).

Per step: ``update_state`` follows the persistent batch (removed, then added, then moved
rows); ``apply`` first advances each constrained row's constraint with the output
tokens appended since the last step (the output list is vLLM's live list; async
scheduling may leave a ``-1`` placeholder at its end, which is consumed on a later
step), then fills one packed int32 bitmask row per constrained request and masks all
of them with a single batched op. Nothing raises inside ``apply``: a rejected token, a
constraint that cannot be built, or a row with no allowed token leaves only EOS
allowed for that row, so the request ends, and the error is logged (with
``extra_args["agentserve"]["request_id"]`` when given).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

log = logging.getLogger(__name__)

EXTRA_ARGS_KEY = "agentserve"
FQCN = "server.masking.vllm_processor:AgentserveLogitsProcessor"
_BACKENDS = ("xgrammar", "outlines")


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
    where = f'vllm_xargs["{EXTRA_ARGS_KEY}"]'
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be an object with 'tools' and 'plan', got {type(spec).__name__}")
    unknown = set(spec) - {"tools", "plan", "envelope", "backend", "eos_token_ids", "request_id"}
    if unknown:
        raise ValueError(f"{where} has unknown keys {sorted(unknown)}: allowed are tools, plan, envelope, "
                         f"backend, eos_token_ids, request_id")
    tools = spec.get("tools")
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError(f"{where}.tools must be a list of OpenAI tool objects "
                         f'({{"type": "function", "function": {{"name": ..., "parameters": ...}}}})')
    if not isinstance(spec.get("plan"), dict):
        raise ValueError(f"{where}.plan must be an object (ToolPlan.to_dict()), got {spec.get('plan')!r}")
    backend = spec.get("backend", "xgrammar")
    if backend not in _BACKENDS:
        raise ValueError(f"{where}.backend {backend!r} is not known: use one of {list(_BACKENDS)}")
    eos = spec.get("eos_token_ids")
    if eos is not None and (not isinstance(eos, list) or not all(isinstance(t, int) and t >= 0 for t in eos)):
        raise ValueError(f"{where}.eos_token_ids must be a list of token ids, got {eos!r}")
    from server.families.envelope import load_envelope
    from server.masking.tool_choice import ToolPlan

    load_envelope(spec.get("envelope", "hermes"))  # ValueError names the known envelopes
    try:
        plan = ToolPlan.from_dict(spec["plan"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}.plan is not a valid ToolPlan ({exc}): send ToolPlan.to_dict()") from None
    names = {t.get("function", {}).get("name") for t in tools}
    missing = sorted(set(plan.allowed) - names)
    if missing:
        raise ValueError(f"{where}.plan allows tools {missing} that are not in {where}.tools: add them")


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


class AgentserveLogitsProcessor(LogitsProcessor):
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
        self.words = (self.vocab_size + 31) // 32
        self._model_config = mc
        self._pin = bool(is_pin_memory)
        capacity = int(getattr(vllm_config.scheduler_config, "max_num_seqs", 0) or 256)
        # Host bitmasks. On a GPU two, used in turn: a step's host-to-device copy may still be
        # queued behind the forward pass while the CPU fills the next step's mask.
        self._buffers = [self._alloc(capacity) for _ in range(1 if self.device.type == "cpu" else 2)]
        self._turn = 0
        self._bits = torch.arange(32, dtype=torch.int32, device=self.device)
        self._tokenizer: Any = None
        self._default_eos: tuple[int, ...] | None = None
        self._factories: dict[tuple[str, str], Any] = {}
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
        """The TokenConstraint for one request's spec (None = nothing to enforce)."""
        from server.masking.tool_choice import ToolPlan

        factory = self._factory(spec.get("envelope", "hermes"), spec.get("backend", "xgrammar"))
        return factory.build(spec.get("tools") or [], ToolPlan.from_dict(spec["plan"]), eos)

    def _factory(self, envelope: str, backend: str) -> Any:
        key = (envelope, backend)
        factory = self._factories.get(key)
        if factory is None:
            from server.families.envelope import load_envelope
            from server.masking.constraint import ConstraintFactory

            env = load_envelope(envelope)
            factory = ConstraintFactory(self.tokenizer, self.vocab_size, env, backend=backend)
            self._factories[key] = factory
        return factory

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
        """The EOS ids the engine uses: the tokenizer's, ChatML's end tokens, the model config's."""
        ids: list[int] = []
        try:
            tok = self.tokenizer
        except Exception:  # no tokenizer: the model config's EOS alone
            log.exception("agentserve processor: cannot load the tokenizer")
            tok = None
        for name in (tok.eos_token, "<|im_end|>", "<|endoftext|>") if tok is not None else ():
            tid = tok.convert_tokens_to_ids(name) if name else None
            if isinstance(tid, int) and tid != tok.unk_token_id and tid not in ids:
                ids.append(tid)
        cfg_eos = getattr(getattr(self._model_config, "hf_config", None), "eos_token_id", None)
        for tid in cfg_eos if isinstance(cfg_eos, list) else [cfg_eos]:
            if isinstance(tid, int) and tid not in ids:
                ids.append(tid)
        return tuple(ids)

    # -- the per-step mask ----------------------------------------------------------------
    def _alloc(self, capacity: int) -> torch.Tensor:
        return torch.zeros((capacity, self.words), dtype=torch.int32, pin_memory=self._pin)

    def _eos_row(self, eos: tuple[int, ...]) -> np.ndarray:
        row = self._eos_rows.get(eos)
        if row is None:
            bits = np.zeros(self.words * 32, dtype=bool)
            bits[[t for t in eos if 0 <= t < self.vocab_size]] = True
            row = np.packbits(bits, bitorder="little").view("<u4").view(np.int32).copy()
            self._eos_rows[eos] = row
        return row

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        batch, vocab = logits.shape
        index = sorted(i for i in self.rows if i < batch)
        if not index:
            return logits
        n = len(index)
        self._turn = (self._turn + 1) % len(self._buffers)
        if n > self._buffers[self._turn].shape[0]:
            self._buffers[self._turn] = self._alloc(max(n, 2 * self._buffers[self._turn].shape[0]))
        bitmask = self._buffers[self._turn]  # reused: constraints may cache its numpy view
        host = bitmask.numpy()
        for k, i in enumerate(index):
            row = self.rows[i]
            row.advance()
            if not row.ends:
                try:
                    row.constraint.fill_next_token_bitmask(bitmask, k)
                except Exception as exc:
                    row.fail(f"filling the mask failed: {type(exc).__name__}: {exc}")
                else:
                    if host[k].any():
                        continue
                    row.fail("the tool constraint allows no token here")
            if row.eos:
                host[k] = self._eos_row(row.eos)
            else:  # no EOS known at all (cannot happen with a real model): leave the row alone
                host[k] = -1
        allowed = self._unpack(bitmask[:n], vocab)
        rows = torch.tensor(index, dtype=torch.long).to(self.device, non_blocking=True)
        logits[rows] = logits[rows].masked_fill_(~allowed, float("-inf"))
        return logits

    def _unpack(self, bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
        """int32 [n, words] (host) -> bool [n, vocab] on the logits' device: one vectorised op."""
        dev = bitmask.to(self.device, non_blocking=True)
        allowed = ((dev.unsqueeze(-1) >> self._bits) & 1).bool().reshape(dev.shape[0], -1)
        if allowed.shape[1] >= vocab:
            return allowed[:, :vocab]
        pad = torch.zeros((dev.shape[0], vocab - allowed.shape[1]), dtype=torch.bool, device=self.device)
        return torch.cat([allowed, pad], dim=1)


__all__ = ["AgentserveLogitsProcessor", "EXTRA_ARGS_KEY", "FQCN", "check_spec", "request_spec"]
