"""Gemma 4 end to end over HTTP: a tiny random-weight model with the Gemma 4 test vocabulary (SmolLM2's
+ Gemma 4's special tokens) and vLLM's Gemma 4 chat template (``agentserve make-test-model --family
gemma4``), served by the real app with the hf engine.

The family is detected from the vocabulary (the config.json hint removed); ``required`` with an
``allowed_tools`` prefix gives valid calls to allowed tools in chat, Responses and Messages; a tool
loop stays in one model turn, so every turn's prompt starts with the previous prompt + reply (the
cache keeps it) but for the generation prompt's empty thought (thinking off: 4 tokens after a user
message), which the template's history does not keep.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from server.config import load_settings

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
MODEL = "tiny"


def _tool(name: str, props: dict) -> dict:
    params = {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": name, "parameters": params}}


TOOLS = [
    _tool("browser_open", {"url": {"type": "string", "enum": ["https://a.org", "https://b.org"]}}),
    _tool("shell_ls", {"path": {"type": "string", "enum": ["/", "/tmp"]}}),
    _tool("shell_exit", {"code": {"type": "integer", "enum": [0, 1]}}),
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from server.app import build_app
    from server.engines.hf.engine import HFEngine
    from server.families.model_facts import load_model_facts
    from server.families.test_model import make_test_model
    from tests.conftest import running_server

    folder = make_test_model("gemma4", tmp_path_factory.mktemp("models") / "gemma4")
    config = json.loads((folder / "config.json").read_text())
    del config["agentserve_family"]  # detected from the vocabulary, as a real Gemma 4 folder is
    (folder / "config.json").write_text(json.dumps(config))
    settings = load_settings(
        model=str(folder), device="cpu", served_model_name=MODEL, tool_state_machine=None
    )
    engine = HFEngine(settings, load_model_facts(settings, "hf"))
    with running_server(build_app(settings, engine=engine)) as base:
        yield base


def chat(url: str, messages: list[dict], **extra) -> dict:
    body = {
        "model": MODEL,
        "messages": messages,
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 60,
        "parallel_tool_calls": False,
        **extra,
    }
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_detected_and_required_prefix_gives_valid_calls(url) -> None:
    entry = httpx.get(url + "/v1/models").json()["data"][0]
    assert entry["family"] == "gemma4" and entry["envelope"] == "gemma4"
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "function", "function": {"name_prefix": "shell_"}}],
        },
    }
    msgs = [{"role": "user", "content": "List the files."}]
    for seed in range(3):
        msg = chat(url, msgs, tool_choice=choice, seed=seed, temperature=1.0)["choices"][0]["message"]
        assert msg.get("tool_calls"), msg
        for call in msg["tool_calls"]:
            assert call["function"]["name"].startswith("shell_")
            jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
    assert not chat(url, msgs, tool_choice="none")["choices"][0]["message"].get("tool_calls")


def test_responses_and_messages_get_calls_too(url) -> None:
    r = httpx.post(
        url + "/v1/responses",
        json={
            "model": MODEL,
            "input": "List the files.",
            "tools": [{"type": "function", **t["function"]} for t in TOOLS],
            "tool_choice": "required",
            "max_output_tokens": 60,
        },
        timeout=300,
    )
    assert r.status_code == 200, r.text
    calls = [o for o in r.json()["output"] if o["type"] == "function_call"]
    assert calls and calls[0]["name"] in SCHEMAS
    m = httpx.post(
        url + "/v1/messages",
        headers={"anthropic-version": "2023-06-01"},
        json={
            "model": MODEL,
            "max_tokens": 60,
            "messages": [{"role": "user", "content": "List the files."}],
            "tools": [
                {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
            ],
            "tool_choice": {"type": "any"},
        },
        timeout=300,
    )
    assert m.status_code == 200, m.text
    uses = [b for b in m.json()["content"] if b["type"] == "tool_use"]
    assert uses and uses[0]["name"] in SCHEMAS
    jsonschema.validate(uses[0]["input"], SCHEMAS[uses[0]["name"]])


def test_a_tool_loop_keeps_the_cache(url) -> None:
    msgs: list[dict] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Start."},
    ]
    block = load_settings().prefix_cache.block_size
    cached = ideal = 0
    prev = None
    for turn in range(8):
        body = chat(url, msgs, tool_choice="required", prompt_cache_key="gemma4-loop")
        usage, report = body["usage"], body["cache"]
        if prev is not None:
            # the history re-renders only the generation prompt's empty thought (4 tokens)
            assert report["diverged_at_token"] is None, report
            cached += usage["prompt_tokens_details"]["cached_tokens"]
            ideal += prev // block * block
        if turn == 1:
            print(f"gemma4 tool loop, turn 2: cached {report['cached_tokens']} of the {prev} tokens before")
        prev = usage["prompt_tokens"]
        msg = body["choices"][0]["message"]
        assert msg.get("tool_calls"), msg
        msgs.append({k: v for k, v in msg.items() if k in ("role", "content", "tool_calls")})
        for call in msg["tool_calls"]:
            msgs.append({"role": "tool", "tool_call_id": call["id"], "content": f"result {turn}"})
    print(f"gemma4 tool loop, turns 2-8: cached {cached} of {ideal} ideal tokens ({cached / ideal:.1%})")
    assert cached >= 0.97 * ideal, (cached, ideal)
