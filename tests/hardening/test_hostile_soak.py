"""Soak with hostile and normal sessions mixed (bounded in count and time, loopback only): the normal
sessions see 0 errors, a median latency within 2x of a clean run (plus a second of slack for the
shared CI box) and a p99 within 3x (plus 3 s); every attack gets its 4xx; the worker never restarts
(same process throughout).
Attacks over HTTP (oversized and abusive bodies, grammar bombs; issue 55: a text/plain POST, a rebound
Host, an echoed string over its bound, a flood of hosted tools) and over the Responses WebSocket (a
browser origin, an oversized message, a socket flood past websocket.max_sockets) run side by side."""

from __future__ import annotations

import json
import os
import threading
import time

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect
from websockets.typing import Origin

from server.app import build_app
from server.config import LimitsSettings, WebSocketSettings
from server.ws_gate import uvicorn_ws_options
from tests.conftest import running_server, worker_settings
from tests.hardening.helpers import MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]
SESSIONS = int(os.environ.get("AGENTSERVE_HOSTILE_SESSIONS", "3"))
TURNS = int(os.environ.get("AGENTSERVE_HOSTILE_TURNS", "5"))
PACE_S = 0.25  # between one attacker's requests
MAX_SOCKETS = 6  # websocket.max_sockets of the soak's worker: the flood opens 2 more


def _bomb(n: int) -> dict:
    row = {"type": "array", "items": {"type": "string", "minLength": n}, "minItems": n}
    return {"type": "object", "properties": {"t": row}, "required": ["t"]}


def _patterns(n: int) -> dict:
    props = {
        f"p{i}": {"type": "string", "pattern": rf"[a-z0-9]{{1,64}}(\.[a-z{i}]{{1,64}}){{0,16}}"}
        for i in range(n)
    }
    return {"type": "object", "properties": props, "required": sorted(props)}


def _tool(parameters: dict) -> dict:
    return {"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}]}


ATTACKS = [
    ("stop_count", {"stop": [f"s{i}" for i in range(10_000)]}, 400),
    ("stop_length", {"stop": "x" * 50_000}, 400),
    ("logit_bias", {"logit_bias": {str(i): 1 for i in range(1000)}}, 400),
    ("messages", {"messages": [{"role": "user", "content": "a"}] * 6000}, 400),
    (
        "schema_bomb",
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": _bomb(10**9)}}]},
        400,
    ),
    ("noncharacter", {"tools": [{"type": "function", "function": {"name": "f\ufdd0"}}]}, 400),
    # issue 37 item 2: ~10 s of compile each, refused before compiling; a schema xgrammar refuses at compile
    ("pattern_cost", _tool(_patterns(4)), 400),
    (
        "xgrammar_refusal",
        _tool(
            {
                "type": "object",
                "properties": {"s": {"type": "string", "pattern": "[a-z]{0,200}"}},
                "required": ["s"],
            }
        ),
        400,
    ),
    ("state_machine_path", {"tool_state_machine": "../../etc/x.yml"}, 400),
]


def _normal_sessions(url: str, tag: str) -> tuple[list[float], list[str]]:
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        msgs = [{"role": "system", "content": f"Agent {i}. Be brief."}]
        with httpx.Client(timeout=120) as client:
            for t in range(TURNS):
                msgs.append({"role": "user", "content": f"step {t}"})
                body = {"model": MODEL, "messages": msgs, "max_tokens": 3, "temperature": 0}
                t0 = time.monotonic()
                r = client.post(url + "/v1/chat/completions", json={**body, "prompt_cache_key": f"{tag}-{i}"})
                with lock:
                    latencies.append(time.monotonic() - t0)
                    if r.status_code != 200:
                        errors.append(r.text)
                reply = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else ""
                msgs.append({"role": "assistant", "content": reply or ""})

    threads = [threading.Thread(target=run, args=(i,)) for i in range(SESSIONS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return latencies, errors


def _ws_attack(url: str, stop: threading.Event, outcomes: list[tuple[str, int, int, str]]) -> None:
    """A hostile WebSocket client, paced: a browser origin (403), a message over max_request_bytes
    (an error event 413, the socket lives on), and a flood of MAX_SOCKETS + 2 idle sockets (the last
    2 refused with 503) held for a while, so HTTP sessions run while the socket cap is full."""
    ws_url = url.replace("http://", "ws://") + "/v1/responses"
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "x" * (2**20 + 10)}],
    }
    oversized = json.dumps({"type": "response.create", "model": MODEL, "input": [item], "generate": False})

    def origin_refused() -> int:
        try:
            ws_connect(ws_url, open_timeout=30, origin=Origin("http://evil.example")).close()
        except InvalidStatus as exc:
            return exc.response.status_code
        return 101

    while not stop.is_set():
        outcomes.append(("ws_origin", origin_refused(), 403, ""))
        with ws_connect(ws_url, open_timeout=30, max_size=None) as ws:
            ws.send(oversized)
            event = json.loads(ws.recv(timeout=60))
            outcomes.append(("ws_message_size", event.get("status", 0), 413, str(event)[:300]))
        held: list[ClientConnection] = []
        refused: list[int] = []
        for _ in range(MAX_SOCKETS + 2):
            try:
                held.append(ws_connect(ws_url, open_timeout=30))
            except InvalidStatus as exc:
                refused.append(exc.response.status_code)
        # never more open than the cap (closes of the last round may still be counted: more refusals)
        capped = len(held) <= MAX_SOCKETS and len(refused) >= 2 and set(refused) == {503}
        outcomes.append(("ws_flood", 503 if capped else 0, 503, f"opened {len(held)}, refused {refused}"))
        stop.wait(4 * PACE_S)  # the cap stays full while the sessions run
        for ws in held:
            ws.close()
        stop.wait(PACE_S)


