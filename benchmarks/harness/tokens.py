"""Token counting with the server's own template and tokenizer (exact prompt sizes for budgets)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any


@lru_cache(maxsize=4)
def load_tokenizer(path: str | None = None) -> Any:
    """The tokenizer at ``path``, or the embedded model's (converted once, offline)."""
    from transformers import AutoTokenizer

    if path is None:
        from server.model_store import resolve_model

        path = str(resolve_model("embedded"))
    return AutoTokenizer.from_pretrained(Path(path))


def token_counter(tokenizer: Any):
    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count


def prompt_counter(tokenizer: Any, envelope: str = "hermes"):
    """``(messages, tools) -> tokens`` of the prompt as the server renders it (+ generation header)."""
    from server.families.render import renderer_for
    from server.protocol import ChatMessage

    renderer = renderer_for(envelope)
    count = token_counter(tokenizer)

    def prompt_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
        return count(renderer.render([ChatMessage(**m) for m in messages], tools).text)

    return prompt_tokens


def render_ids(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]], envelope: str = "hermes"
) -> list[int]:
    """Token ids of the prompt as the server renders it (used by the in-process GPU bench)."""
    from server.families.render import renderer_for
    from server.protocol import ChatMessage

    text = renderer_for(envelope).render([ChatMessage(**m) for m in messages], tools).text
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
