"""A request's sampling fields → the engine's ``SamplingParams``; the parameter 400s.

Every OpenAI chat parameter either works or is a 400 that names it (docs/parameters.md):
``logit_bias`` keys must be token ids of this model's vocabulary and values in
[-100, 100] (a request that sends none gets the model's default,
``ModelFacts.default_logit_bias``); fields that would change the output but are not implemented
(``protocol.UNSUPPORTED_NEUTRAL``) are refused; other unknown top-level fields are
accepted and logged once per field name (not per request).
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

from server.engines.base import Engine, SamplingParams
from server.errors import InvalidRequest
from server.log_budget import REQUEST_LOG
from server.protocol import SamplingFields

log = logging.getLogger(__name__)

BIAS_LIMIT = 100.0  # OpenAI's range for logit_bias values
_logged: set[str] = set()
_logged_lock = threading.Lock()
MAX_LOGGED_FIELDS = 256  # distinct unknown field names remembered (then: one summary line, no more)
MAX_FIELD_NAME_LOGGED = 64  # characters of a field name written to the log


def check_fields(req: SamplingFields) -> None:
    """400 for a refused field sent with a non-neutral value; log unknown fields once each."""
    bad = req.unsupported_fields()
    if bad:
        raise InvalidRequest(
            f"{bad[0]} is not supported by this server (it would change the output, so it is not "
            f"ignored): leave it out or send its neutral value",
            param=bad[0],
        )
    unknown = req.unknown_fields()
    if unknown:
        with _logged_lock:
            full = len(_logged) >= MAX_LOGGED_FIELDS
            new = [] if full else [k for k in unknown if k not in _logged][: MAX_LOGGED_FIELDS - len(_logged)]
            _logged.update(new)
            if len(_logged) >= MAX_LOGGED_FIELDS and not full:
                log.warning("%d unknown request field names logged: no more are logged", MAX_LOGGED_FIELDS)
        for name in new:
            REQUEST_LOG.log(
                log,
                logging.WARNING,
                "request field %r is not used by this server and has no effect (accepted; logged once)",
                name[:MAX_FIELD_NAME_LOGGED],
            )


def parse_logit_bias(value: dict[str, Any] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """``{"token id": bias}`` → sorted (id, bias) pairs; a 400 naming logit_bias for a bad entry."""
    if not value:
        return ()
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            tid = int(key)
        except (TypeError, ValueError):
            tid = -1
        if str(tid) != str(key).strip() or not 0 <= tid < vocab_size:
            raise InvalidRequest(
                f"logit_bias key {key!r} is not a token id of this model (integers in [0, {vocab_size})): "
                f"map token ids (POST /tokenize shows them) to biases",
                param="logit_bias",
            )
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not math.isfinite(bias):
            raise InvalidRequest(
                f"logit_bias[{key!r}] = {bias!r} is not a number in [-100, 100]", param="logit_bias"
            )
        if not -BIAS_LIMIT <= bias <= BIAS_LIMIT:
            raise InvalidRequest(
                f"logit_bias[{key!r}] = {bias} is out of range: biases are in [-100, 100]", param="logit_bias"
            )
        out[tid] = float(bias)
    return tuple(sorted(out.items()))


def sampling_params(req: SamplingFields, max_tokens: int, engine: Engine) -> SamplingParams:
    """The engine's SamplingParams for a checked request (``max_tokens`` already budgeted).

    The engine refuses what it cannot honour (``Engine.check_sampling``: InvalidRequest).
    """
    vocab_size = engine.vocab_size
    stop_ids = tuple(req.stop_token_ids or ())
    bad = [t for t in stop_ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequest(
            f"stop_token_ids must be token ids in [0, {vocab_size}); got {bad[:5]}", param="stop_token_ids"
        )
    top_k = req.top_k or 0
    # a request's own logit_bias ({} included) replaces the default (families/model_facts.py)
    sent = req.logit_bias is not None
    bias = parse_logit_bias(req.logit_bias, vocab_size) if sent else engine.facts.default_logit_bias
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        stop_token_ids=stop_ids,
        frequency_penalty=req.frequency_penalty or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        logit_bias=bias,
        top_k=top_k if top_k > 0 else 0,
        min_p=req.min_p or 0.0,
        logprobs=req.top_logprobs_asked(),
    )
    engine.check_sampling(params)
    return params
