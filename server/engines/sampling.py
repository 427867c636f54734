"""Token sampling from one logits row: greedy at temperature 0, else temperature + top-p."""

from __future__ import annotations

import torch


def sample_token(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> int:
    """Pick a token id from a 1-D logits row (already masked with -inf where disallowed)."""
    if temperature <= 0.0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # keep the smallest set whose mass reaches top_p (always at least the top token)
        drop = cumulative - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return int(order[choice].item())
    return int(torch.multinomial(probs, 1, generator=generator).item())
