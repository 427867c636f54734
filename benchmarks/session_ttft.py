"""TTFT of a ~2,000-token session prompt, then the same + ~50 tokens on the same session.

Starts the embedded model in-process (hf engine, real HTTP on loopback) unless --url
is given. Prints a markdown table with the ratio, and prefill / decode tokens per
second. Reproduce: ./run.sh bench benchmarks/session_ttft.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time

import httpx

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def start_local_server() -> tuple[str, object]:

    import uvicorn

    from server.app import build_app
    from server.config import load_settings
    from server.ports import free_port, wait_for_health

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(build_app(load_settings()), host="127.0.0.1", port=port, log_level="warning")
    )
    threading.Thread(target=server.run, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, 120)
    except TimeoutError:
        raise SystemExit("server did not start") from None
    return url, server


def timed_stream(url: str, body: dict) -> dict:
    t0 = time.perf_counter()
    first = None
    last: dict = {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter()
            if chunk.get("usage"):
                last = chunk
    end = time.perf_counter()
    usage = last["usage"]
    return {
        "ttft": (first or end) - t0,
        "total": end - t0,
        "prompt_tokens": usage["prompt_tokens"],
        "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
        "completion_tokens": usage["completion_tokens"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", help="a running server; default: start the embedded model in-process")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--decode-tokens", type=int, default=64)
    args = ap.parse_args()
    url = args.url or start_local_server()[0]
    system = "You are a coding agent working in a repository. " + " ".join(
        f"Guideline {i}: read the file before editing it and run the tests after." for i in range(95)
    )
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Fix the failing test."}]
    key = f"bench-{time.time_ns()}"
    base = {
        "model": args.model,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "prompt_cache_key": key,
    }
    cold = timed_stream(url, {**base, "messages": msgs, "max_tokens": 1})
    msgs2 = msgs + [
        {"role": "assistant", "content": "I will look at the test output first."},
        {
            "role": "user",
            "content": "The test fails with KeyError: 'name' in parse_config at line 41 "
            "of config.py, when the YAML file has no name field. Please fix it.",
        },
    ]
    warm = timed_stream(url, {**base, "messages": msgs2, "max_tokens": 1})
    decode = timed_stream(
        url,
        {**base, "messages": msgs2, "max_tokens": args.decode_tokens, "prompt_cache_key": key + "-decode"},
    )
    prefill_tps = cold["prompt_tokens"] / cold["ttft"]
    decode_tps = (decode["completion_tokens"] - 1) / max(1e-9, decode["total"] - decode["ttft"])
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; model {args.model}"
    )
    print("| request | prompt tokens | cached | TTFT (s) |")
    print("|---|---|---|---|")
    print(f"| cold session prompt | {cold['prompt_tokens']} | {cold['cached_tokens']} | {cold['ttft']:.3f} |")
    print(
        f"| same + {warm['prompt_tokens'] - cold['prompt_tokens']} tokens | {warm['prompt_tokens']} | "
        f"{warm['cached_tokens']} | {warm['ttft']:.3f} |"
    )
    print(f"\nTTFT ratio warm/cold: 1/{cold['ttft'] / warm['ttft']:.1f}")
    print(
        f"prefill: {prefill_tps:.0f} tok/s (cold, {cold['prompt_tokens']} tokens); "
        f"decode: {decode_tps:.1f} tok/s ({decode['completion_tokens']} tokens)"
    )


if __name__ == "__main__":
    main()
