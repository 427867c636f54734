"""Token sampling (the hf and llamacpp engines): logit_bias, penalties, the tool mask, then the sampler.

One ``TokenSampler`` per request holds what its processing needs across steps, built once
at admission and updated in place per token (no per-step rebuilds): the logit_bias as an
(index, value) pair of tensors, the counts of generated tokens (frequency / presence
penalties), and the set of prompt + generated tokens (repetition penalty). Every operation
works on a ``[B, V]`` logits tensor (B rows, one per request), vectorized over the vocabulary.

Order, as vLLM applies it (checked against vLLM 0.32's ``Sampler``): raw logits →
logprobs (the model's log-softmax, vLLM's default ``raw_logprobs``) → logit_bias →
penalties (repetition, frequency, presence) → the tool mask (``pick``, last: -inf
stays -inf, so no bias or penalty can re-allow a masked token) → greedy argmax at
temperature 0, else temperature → min_p → top_k → top_p → a draw from the request's
seeded generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from server.constrain.bitmask import MaskApplier
from server.constrain.interface import TokenMatcher
from server.engines.base import SamplingParams, TokenLogprob


class TokenSampler:
    """The sampling state of one request (``params``) over a vocabulary of ``vocab_size`` rows."""

    def __init__(
        self,
        params: SamplingParams,
        prompt_ids: Sequence[int],
        vocab_size: int,
        device: torch.device,
        generator: torch.Generator | None = None,
    ) -> None:
        self.params = params
        self.generator = generator
        self._bias: tuple[torch.Tensor, torch.Tensor] | None = None
        if params.logit_bias:
            ids = torch.tensor([i for i, _ in params.logit_bias], dtype=torch.long, device=device)
            values = torch.tensor([b for _, b in params.logit_bias], dtype=torch.float32, device=device)
            self._bias = (ids, values)
        self._counts: torch.Tensor | None = None  # float32[V]: times each token was generated
        if params.frequency_penalty or params.presence_penalty:
            self._counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)
        self._seen: torch.Tensor | None = None  # bool[V]: in the prompt or generated
        if params.repetition_penalty != 1.0:
            self._seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            if prompt_ids:
                ids = torch.tensor(list(prompt_ids), dtype=torch.long, device=device)
                self._seen[ids[(ids >= 0) & (ids < vocab_size)]] = True

    @property
    def processes(self) -> bool:
        """Whether ``process`` changes logits (else it can be skipped)."""
        return self._bias is not None or self._counts is not None or self._seen is not None

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """logit_bias then penalties, in place on a float32 ``[1, V]`` (or ``[V]``) tensor; returns it."""
        p = self.params
        if self._bias is not None:
            ids, values = self._bias
            logits[..., ids] += values
        if self._seen is not None:
            rp = p.repetition_penalty  # elementwise over the row: no boolean indexing (no device sync)
            penalized = torch.where(logits > 0, logits / rp, logits * rp)
            logits.copy_(torch.where(self._seen, penalized, logits))
        if self._counts is not None:
            if p.frequency_penalty:
                logits -= p.frequency_penalty * self._counts
            if p.presence_penalty:
                logits -= p.presence_penalty * (self._counts > 0).to(logits.dtype)
        return logits

    def observe(self, token: int) -> None:
        """A token was generated: count it for the penalties."""
        if self._counts is not None:
            self._counts[token] += 1.0
        if self._seen is not None:
            self._seen[token] = True

    def sample(self, logits: torch.Tensor) -> int:
        """A token id from a processed (and masked) 1-D logits row."""
        return int(sample_rows(logits.unsqueeze(0), [self.params], [self.generator])[0])

    def logprob(self, raw_logits: torch.Tensor, token: int) -> TokenLogprob | None:
        """The chosen token's logprob under the model's raw distribution, and the top ones asked for."""
        n = self.params.logprobs
        if n is None:
            return None
        return token_logprobs(raw_logits.unsqueeze(0), [token], n)[0]


def token_logprobs(raw_logits: torch.Tensor, tokens: Sequence[int], top_n: int) -> list[TokenLogprob]:
    """Per row of ``[B, V]`` raw logits: log_softmax at the row's token, and the ``top_n`` best."""
    lp = torch.log_softmax(raw_logits.float(), dim=-1)
    chosen = lp.gather(1, torch.tensor(list(tokens), device=lp.device).unsqueeze(1))[:, 0].tolist()
    tops: list[list[tuple[int, float]]] = [[] for _ in tokens]
    if top_n > 0:
        values, ids = torch.topk(lp, min(top_n, lp.shape[-1]), dim=-1)
        tops = [list(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    return [
        TokenLogprob(int(t), float(c), tuple(top)) for t, c, top in zip(tokens, chosen, tops, strict=True)
    ]


def sample_rows(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]
) -> list[int]:
    """One token per row of processed ``[B, V]`` logits: argmax at temperature 0, else a filtered draw."""
    out: list[int] = []
    for row, p, gen in zip(logits, params, generators, strict=True):
        if p.temperature <= 0.0:
            out.append(int(torch.argmax(row).item()))
            continue
        probs, ids = candidates(torch.softmax(row.float() / p.temperature, dim=-1), p.top_k, p.top_p, p.min_p)
        choice = int(torch.multinomial(probs, 1, generator=gen).item())
        out.append(choice if ids is None else int(ids[choice].item()))
    return out


def candidates(
    probs: torch.Tensor, top_k: int, top_p: float, min_p: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """min_p, then top_k, then top_p on a probability row: (candidate probs, their ids or None = all).

    With top_k or top_p the candidates are the most likely tokens in order (top_k: a
    ``topk`` of k, no full sort); the probabilities are left unnormalized (multinomial rescales).
    """
    if min_p > 0.0:
        probs = probs.masked_fill(probs < min_p * probs.max(), 0.0)
    ids: torch.Tensor | None = None
    if 0 < top_k < probs.shape[-1]:
        probs, ids = torch.topk(probs, top_k)
    if top_p < 1.0:
        if ids is None:
            probs, ids = torch.sort(probs, descending=True)
        mass = probs / probs.sum()
        # keep the smallest set whose mass reaches top_p (always at least the top token)
        probs = probs.masked_fill(torch.cumsum(mass, dim=-1) - mass >= top_p, 0.0)
    return probs, ids


@dataclass(frozen=True)
class Pick:
    """One decode step's outcome for one request (``pick``): go on with ``token``, or finish."""

    sampled: bool  # a token was drawn (counted as generated, even when it then ends the reply)
    token: int | None = None  # the token to emit (with ``finish``: sent in the final chunk)
    finish: str | None = None  # None: goes on; "stop" | "length" | "error"
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None

    @property
    def tokens(self) -> list[int]:
        return [] if self.token is None else [self.token]


def pick(
    raw: torch.Tensor,
    sampler: TokenSampler,
    constraint: TokenMatcher | None,
    masks: MaskApplier,
    stop_ids: frozenset[int],
    generated: list[int],
    prompt_len: int,
    max_model_len: int,
) -> Pick:
    """Bias, penalties, the mask, then sample one token from ``raw`` (``[V]``) and decide: the
    constraint accepts it, a stop id ends the reply (not sent), the constraint's end, ``max_tokens``
    or the window end it (sent), else it goes on. Appends a kept token to ``generated`` and tells
    the sampler (penalties). The hf engine's runner and the llamacpp scheduler both decide so."""
    logits = raw
    if sampler.processes or constraint is not None:
        logits = raw.float().unsqueeze(0).clone()  # [1, V]: bias, penalties, then the mask
        sampler.process(logits)
        if constraint is not None:
            logits = masks.apply(logits, [constraint])
            if not torch.isfinite(logits).any():
                return Pick(
                    False, finish="error", error="the tool-call constraint allows no token at this point"
                )
        logits = logits[0]
    token = sampler.sample(logits)
    if constraint is not None and not constraint.accept_token(token):
        return Pick(
            True, finish="error", error=constraint.error or f"token {token} rejected by the constraint"
        )
    if token in stop_ids:
        return Pick(True, finish="stop")
    sampler.observe(token)
    generated.append(token)
    lp = sampler.logprob(raw, token)
    logprobs = [lp] if lp is not None else None
    if constraint is not None and constraint.is_terminated():
        return Pick(True, token, "stop", logprobs=logprobs)
    if len(generated) >= sampler.params.max_tokens or prompt_len + len(generated) >= max_model_len:
        return Pick(True, token, "length", logprobs=logprobs)
    return Pick(True, token, logprobs=logprobs)
