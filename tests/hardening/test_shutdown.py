"""SIGTERM: the worker stops taking requests, finishes the one in flight, then exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from server.ports import free_port, wait_for_health

pytestmark = pytest.mark.e2e


def test_sigterm_finishes_in_flight_stream(embedded_model_dir):
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "server.cli", "serve", "--port", str(port), "--device", "cpu"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, 120, proc=proc)
        body = {
            "model": "smollm2-135m-instruct",
            "messages": [{"role": "user", "content": "Tell a story."}],
            # short: the stream must end inside uvicorn's 30 s graceful shutdown on a loaded box
            "max_tokens": 12,
            "temperature": 0,
            "stream": True,
        }
        lines: list[str] = []
        first = threading.Event()

        def read():
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                        first.set()

        t = threading.Thread(target=read)
        t.start()
        assert first.wait(60)
        proc.send_signal(signal.SIGTERM)
        t.join(60)
        # uvicorn shuts down gracefully, then re-raises SIGTERM so supervisors see why it exited
        assert proc.wait(60) in (0, -signal.SIGTERM)
        assert lines[-1] == "data: [DONE]"
        assert not any('"error"' in line for line in lines)
    finally:
        if proc.poll() is None:
            proc.kill()
