"""Capture what the real agent clients send: one Codex CLI and one Claude Code session, as JSONL.

    python benchmarks/agents/agent_capture.py [--out ~/.cache/agentserve/captures] [--clients codex,claude]

Serves the random-weight 32k-context test model with the ``read_then_answer`` tool state machine
(as ``tests/dialects/test_codex.py`` / ``test_claude_code.py`` do: turn 1 calls a read-only tool, turn
2 answers), puts ``benchmarks/agents/capture_proxy.py`` in front of it, runs ``codex exec`` and ``claude -p``
(installed by ``scripts/install_agent_clients.sh``) through the proxy, and writes ``OUT/codex.jsonl``
and ``OUT/claude.jsonl``: every request as the client sent it (headers without keys, body, status),
tool results included in the later turns' bodies. ``agentserve bench agents`` replays them.

The captures hold the clients' own prompts (Claude Code's is Anthropic's, not open source): they are
written outside the repository by default and should not be committed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.agents.capture_proxy import make_app  # noqa: E402
from server.ports import free_port, wait_for_health  # noqa: E402
from tests.dialects.agent_server import CLAUDE, CODEX, agent_server, run_claude, run_codex  # noqa: E402

DEFAULT_OUT = Path.home() / ".cache/agentserve/captures"
CLIENTS: dict[str, tuple[Path, Callable[[Path, str], Any]]] = {
    "codex": (CODEX, run_codex),
    "claude": (CLAUDE, run_claude),
}


@contextmanager
def proxy(upstream: str, out: Path) -> Iterator[str]:
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(make_app(upstream, out), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True, name="capture-proxy")
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, 30)
        yield url
    finally:
        server.should_exit = True
        thread.join(30)


def capture(out: Path, clients: list[str]) -> dict[str, Path]:
    """Run each client once through the proxy; the capture file of each."""
    out.mkdir(parents=True, exist_ok=True)
    done: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="agent-capture-") as tmp, agent_server(Path(tmp)) as (url, _):
        for name in clients:
            binary, run = CLIENTS[name]
            if not binary.exists():
                print(f"{name}: not installed at {binary} (scripts/install_agent_clients.sh): skipped")
                continue
            path = out / f"{name}.jsonl"
            path.unlink(missing_ok=True)
            root = Path(tmp) / name
            root.mkdir()
            with proxy(url, path) as via:
                result = run(root, via)
            if result.returncode != 0:
                raise SystemExit(f"{name} exited {result.returncode}: {result.stderr[-1500:]}")
            done[name] = path
            print(f"{name}: {sum(1 for _ in path.open())} requests -> {path}")
    return done


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--clients", default="codex,claude")
    args = ap.parse_args(argv)
    capture(args.out, [c for c in args.clients.split(",") if c])


if __name__ == "__main__":
    main()
