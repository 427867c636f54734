"""Record what a real agent client sends: a pass-through HTTP proxy that appends each request to a JSONL file.

    python benchmarks/agents/capture_proxy.py --upstream http://127.0.0.1:8000 --port 8100 --out session.jsonl

Point the client (Codex: ``base_url``; Claude Code: ``ANTHROPIC_BASE_URL``) at the proxy. Each line is
``{"method", "path", "query", "headers", "body", "status"}`` (the request body parsed as JSON when it is;
``authorization`` / ``x-api-key`` are dropped). Responses, streams included, go back to the client
unchanged. ``benchmarks/agent_replay.py`` replays such a file. Local use only (binds 127.0.0.1).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

SECRET_HEADERS = {"authorization", "x-api-key"}
HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "accept-encoding"}


def make_app(upstream: str, out: Path) -> Starlette:
    client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(600.0))

    async def forward(request: Request) -> StreamingResponse:
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        headers = {k: v for k, v in request.headers.items() if k not in HOP_HEADERS}
        up = client.build_request(
            request.method, request.url.path, params=request.url.query, headers=headers, content=raw
        )
        resp = await client.send(up, stream=True)
        record = {
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query,
            "headers": {k: v for k, v in headers.items() if k not in SECRET_HEADERS},
            "body": body,
            "status": resp.status_code,
        }
        with out.open("a") as sink:
            sink.write(json.dumps(record, ensure_ascii=False) + "\n")

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for part in resp.aiter_raw():
                    yield part
            finally:
                await resp.aclose()

        keep = {k: v for k, v in resp.headers.items() if k not in HOP_HEADERS | {"content-encoding"}}
        return StreamingResponse(relay(), status_code=resp.status_code, headers=keep)

    methods = ["GET", "POST", "DELETE", "PUT", "HEAD", "OPTIONS"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    import uvicorn

    uvicorn.run(make_app(args.upstream, args.out), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
