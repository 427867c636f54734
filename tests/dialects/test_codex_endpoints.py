"""Codex's model catalog (``GET /v1/codex/models``), ``POST /v1/responses/compact`` and the reply budget
of a Responses request with no ``max_output_tokens``, on a scripted engine (no model runs)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import build_app
from server.dialects.responses.catalog import catalog, model_info
from server.dialects.responses.compact import MARK, SUMMARY_HEADER, SUMMARY_REQUEST
from tests.conftest import worker_settings
from tests.engines.fake import ScriptedEngine

SUMMARY = "The user wants a.py fixed; it was read; nothing is left."
# what Codex 0.171.0 refuses the whole catalog without (each removed alone: "failed to decode models
# response", then "Model metadata for `NAME` not found"), checked against the binary
CODEX_0_171_REQUIRED = (
    "slug",
    "display_name",
    "base_instructions",
    "supported_reasoning_levels",
    "shell_type",
    "visibility",
    "supported_in_api",
    "priority",
    "support_verbosity",
    "truncation_policy",
    "experimental_supported_tools",
)


@pytest.fixture()
def app_and_engine(tokenizer):
    settings = worker_settings().model_copy(update={"served_model_aliases": ["alias-a"]})
    engine = ScriptedEngine(tokenizer, reply=SUMMARY)
    engine.max_model_len = 4096
    with TestClient(build_app(settings, engine=engine)) as client:
        yield client, engine


def test_the_catalog_tells_codex_the_window_apply_patch_and_every_served_name(app_and_engine):
    client, _ = app_and_engine
    r = client.get("/v1/codex/models", params={"client_version": "0.171.0"})
    assert r.status_code == 200
    models = r.json()["models"]
    name = worker_settings().served_model_name
    assert [m["slug"] for m in models] == [name, "alias-a"]
    entry = models[0]
    assert all(key in entry for key in CODEX_0_171_REQUIRED), set(CODEX_0_171_REQUIRED) - set(entry)
    assert entry["context_window"] == 4096  # the served window, not a default
    assert entry["auto_compact_token_limit"] == 3686  # 90 %: room for a reply before the window is full
    assert entry["apply_patch_tool_type"] == "freeform"  # Codex then sends its Lark apply_patch tool
    assert entry["supports_parallel_tool_calls"] is True
    assert entry["truncation_policy"] == {"mode": "tokens", "limit": 512}  # an eighth of the window
    assert entry["supported_reasoning_levels"] == []  # SmolLM2 does not reason
    assert client.get("/v1/models").json()["object"] == "list"  # OpenAI's list is unchanged


def test_a_reasoning_family_offers_its_efforts_in_codex_order():
    entry = model_info("qwen3", 32768, {"high": 8192, "low": 512, "medium": 2048, "bogus": 1})
    assert [lv["effort"] for lv in entry["supported_reasoning_levels"]] == ["low", "medium", "high"]
    assert entry["default_reasoning_level"] == "medium"
    assert entry["supports_reasoning_summaries"] is True
    assert entry["truncation_policy"]["limit"] == 4096
    assert model_info("big", 1_000_000, None)["truncation_policy"]["limit"] == 10_000


def test_catalog_slugs_are_unique_and_non_empty():
    assert [m["slug"] for m in catalog(["a", "a", "", "b"], 8192, None)["models"]] == ["a", "b"]


def _responses(client: TestClient, **body: Any) -> dict[str, Any]:
    r = client.post("/v1/responses", json={"model": worker_settings().served_model_name, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_responses_request_without_max_output_tokens_gets_the_rest_of_the_window(app_and_engine):
    client, engine = app_and_engine
    _responses(client, input="hi", store=False)
    granted = engine.requests[-1].sampling.max_tokens
    prompt = len(engine.requests[-1].prompt_ids)
    assert granted == 4096 - prompt > worker_settings().default_max_tokens
    _responses(client, input="hi", store=False, max_output_tokens=7)
    assert engine.requests[-1].sampling.max_tokens == 7
    chat = {"model": worker_settings().served_model_name, "messages": [{"role": "user", "content": "hi"}]}
    assert client.post("/v1/chat/completions", json=chat).status_code == 200
    assert engine.requests[-1].sampling.max_tokens == worker_settings().default_max_tokens  # chat: unchanged


def test_compact_answers_openai_shape_with_the_served_models_summary(app_and_engine):
    client, engine = app_and_engine
    conversation = [
        {"type": "message", "role": "developer", "content": "You are a coding agent."},
        {"type": "message", "role": "user", "content": "Fix a.py"},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": '{"path": "a.py"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "print('hi')"},
        {"type": "message", "role": "assistant", "content": "Done."},
    ]
    tool = {"type": "function", "name": "read", "parameters": {"type": "object", "properties": {}}}
    body = {"model": worker_settings().served_model_name, "input": conversation, "tools": [tool]}
    body["prompt_cache_key"] = "compact-1"
    r = client.post("/v1/responses/compact", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "response.compaction" and out["id"].startswith("resp_")
    assert isinstance(out["created_at"], int) and out["usage"]["input_tokens"] > 0
    *users, item = out["output"]
    assert users == [conversation[1]]  # every user message as sent, then one compaction item
    assert item["type"] == "compaction" and item["id"].startswith("cmp_")
    assert item["encrypted_content"] == MARK + SUMMARY  # the model's summary, unchanged
    prompt = engine.tokenizer.decode(engine.requests[-1].prompt_ids)
    assert SUMMARY_REQUEST in prompt and "print('hi')" in prompt  # the history, then the request
    assert engine.requests[-1].sampling.max_tokens == worker_settings().default_max_tokens
    # the compacted output + a new message is a valid next input: the summary renders as a user message
    _responses(client, input=[*out["output"], {"role": "user", "content": "go on"}], store=False)
    prompt = engine.tokenizer.decode(engine.requests[-1].prompt_ids)
    assert SUMMARY_HEADER + SUMMARY in prompt and "print('hi')" not in prompt


def test_compact_refuses_what_it_cannot_read_or_has_nothing_to_do(app_and_engine):
    client, _ = app_and_engine
    model = worker_settings().served_model_name
    foreign = {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAB-openai-blob"}
    r = client.post("/v1/responses", json={"model": model, "input": [foreign]})
    assert r.status_code == 400 and "did not make" in r.json()["error"]["message"]
    r = client.post("/v1/responses/compact", json={"model": model, "input": []})
    assert r.status_code == 400 and "nothing to compact" in r.json()["error"]["message"]
    r = client.post("/v1/responses/compact", json={"model": model, "input": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


@pytest.mark.e2e
def test_compaction_reads_the_conversation_from_the_sessions_cache(hf_engine):
    """The summary request repeats the turn's prompt (same instructions, tools, key) before its own
    request, so the embedded model prefills only the new tail."""
    settings = worker_settings().model_copy(update={"default_max_tokens": 4})
    tool = {"type": "function", "name": "read", "parameters": {"type": "object", "properties": {}}}
    rules = "You are a careful coding agent. " + " ".join(f"Rule {i}: check your work." for i in range(40))
    body = {"model": settings.served_model_name, "instructions": rules, "tools": [tool]}
    body |= {"input": [{"role": "user", "content": "Fix a.py"}], "prompt_cache_key": "compact-cache"}
    with TestClient(build_app(settings, engine=hf_engine)) as c:
        turn = c.post("/v1/responses", json={**body, "max_output_tokens": 2, "temperature": 0})
        assert turn.status_code == 200, turn.text
        prompt = turn.json()["usage"]["input_tokens"]
        r = c.post("/v1/responses/compact", json=body)
        assert r.status_code == 200, r.text
    out = r.json()
    assert out["usage"]["output_tokens"] <= 4  # default_max_tokens bounds the summary
    assert out["usage"]["input_tokens_details"]["cached_tokens"] >= prompt - 8, out["usage"]
    assert out["output"][-1]["encrypted_content"].startswith(MARK)