def _round4_attack(url: str, stop: threading.Event, outcomes: list[tuple[str, int, int, str]]) -> None:
    """Issue 55's attacks, paced: what a web page can send (a text/plain POST to /v1/responses, 415;
    a rebound Host, 421), an echoed string over OpenAI's bound (400), a flood of hosted tools (400)."""
    respond = {"model": MODEL, "input": "x", "max_output_tokens": 2}
    attacks: list[tuple[str, dict[str, object], dict[str, str], int]] = [
        ("text_plain", respond, {"Content-Type": "text/plain"}, 415),
        ("rebound_host", respond, {"Content-Type": "application/json", "Host": "evil.example"}, 421),
        ("echoed_key", {**respond, "prompt_cache_key": "k" * 65}, {"Content-Type": "application/json"}, 400),
        (
            "hosted_tools",
            {**respond, "tools": [{"type": "web_search"}] * 20_000},  # under the soak's 1 MiB body limit
            {"Content-Type": "application/json"},
            400,
        ),
    ]
    encoded = [(name, json.dumps(body).encode(), headers, want) for name, body, headers, want in attacks]
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            for name, content, headers, want in encoded:
                r = client.post(url + "/v1/responses", content=content, headers=headers)
                outcomes.append((name, r.status_code, want, r.text[:300] if r.status_code != want else ""))
                stop.wait(PACE_S)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _p99(values: list[float]) -> float:
    return _pct(values, 0.99)


def test_normal_sessions_are_unaffected_by_hostile_ones(hf_engine):
    settings = worker_settings().model_copy(
        update={
            "limits": LimitsSettings(max_request_bytes=2**20),
            "websocket": WebSocketSettings(max_sockets=MAX_SOCKETS),
        }
    )
    app = build_app(settings, engine=hf_engine)
    with running_server(app, **uvicorn_ws_options(settings)) as url:
        _normal_sessions(url, "warm")
        clean, clean_errors = _normal_sessions(url, "clean")
        assert not clean_errors
        stop = threading.Event()
        outcomes: list[tuple[str, int, int, str]] = []

        encoded = []  # encoded once: the attackers share this process (and its GIL) with the server
        for name, extra, want in ATTACKS:
            body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}], **extra}
            encoded.append((name, json.dumps(body).encode(), want))
        big = b'{"model": "m", "messages": "' + b"a" * (2**20 + 10) + b'"}'

        def attack() -> None:  # paced: a hostile client, not a flood (volume is a rate limiter's job)
            # JSON bodies: without the content type every attack was a 400 for its framing, not its limit
            with httpx.Client(timeout=60, headers={"Content-Type": "application/json"}) as client:
                while not stop.is_set():
                    for name, content, want in encoded:
                        r = client.post(url + "/v1/chat/completions", content=content)
                        outcomes.append(
                            (name, r.status_code, want, r.text[:300] if r.status_code != want else "")
                        )
                        stop.wait(PACE_S)
                    pieces = iter([big[i : i + 65536] for i in range(0, len(big), 65536)])
                    r = client.post(url + "/v1/chat/completions", content=pieces)
                    outcomes.append(("chunked_body", r.status_code, 413, ""))

        attackers = [threading.Thread(target=attack) for _ in range(2)]
        attackers.append(threading.Thread(target=_ws_attack, args=(url, stop, outcomes)))
        attackers.append(threading.Thread(target=_round4_attack, args=(url, stop, outcomes)))
        for th in attackers:
            th.start()
        try:
            hostile, hostile_errors = _normal_sessions(url, "hostile")
        finally:
            stop.set()
            for th in attackers:
                th.join()
        assert not hostile_errors, hostile_errors[:3]
        wrong = [o for o in outcomes if o[1] != o[2]]
        assert outcomes and not wrong, wrong[:5]
        assert {"ws_origin", "ws_message_size", "ws_flood"} <= {o[0] for o in outcomes}, outcomes[-5:]
        assert {"text_plain", "rebound_host", "echoed_key", "hosted_tools"} <= {o[0] for o in outcomes}
        print(
            f"hostile soak: clean p50/p99 {_pct(clean, 0.5):.2f}/{_p99(clean):.2f}s, with attacks "
            f"{_pct(hostile, 0.5):.2f}/{_p99(hostile):.2f}s, {len(outcomes)} attacks"
        )
        # the typical request within 2x of a clean run (+1 s of slack for the shared CI box); the tail
        # (p99 of 15 requests is their slowest) within 3x (+3 s): one 3.2 s stall in a full slow-suite
        # run on a 2-core box (clean p99 0.63 s) failed a 2x bound, and did not recur alone (0.4-0.6 s)
        assert _pct(hostile, 0.5) <= max(2 * _pct(clean, 0.5), _pct(clean, 0.5) + 1.0), (clean, hostile)
        assert _p99(hostile) <= max(3 * _p99(clean), _p99(clean) + 3.0), (_p99(clean), _p99(hostile))
