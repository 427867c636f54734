"""scripts/client_drift.sh's recording proxy: requests pass unchanged and their names are recorded;
what a newer client sends that the baseline does not list is printed."""

from __future__ import annotations

import json

import httpx
from fastapi import FastAPI, Request

from tests.conftest import running_server
from tests.dialects.request_recorder import body_fields, main, new_since, recording_proxy, seen_in


def test_body_fields_names_top_level_item_and_block_keys():
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "cache_control": {}}]}]}
    assert body_fields(body) == [
        "messages",
        "messages[].content",
        "messages[].content[].cache_control",
        "messages[].content[].type",
        "messages[].role",
        "model",
    ]


def test_the_proxy_forwards_and_records_and_the_report_names_what_is_new(tmp_path, capsys):
    app = FastAPI()
    app.get("/health")(lambda: {"status": "ok"})

    @app.post("/v1/messages")
    async def echo(request: Request) -> dict:
        return {"got": await request.json(), "beta": request.headers.get("anthropic-beta")}

    log = tmp_path / "requests.jsonl"
    with running_server(app) as url, recording_proxy(url, log) as proxied, httpx.Client() as client:
        for extra in ({}, {"context_management": {}}):
            body = {"model": "m", "max_tokens": 1, **extra}
            r = client.post(proxied + "/v1/messages?beta=true", json=body, headers={"anthropic-beta": "x"})
            assert r.json() == {"got": body, "beta": "x"}  # unchanged both ways
    seen = seen_in(log)
    assert seen["POST /v1/messages"]["fields"] == ["context_management", "max_tokens", "model"]
    assert "anthropic-beta" in seen["POST /v1/messages"]["headers"]
    known = {"POST /v1/messages": {"headers": seen["POST /v1/messages"]["headers"], "fields": ["model"]}}
    assert new_since(seen, known) == [
        "POST /v1/messages: new field context_management",
        "POST /v1/messages: new field max_tokens",
    ]
    baseline = tmp_path / "seen.json"
    baseline.write_text(json.dumps(known))
    main([str(log), str(baseline), "--update"])
    main([str(log), str(baseline)])
    assert capsys.readouterr().out.splitlines()[-1].startswith("nothing new")
