"""Issue 55 item 2 (the WebSockets' held conversations): charged in what they cost (6.5x their JSON
bytes, the worst ratio measured: server/held_budget.py) against a process budget
(websocket.held_conversations_mb) and a tenant's share of it. Before: each socket held up to 16 MiB
of JSON with no total (~42 sockets reached 16 GiB)."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from server.app import build_app
from server.config import load_settings
from server.held_budget import HELD_RATIO, HeldBudget
from tests.hardening.slow_engine import SlowEngine
from tests.hardening.test_ws_limits import create, last

KEYS = {"team-a": "sk-a", "team-b": "sk-b"}


def test_the_budget_charges_holders_by_tenant_and_frees_them():
    budget = HeldBudget(limit_bytes=1000, tenant_share=0.5)
    a1, a2, b1 = object(), object(), object()
    assert budget.hold(a1, "a", 60)  # 390 charged
    assert not budget.hold(a2, "a", 60)  # a's share is 500: refused, nothing charged
    assert budget.hold(a1, "a", 70)  # a holder's new conversation replaces its old charge
    assert budget.hold(b1, "b", 70) and budget.total == 2 * budget.cost(70)
    budget.release(a1)
    budget.release(b1)
    assert budget.total == 0 and budget.by_tenant == {} and budget.held == {}


def test_the_ratio_is_no_less_than_what_tiny_items_cost():
    import tracemalloc

    tiny = json.dumps([{"type": "message", "role": "user", "content": "x"}] * 20_000)
    tracemalloc.start()
    held = json.loads(tiny)
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert held and size / len(tiny) <= HELD_RATIO  # the worst case a client can choose is charged


def test_a_conversation_past_the_budget_is_not_held_and_the_error_names_it(tokenizer):
    settings = load_settings(device="cpu", auth={"api_keys": KEYS}, websocket={"held_conversations_mb": 1})
    engine = SlowEngine(tokenizer, step_s=0.01)
    engine.max_model_len = 1 << 20  # the long turn fits its window: only the memory budget matters here
    app = build_app(settings, engine=engine)
    words = "lorem ipsum " * 8000  # ~96 KB of JSON: 624 KB charged, over a tenant's 512 KiB share
    with TestClient(app) as c:
        with c.websocket_connect("/v1/responses", headers={"Authorization": "Bearer sk-a"}) as ws:
            ws.send_text(create(words, generate=False, store=False))
            prev = last(ws)["response"]["id"]
            ws.send_text(create("next", generate=False, previous_response_id=prev, store=False))
            error = last(ws)
            assert error["type"] == "error" and error["error"]["code"] == "conversation_too_large", error
            assert "websocket.held_conversations_mb" in error["error"]["message"]
        with c.websocket_connect("/v1/responses", headers={"Authorization": "Bearer sk-b"}) as ws:
            ws.send_text(create("short", generate=False, store=False))  # another tenant, a small one: held
            prev = last(ws)["response"]["id"]
            ws.send_text(create("next", generate=False, previous_response_id=prev, store=False))
            assert last(ws)["type"] == "response.completed"
        assert app.state.held_budget.total == 0  # closed sockets gave theirs back
