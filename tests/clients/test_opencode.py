"""opencode (npm ``opencode-ai``, pinned in scripts/install_agent_clients.sh) against the embedded model.

opencode's OpenAI-compatible provider sends ``max_tokens: 32000`` for a model it has no output limit
for. Under ``limits.max_tokens_over_window: clamp`` (the default) those requests are served, lowered to
what the 8k window holds after opencode's ~7.7k-token prompt; once the conversation itself outgrows the
window, the answer is the documented 400 naming the window (never a truncated prompt).

Offline: the config comes from ``OPENCODE_CONFIG`` (a file written here), models.dev is not fetched
(``OPENCODE_DISABLE_MODELS_FETCH``), and HOME/XDG point at a temporary folder. The conversation grows
by user turns (``opencode run``, then ``opencode run --continue``, each with ~1,800 tokens of notes),
so it outgrows the window in two turns. The model's only extra option is an end-of-reply bias
(``logit_bias`` on ``<|im_end|>``, passed through by opencode's model ``options``): the 135M model
otherwise writes until the clamped limit, thousands of tokens per turn on a CPU. No output limit is
configured: opencode still sends ``max_tokens: 32000``. edit/bash/webfetch are denied.
After the 400, opencode 1.18.33 starts its own compaction (a summary request) and goes on; the test
checks that every request after it, too, is a 200 or the same documented 400, never anything else.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from server.config import load_settings
from tests.conftest import running_server

pytestmark = [pytest.mark.e2e, pytest.mark.clients, pytest.mark.slow, pytest.mark.timeout(1500)]
NPM = Path(os.environ.get("AGENTSERVE_CACHE_DIR", Path.home() / ".cache" / "agentserve")) / "npm"
OPENCODE = NPM / "node_modules" / ".bin" / "opencode"
MODEL = "smollm2-135m-instruct"

EOS_BIAS = {"2": 10}  # <|im_end|> of the embedded model: short replies


CONFIG = Path(__file__).resolve().parents[2] / "configs/clients/opencode/opencode.json"  # the README's


def opencode_config(base_url: str) -> dict:
    """configs/clients/opencode/opencode.json (baseURL + model, no limit block) pointed at ``base_url``,
    plus what the test adds: a short end-of-reply bias, a long timeout, no sharing, read-only tools."""
    config = json.loads(CONFIG.read_text())
    provider = config["provider"]["agentserve"]
    provider["options"].update(baseURL=base_url + "/v1", apiKey="unused", timeout=1_200_000)
    provider["models"][MODEL].update(name="SmolLM2 135M (embedded)", options={"logit_bias": EOS_BIAS})
    assert config["model"] == f"agentserve/{MODEL}"
    return {
        **config,
        "autoupdate": False,
        "share": "disabled",
        "permission": {"edit": "deny", "bash": "deny", "webfetch": "deny"},
    }


class Recorder:
    """ASGI middleware: each /v1 request's body, status and response bytes (streams included)."""

    def __init__(self, app) -> None:
        self.app, self.calls = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        call = {"path": scope["path"], "request": b"", "status": None, "response": b""}
        self.calls.append(call)

        async def rec_receive():
            message = await receive()
            call["request"] += message.get("body", b"")
            return message

        async def rec_send(message):
            if message["type"] == "http.response.start":
                call["status"] = message["status"]
            elif message["type"] == "http.response.body":
                call["response"] += message.get("body", b"")
            await send(message)

        await self.app(scope, rec_receive, rec_send)


def test_opencode_without_an_output_limit_runs_until_the_window_is_full(hf_engine, tmp_path):
    if not OPENCODE.exists():
        pytest.skip("opencode missing: run `bash scripts/install_agent_clients.sh opencode-ai`")
    from server.app import build_app

    settings = load_settings(device="cpu")
    assert settings.limits.max_tokens_over_window == "clamp"
    app = Recorder(build_app(settings, engine=hf_engine))
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("# demo\n\nA small project.\n")
    home = tmp_path / "home"
    config = tmp_path / "opencode.json"
    outputs = []
    with running_server(app) as url:
        config.write_text(json.dumps(opencode_config(url)))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "OPENCODE_CONFIG": str(config),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_SHARE": "1",
        }
        for turn in range(4):  # each turn adds ~1,800 tokens of notes: the window is full by turn 2
            notes = "\n".join(
                f"{i}. step {i} of part {turn} copies file_{i}.txt into out/." for i in range(90)
            )
            first = ["--title", "window demo"] if turn == 0 else ["--continue"]
            out = subprocess.run(
                [str(OPENCODE), "run", *first, f"My notes:\n{notes}\nSay OK."],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=1200,
            )
            outputs.append(out)
            if any(c["status"] == 400 for c in app.calls):
                break
    chats = [c for c in app.calls if c["path"] == "/v1/chat/completions"]
    report = [
        (c["status"], json.loads(c["request"]).get("max_tokens"), len(c["request"]), c["response"][-300:])
        for c in chats
    ]
    runs = [(o.returncode, o.stdout[-1500:], o.stderr[-1500:]) for o in outputs]
    detail = f"requests: {report}\nopencode runs (rc, stdout, stderr): {runs}"
    assert len(chats) >= 2 and any(c["status"] != 200 for c in chats), detail
    first_400 = next(i for i, c in enumerate(chats) if c["status"] != 200)
    served, last = chats[:first_400], chats[first_400]
    assert served, detail  # the first turn fits: answered
    # no per-model limit configured: opencode asks for 32000 on every request
    assert all(json.loads(c["request"]).get("max_tokens") == 32000 for c in chats), detail
    # answered until the conversation outgrew the window ...
    assert all(c["status"] == 200 for c in served), detail
    # every reply read to its end says it was clamped (opencode may close a stream early, e.g. its
    # title request: such a stream never reached the final chunk that carries the field)
    finished = [c for c in served if b"[DONE]" in c["response"] or b"data:" not in c["response"]]
    assert finished and all(b'"max_tokens_clamped"' in c["response"] for c in finished), detail
    # ... then the documented 400: the prompt alone is over the window, nothing truncated
    assert last["status"] == 400, detail
    error = json.loads(last["response"])["error"]
    assert "maximum context length is 8192" in error["message"], detail
    assert "nothing was truncated" in error["message"], detail
    assert "maximum context length" in outputs[-1].stdout + outputs[-1].stderr, detail  # the user sees why
    assert all(c["status"] in (200, 400) for c in chats), detail  # nothing else, ever (no 5xx)
    print(detail)  # the whole exchange, for `pytest -s` / `-rP`
