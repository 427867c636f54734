"""A scripted engine for contract tests: it subclasses ``Engine`` like the real ones do."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from server.config import Settings, load_settings
from server.engines.base import Engine, EngineStats, GenerationChunk, GenerationRequest, SamplingParams
from server.errors import InvalidRequest
from server.families.model_facts import decide


class ScriptedEngine(Engine):
    """Replies with ``reply`` (text, tokenized once); records what chat told it."""

    name = "scripted"

    def __init__(
        self,
        tokenizer: Any,
        reply: str = "hello",
        tiers: tuple[str, ...] = (),
        settings: Settings | None = None,
        shipped: bool = False,
    ) -> None:
        """``settings`` decide the family (default: the tests' worker settings: the embedded model's);
        ``shipped``: the tokenizer is ``settings.model``'s own, so its shipped request defaults apply."""
        self.facts = decide(settings or load_settings(device="cpu"), tokenizer, None, shipped=shipped)
        self.tokenizer = tokenizer
        self.max_model_len = 2048
        self.vocab_size = len(tokenizer)
        self.eos_token_ids = self.facts.end_ids
        self.block_size = 16
        self.reply_ids = list(tokenizer(reply, add_special_tokens=False)["input_ids"])
        self.tiers = tiers
        self.finished: list[tuple[str, tuple[str, ...]]] = []
        self.arrived: list[str] = []
        self.checked: list[SamplingParams] = []
        self.requests: list[GenerationRequest] = []

    async def start(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.requests.append(request)
        yield GenerationChunk(list(self.reply_ids), 0, "stop")

    def stats(self) -> EngineStats:
        return EngineStats()

    @property
    def cache_tiers(self) -> tuple[str, ...]:
        return self.tiers

    def check_sampling(self, params: SamplingParams) -> None:
        self.checked.append(params)
        if params.seed == 13:
            raise InvalidRequest("seed 13 is refused by this engine", param="seed")

    def request_arrived(self, session_key: str) -> None:
        self.arrived.append(session_key)

    def reply_finished(self, session_key: str, tool_names: Sequence[str] = ()) -> None:
        self.finished.append((session_key, tuple(tool_names)))
