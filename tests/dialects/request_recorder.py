"""A recording TCP proxy for the real-client tests under ``scripts/client_drift.sh``: every HTTP request a
client sends through it is written to a JSONL file (method, path, header names, the body's field names,
top level and per message / tool / content block), then forwarded unchanged; answers (SSE included)
flow back byte for byte. Not used in CI."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from server.ports import free_port


def body_fields(body: Any) -> list[str]:
    """Dotted field names of a JSON body: top level, and the keys of its list items (``messages[]``)."""
    if not isinstance(body, dict):
        return []
    out = set()
    for key, value in body.items():
        out.add(key)
        items = value if isinstance(value, list) else []
        for item in items:
            if isinstance(item, dict):
                out.update(f"{key}[].{k}" for k in item)
                for inner in item.get("content") or [] if isinstance(item.get("content"), list) else []:
                    if isinstance(inner, dict):
                        out.update(f"{key}[].content[].{k}" for k in inner)
    return sorted(out)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def _requests(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, log: Path) -> None:
    """Client -> server: each request's head and body parsed and recorded, then forwarded."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path = (lines[0].split(" ") + ["", ""])[:2]
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
            body = b""
            if "content-length" in headers:
                body = await reader.readexactly(int(headers["content-length"]))
            writer.write(head + body)
            await writer.drain()
            try:
                fields = body_fields(json.loads(body)) if body else []
            except ValueError:
                fields = []
            entry = {"method": method, "path": path.split("?")[0], "headers": sorted(headers)}
            entry["fields"] = fields
            with log.open("a") as f:
                f.write(json.dumps(entry) + "\n")
            if "chunked" in headers.get("transfer-encoding", "") or headers.get("upgrade"):
                await _pipe(reader, writer)  # not parsed further: forwarded as is
                return
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


@contextmanager
def recording_proxy(url: str, log: Path) -> Iterator[str]:
    """A proxy in front of ``url`` that records requests into ``log``; yields its URL."""
    target = urlsplit(url)
    port = free_port()
    loop = asyncio.new_event_loop()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(target.hostname, target.port)
        await asyncio.gather(_requests(client_r, server_w, log), _pipe(server_r, client_w))

    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", port))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def seen_in(log: Path) -> dict[str, dict[str, list[str]]]:
    """``{path: {"headers": [...], "fields": [...]}}`` over every request in a recorder log."""
    seen: dict[str, dict[str, set[str]]] = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        at = seen.setdefault(f"{entry['method']} {entry['path']}", {"headers": set(), "fields": set()})
        at["headers"].update(entry["headers"])
        at["fields"].update(entry["fields"])
    return {p: {k: sorted(v) for k, v in at.items()} for p, at in sorted(seen.items())}


def new_since(now: dict[str, dict[str, list[str]]], known: dict[str, dict[str, list[str]]]) -> list[str]:
    """One line per path, header or field in ``now`` that ``known`` does not have."""
    out = []
    for path, at in now.items():
        if path not in known:
            out.append(f"new path: {path}")
        for kind in ("headers", "fields"):
            for name in sorted(set(at[kind]) - set(known.get(path, {}).get(kind, []))):
                out.append(f"{path}: new {kind[:-1]} {name}")
    return out


def main(argv: list[str]) -> int:
    """``python -m tests.dialects.request_recorder LOG SEEN [--update]``: print what is new; --update
    adds it to SEEN (the baseline scripts/client_drift_seen.json)."""
    log, seen_file = Path(argv[0]), Path(argv[1])
    known = json.loads(seen_file.read_text()) if seen_file.exists() else {}
    now = seen_in(log)
    for line in new_since(now, known) or ["nothing new: every path, header and field was seen before"]:
        print(line)
    if "--update" in argv:
        merged = {**now, **known}
        for path, at in now.items():
            merged[path] = {k: sorted(set(v) | set(known.get(path, {}).get(k, []))) for k, v in at.items()}
        seen_file.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
