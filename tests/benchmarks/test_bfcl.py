"""BFCL cases, BFCL's OpenAI conversion, and the scoring of replies (every flag can flip)."""

from __future__ import annotations

import json

import pytest

from benchmarks.harness import bfcl
from benchmarks.harness.bfcl_openai import convert_to_tool


def test_sets_load_offline_with_one_function_each():
    assert len(bfcl.load_cases("simple")) == 400
    live = bfcl.load_cases("live_simple")
    assert len(live) == 258
    assert all(len(c.tools) == 1 and c.messages for c in live)
    picked = bfcl.load_cases("simple", 5)
    assert [c.id for c in picked] == [
        "simple_python_0",
        "simple_python_80",
        "simple_python_160",
        "simple_python_240",
        "simple_python_320",
    ]


def test_conversion_is_bfcl_openai_completions_style():
    fn = {
        "name": "math.area",
        "description": "Area.",
        "parameters": {
            "type": "dict",
            "properties": {
                "r": {"type": "float", "description": "Radius."},
                "tags": {"type": "array", "items": {"type": "dict", "properties": {"k": {"type": "tuple"}}}},
                "x": {"description": "no type"},
            },
            "required": ["r"],
        },
    }
    (tool,) = convert_to_tool([fn])
    f = tool["function"]
    assert tool["type"] == "function" and f["name"] == "math_area"
    assert f["parameters"]["type"] == "object"
    props = f["parameters"]["properties"]
    assert props["r"] == {
        "type": "number",
        "format": "float",
        "description": "Radius. This is a float type value.",
    }
    assert props["tags"]["items"]["type"] == "object"
    assert props["tags"]["items"]["properties"]["k"]["type"] == "array"
    assert props["x"]["type"] == "string"
    assert fn["name"] == "math.area"  # the input is not modified


TOOLS = convert_to_tool(
    [
        {
            "name": "get_user",
            "description": "",
            "parameters": {"type": "dict", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
        }
    ]
)


def _reply(content=None, calls=(), finish="tool_calls", cut=None):
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ]
    choice = {"index": 0, "message": msg, "finish_reason": finish}
    if cut:
        choice["incomplete_tool_call"] = cut
    return {"choices": [choice]}


@pytest.mark.parametrize(
    "reply, status, expect",
    [
        (_reply(calls=[("get_user", '{"id": 7}')]), 200, {"valid", "ok"}),
        (_reply(calls=[("get_user", '{"id": "7"}')]), 200, set()),  # schema-invalid
        (_reply(calls=[("get_user", '{"id": 7')]), 200, {"parse_fail"}),
        (_reply(calls=[("other", '{"id": 7}')]), 200, {"not_allowed"}),
        (_reply(calls=[("get_user", '{"id": 7}'), ("other", "{}")]), 200, {"valid", "not_allowed"}),
        (_reply(content='<tool_call>\n{"name": "get_user", "arguments": {"id'), 200, {"leak", "no_call"}),
        (_reply(content="I cannot", finish="stop"), 200, {"no_call"}),
        (
            _reply(finish="length", cut={"name": "get_user", "arguments_so_far": '{"id'}),
            200,
            {"cut", "cut_reported", "no_call", "ok"},
        ),
        (_reply(finish="length"), 200, {"cut", "no_call"}),
        ({"error": {"message": "bad"}}, 400, {"error"}),
    ],
)
def test_score_flags(reply, status, expect):
    out = bfcl.score(reply, status, TOOLS, {"get_user"})
    assert {k for k in bfcl.OUTCOMES if out[k]} == expect


def test_requests_per_mode():
    cases = bfcl.load_cases("live_simple", 8)
    c = cases[0]
    body, allowed = bfcl.request(c, "named", "m", 64, cases, allowed_tools=False)
    assert body["tool_choice"] == {"type": "function", "function": {"name": c.name}} and allowed == {c.name}
    body, _ = bfcl.request(c, "required", "m", 64, cases, allowed_tools=False)
    assert body["tool_choice"] == "required" and body["tools"] == c.tools
    mask, _ = bfcl.request(c, "subset", "m", 64, cases, allowed_tools=True)
    assert len(mask["tools"]) == 1 + bfcl.DISTRACTORS and c.tools[0] in mask["tools"]
    assert mask["tool_choice"]["allowed_tools"]["tools"] == [{"type": "function", "name": c.name}]
    stock, _ = bfcl.request(c, "subset", "m", 64, cases, allowed_tools=False)
    assert stock["tools"] == c.tools and stock["tool_choice"] == "required"
    assert json.dumps(bfcl.request(c, "subset", "m", 64, cases, True)[0]) == json.dumps(mask)  # deterministic


@pytest.mark.parametrize("concurrency", [1, 3])
def test_run_bfcl_concurrency_keeps_request_order(monkeypatch, concurrency):
    """``concurrency`` requests in flight at most (and at least, here), records in request order
    although later requests answer first, each with the call it got."""
    import asyncio

    import httpx

    state = {"now": 0, "max": 0, "seen": 0}

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        state["seen"] += 1
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        await asyncio.sleep(0.02 / state["seen"])  # later requests finish sooner
        state["now"] -= 1
        name = body["tools"][0]["function"]["name"]
        return httpx.Response(200, json=_reply(calls=[(name, "{}")]))

    real = httpx.AsyncClient
    monkeypatch.setattr(
        bfcl.httpx, "AsyncClient", lambda **kw: real(transport=httpx.MockTransport(handler), **kw)
    )
    cases = bfcl.load_cases("live_simple", 3)
    recs = bfcl.run_bfcl(
        "http://x", "m", cases, ["required", "named"], progress=False, concurrency=concurrency
    )
    assert [(r["mode"], r["case"]) for r in recs] == [(m, c.id) for m in ("required", "named") for c in cases]
    assert state["max"] == concurrency
    assert recs[0]["call_text"] == [f"{cases[0].tools[0]['function']['name']}({{}})"]


def test_subset_tool_names_are_unique_with_shared_functions():
    """Both sets together (live_simple repeats functions across cases): every subset request offers
    1 + DISTRACTORS tools of distinct names (a duplicate name is a 400, not a tool-calling outcome)."""
    cases = bfcl.load_cases("simple", 100) + bfcl.load_cases("live_simple", 100)
    assert len({c.name for c in cases}) < len(cases)  # the pool does repeat names
    for c in cases:
        body, _ = bfcl.request(c, "subset", "m", 64, cases, allowed_tools=True)
        names = [t["function"]["name"] for t in body["tools"]]
        assert len(names) == 1 + bfcl.DISTRACTORS and len(set(names)) == len(names), (c.id, names)
