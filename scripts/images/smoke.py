"""The smoke test's client for scripts/ci_images.sh (Python standard library only).

python3 smoke.py health URL [TIMEOUT_S]       wait for /health 200; print its version
python3 smoke.py chat URL [SESSION]           two turns with tool_choice "required":
    turn 1 must call the tool; turn 2 (turn 1 + the tool's result) must be served partly from
    the prefix cache (usage.prompt_tokens_details.cached_tokens > 0)
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city name"}},
                "required": ["city"],
            },
        },
    }
]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _post(url: str, body: dict[str, Any], session: str) -> dict[str, Any]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Session-ID": session},
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return dict(json.loads(r.read()))
    except urllib.error.HTTPError as exc:
        sys.exit(f"smoke: {url} answered {exc.code}: {exc.read()[:2000]!r}")


def health(base: str, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            status, body = _get(base + "/health")
            if status == 200:
                print(json.loads(body).get("version", ""))
                return 0
            last = (status, body[:300])
        except (OSError, ValueError) as exc:
            last = exc
        time.sleep(1)
    print(f"smoke: {base}/health not 200 within {timeout_s:.0f} s (last: {last!r})", file=sys.stderr)
    return 1


def chat(base: str, session: str) -> int:
    status, body = _get(base + "/v1/models")
    if status != 200:
        sys.exit(f"smoke: {base}/v1/models answered {status}: {body[:300]!r}")
    model = json.loads(body)["data"][0]["id"]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant. Use the tools to answer."},
        {"role": "user", "content": "What is the weather in Paris right now?"},
    ]
    req = {"model": model, "tools": TOOLS, "tool_choice": "required", "max_tokens": 64, "temperature": 0}
    t0 = time.monotonic()
    first = _post(base + "/v1/chat/completions", {**req, "messages": messages}, session)
    t1 = time.monotonic()
    msg = first["choices"][0]["message"]
    calls = msg.get("tool_calls") or []
    if first["choices"][0]["finish_reason"] != "tool_calls" or not calls:
        sys.exit(f"smoke: tool_choice required gave no tool call: {json.dumps(first)[:1500]}")
    call = calls[0]
    args = json.loads(call["function"]["arguments"])
    if call["function"]["name"] != "get_weather" or not isinstance(args, dict):
        sys.exit(f"smoke: unexpected tool call {call}")
    messages += [
        {"role": "assistant", "content": msg.get("content"), "tool_calls": calls},
        {"role": "tool", "tool_call_id": call["id"], "content": '{"temp_c": 18, "sky": "clear"}'},
    ]
    second = _post(base + "/v1/chat/completions", {**req, "messages": messages}, session)
    t2 = time.monotonic()
    usage = second.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    if cached <= 0:
        sys.exit(f"smoke: turn 2 was not served from the prefix cache: usage {usage}")
    print(
        f"model {model}: turn 1 {call['function']['name']}({call['function']['arguments']}) in "
        f"{t1 - t0:.1f} s; turn 2 {cached}/{usage.get('prompt_tokens')} prompt tokens from cache "
        f"in {t2 - t1:.1f} s"
    )
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "health":
        return health(argv[1].rstrip("/"), float(argv[2]) if len(argv) > 2 else 300)
    if len(argv) >= 2 and argv[0] == "chat":
        return chat(argv[1].rstrip("/"), argv[2] if len(argv) > 2 else "smoke-session")
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
