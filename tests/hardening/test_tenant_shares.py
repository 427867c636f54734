"""Issue 55 item 3 (sockets, requests): a tenant (an API key; one shared tenant without keys) holds
at most ``limits.tenant_share`` of a process's request places (running + queued) and WebSockets.
Before: one key could take all 1,024 sockets and every admission place."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse

from server.admission import Admission
from server.app import build_app
from server.config import load_settings
from server.errors import Overloaded
from tests.engines.fake import ScriptedEngine

KEYS = {"team-a": "sk-a", "team-b": "sk-b"}


def test_one_tenant_holds_its_share_of_the_request_places():
    admission = Admission(max_running=2, max_queued=2, tenant_share=0.5)
    a = [admission.reserve("a"), admission.reserve("a")]
    with pytest.raises(Overloaded) as refused:
        admission.reserve("a")
    assert "limits.tenant_share" in refused.value.message and refused.value.retry_after_s == 1
    b = [admission.reserve("b"), admission.reserve("b")]  # the other tenant still gets in
    a.pop().release()
    a.append(admission.reserve("a"))
    for ticket in a + b:
        ticket.release()
    assert admission.inside == 0 and admission.by_tenant == {}  # nothing kept per tenant once gone
    whole = Admission(max_running=2, max_queued=2)  # one tenant (no keys): all of them
    tickets = [whole.reserve() for _ in range(4)]
    assert len(tickets) == 4


@pytest.mark.parametrize(
    ("auth", "limits", "share"),
    [
        ({}, {}, 1.0),  # keyless: one tenant, the whole process
        ({"api_keys": {"only": "sk-1"}}, {}, 1.0),
        ({"api_keys": KEYS}, {}, 0.5),
        ({"router_token": "t", "require_router": True}, {}, 0.5),  # tenants from the router
        ({"api_keys": KEYS}, {"tenant_share": 0.25}, 0.25),
    ],
)
def test_the_default_share(auth, limits, share):
    assert load_settings(device="cpu", auth=auth, limits=limits).tenant_share() == share


def test_one_tenant_holds_its_share_of_the_sockets(tokenizer):
    settings = load_settings(device="cpu", auth={"api_keys": KEYS}, websocket={"max_sockets": 4})
    with TestClient(build_app(settings, engine=ScriptedEngine(tokenizer))) as c:
        a = {"Authorization": "Bearer sk-a"}
        b = {"Authorization": "Bearer sk-b"}
        with c.websocket_connect("/v1/responses", headers=a), c.websocket_connect("/v1/responses", headers=a):
            with pytest.raises(WebSocketDenialResponse) as denied:
                with c.websocket_connect("/v1/responses", headers=a):
                    pass
            assert denied.value.status_code == 503
            assert "limits.tenant_share" in denied.value.json()["error"]["message"]
            with (
                c.websocket_connect("/v1/responses", headers=b),
                c.websocket_connect("/v1/responses", headers=b),
            ):
                pass  # the other tenant's share is there
        with c.websocket_connect("/v1/responses", headers=a):  # closed ones are given back
            pass
