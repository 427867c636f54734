"""Hand-made pieces for the vLLM processor tests: a tiny allow-list constraint and a fake config."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from server.engines.vllm.logits_processor import AgentserveLogitsProcessor

EOS = 0


def pack(ids: set[int] | list[int], vocab: int) -> np.ndarray:
    bits = np.zeros(((vocab + 31) // 32) * 32, dtype=bool)
    bits[list(ids)] = True
    return np.packbits(bits, bitorder="little").view("<u4").view(np.int32)


class AllowList:
    """TokenMatcher: only ``allow`` (plus EOS) each step; terminated after ``length`` tokens."""

    def __init__(self, allow: list[int], vocab: int, length: int = 1_000_000) -> None:
        self.allow, self.vocab, self.length = set(allow), vocab, length
        self.error: str | None = None
        self.seen: list[int] = []

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None:
        bitmask[index] = torch.from_numpy(pack(self.allow | {EOS}, self.vocab))

    def accept_token(self, token_id: int) -> bool:
        if token_id not in self.allow:
            self.error = f"token {token_id} not in {sorted(self.allow)}"
            return False
        self.seen.append(token_id)
        return True

    def is_terminated(self) -> bool:
        return len(self.seen) >= self.length


class AllowListProcessor(AgentserveLogitsProcessor):
    """The real processor with a hand-made constraint: spec {"allow": [...], "length": n}."""

    built: list[AllowList] = []

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        spec = (sampling_params.extra_args or {}).get("agentserve")
        if spec is not None and not isinstance(spec.get("allow"), list):
            raise ValueError("agentserve.allow must be a list of token ids")

    def build_constraint(self, spec: dict[str, Any], eos: tuple[int, ...]) -> Any:
        if spec.get("explode"):
            raise RuntimeError("cannot build")
        if spec.get("none"):
            return None
        c = AllowList(spec["allow"], self.vocab_size, spec.get("length", 1_000_000))
        self.built.append(c)
        return c


def fake_vllm_config(vocab: int, max_num_seqs: int = 4, tokenizer: str = "unused") -> Any:
    model_config = SimpleNamespace(get_vocab_size=lambda: vocab, tokenizer=tokenizer, hf_config=None)
    scheduler_config = SimpleNamespace(max_num_seqs=max_num_seqs)
    return SimpleNamespace(model_config=model_config, scheduler_config=scheduler_config)


def allowed_sets(logits: torch.Tensor) -> list[set[int] | None]:
    """Per row: the finite token ids, or None when the row was left untouched (all finite)."""
    out: list[set[int] | None] = []
    for row in logits:
        finite = torch.isfinite(row)
        out.append(None if bool(finite.all()) else set(torch.nonzero(finite).flatten().tolist()))
    return out
