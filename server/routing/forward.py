"""One proxied request on its way to a worker and back (steps 3-5 of ``proxy.py``'s lifecycle).

``ProxyCall`` asks the policy for an order of workers, sends the request to the first on
a persistent upstream connection, fails over to the next while nothing has reached the
client, and relays the answer (``relay.py``): JSON whole up to ``RELAY_WINDOW``, larger JSON and
SSE as it arrives, so the router holds a bounded window of each answer; a mid-stream failure
ends on a clean event with an OpenAI-shaped error and ``data: [DONE]``. Every write to the client
has a deadline (``server/send_deadline.py``: a client that does not read is dropped and its
upstream request closed). A client disconnect cancels the upstream request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from starlette.types import Message, Receive, Send

from server.auth import TENANT_HEADER, TOKEN_HEADER
from server.dialects.messages.error_shape import is_messages_path, shape_error
from server.errors import UpstreamUnavailable
from server.log_budget import REQUEST_LOG
from server.routing.relay import RELAY_WINDOW, BodyRelay, EventRelay, Relay, content_length
from server.routing.upstream import UpstreamConnectError, UpstreamLost, UpstreamTimeout
from server.send_deadline import SendTimeout

if TYPE_CHECKING:
    from server.routing.request import RouteRequest
    from server.routing.router import Router
    from server.routing.workers import Worker

log = logging.getLogger("agentserve.routing")
WORKER_HEADER = "x-agentserve-worker"
HOP_HEADERS = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailers",
    b"transfer-encoding",
    b"upgrade",
    b"host",
    b"content-length",
    TENANT_HEADER.encode(),
    TOKEN_HEADER.encode(),
}


WORKER_HEADER_B = WORKER_HEADER.encode()


def relayed_headers(headers: list[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], bool]:
    """The worker's response headers the client gets (hop-by-hop ones dropped), and whether the
    answer is a stream (``text/event-stream``)."""
    out, is_stream = [], False
    for k, v in headers:
        if k in HOP_HEADERS:
            continue
        if k == b"content-type" and v.startswith(b"text/event-stream"):
            is_stream = True
        out.append((k, v))
    return out, is_stream


class _Retry(Exception):
    """This worker failed before anything reached the client: try the next (``lost``: the request
    had been sent and the connection dropped, so the request may be what killed the worker)."""

    def __init__(self, message: str, lost: bool = False) -> None:
        super().__init__(message)
        self.lost = lost


def _refused(losses: int) -> tuple[int, dict[str, Any]]:
    err = UpstreamUnavailable(
        f"{losses} workers dropped the connection while serving this exact request: it is not sent to "
        f"another (routing.max_worker_losses={losses}); operators: check the workers' logs",
        code="request_lost_workers",
    )
    return err.status, err.body()


class ProxyCall:
    """One proxied request; watches for the client disconnect while it runs. ``route``: its
    routing inputs (``request.py``), None for a request that is not placed (not a POST)."""

    def __init__(
        self,
        router: Router,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        route: RouteRequest | None,
        t0: float,
    ) -> None:
        self.router, self.method, self.target, self.headers = router, method, target, headers
        self.body, self.route, self.t0 = body, route, t0

    async def __call__(self, receive: Receive, send: Send) -> None:
        self._send, self._gone, self._finished = send, False, False
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.get_running_loop().create_task(self._watch_disconnect(receive, task))
        try:
            await self._run(self._tracked_send)
        except asyncio.CancelledError:
            if not self._gone:
                raise
            task.uncancel()
        except OSError:  # the client went away while we were sending
            pass
        except SendTimeout as exc:  # a client that does not read: its answer and upstream are dropped
            why = "router: %s %s: %s: the answer is dropped"
            REQUEST_LOG.log(log, logging.WARNING, why, self.method, REQUEST_PATH.get(), exc)
        finally:
            self._finished = True
            watcher.cancel()

    async def _watch_disconnect(self, receive: Receive, task: asyncio.Task[None]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self._finished:
            self._gone = True
            task.cancel()  # closes the upstream connection: the worker stops

    async def _tracked_send(self, message: Message) -> None:
        await self._send(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self._finished = True  # from here on a "disconnect" is just the end of the response

    async def _run(self, send: Send) -> None:
        m = self.router.metrics
        try:
            order, outcome = self.router.plan(self.route)
        except UpstreamUnavailable as exc:
            m.upstream_errors.labels("none", "no_worker").inc()
            await send_json(send, exc.status, exc.body())
            return
        if outcome is not None:
            m.placed(outcome)
        rs = self.router.settings.routing
        if self.router.suspects.losses(self.body) >= rs.max_worker_losses:
            await send_json(send, *_refused(rs.max_worker_losses))
            return
        failures: list[str] = []
        lost = 0
        for n, worker in enumerate(order):
            if n and not worker.healthy:
                continue  # taken out while we were trying another
            try:
                await self._attempt(worker, send)
                return
            except _Retry as exc:
                failures.append(f"{worker.id}: {exc}")
                m.failovers.labels(worker.id).inc()
                if exc.lost:  # the request reached the worker, which then died: maybe on it
                    lost += 1
                    if self.router.suspects.lost(self.body) >= rs.max_worker_losses:
                        await send_json(send, *_refused(rs.max_worker_losses))
                        return
                    if lost > rs.max_lost_replays:
                        failures.append(
                            f"not replayed again (routing.max_lost_replays={rs.max_lost_replays})"
                        )
                        break
        unavailable = UpstreamUnavailable(
            "no worker could take the request (" + "; ".join(failures) + "); retry shortly"
        )
        await send_json(send, unavailable.status, unavailable.body())

    async def _attempt(self, worker: Worker, send: Send) -> None:
        router, m = self.router, self.router.metrics
        worker.in_flight += 1
        status = "error"
        try:
            t_forward = time.perf_counter()
            try:
                resp = await router.upstream.send(
                    worker.url, self.method, self.target, self.headers, self.body
                )
            except UpstreamConnectError as exc:  # refused / unreachable: the worker is gone
                router.pool.mark_down(worker, f"connect failed: {exc}")
                m.upstream_errors.labels(worker.id, "connect").inc()
                raise _Retry(f"cannot connect ({exc})") from None
            except UpstreamTimeout as exc:
                await self._timeout(worker, send, exc)
                return
            except UpstreamLost as exc:
                raise self._lost(worker, exc) from None
            try:
                status = str(resp.status)
                headers, is_stream = relayed_headers(resp.headers)
                headers.append((WORKER_HEADER_B, worker.id.encode()))
                if resp.status >= 500:
                    m.upstream_errors.labels(worker.id, "status_5xx").inc()
                # a JSON answer within the window is read whole (a worker lost before its end is
                # still a retry); a larger one, or a stream, is relayed as it comes (relay.py)
                length = content_length(resp.headers)
                whole = not is_stream and length is not None and length <= RELAY_WINDOW
                chunks = None if whole else resp.chunks()
                try:
                    first = await resp.read() if chunks is None else await anext(chunks, b"")
                except UpstreamTimeout as exc:
                    await self._timeout(worker, send, exc)
                    return
                except UpstreamLost as exc:
                    raise self._lost(worker, exc) from None
                t_answer = time.perf_counter()
                if not is_stream and (whole or length is not None):
                    headers.append((b"content-length", str(len(first) if whole else length).encode()))
                await send({"type": "http.response.start", "status": resp.status, "headers": headers})
                if chunks is None:
                    await send({"type": "http.response.body", "body": first})
                    m.added_latency.observe((t_forward - self.t0) + (time.perf_counter() - t_answer))
                    return
                messages = is_messages_path(REQUEST_PATH.get())
                relay: Relay = EventRelay(send, messages) if is_stream else BodyRelay(send)
                await relay.push(first)
                m.added_latency.observe((t_forward - self.t0) + (time.perf_counter() - t_answer))
                try:
                    async for chunk in chunks:
                        await relay.push(chunk)
                except (UpstreamLost, UpstreamTimeout) as exc:
                    m.upstream_errors.labels(worker.id, "midstream").inc()
                    status = "midstream_error"
                    what = "stopped answering" if isinstance(exc, UpstreamTimeout) else "failed"
                    await relay.fail(
                        UpstreamUnavailable(
                            f"worker {worker.id} {what} mid-stream ({exc}); the answer is incomplete: "
                            "retry the request"
                        )
                    )
                    return
                await relay.finish()
            finally:
                await resp.aclose()
        finally:
            worker.in_flight -= 1
            m.request_done(worker.id, status)

    def _lost(self, worker: Worker, exc: Exception) -> _Retry:
        """The connection dropped before anything reached the client: count it, try the next worker."""
        self.router.metrics.upstream_errors.labels(worker.id, "disconnect").inc()
        return _Retry(f"connection lost before an answer ({exc})", lost=True)

    async def _timeout(self, worker: Worker, send: Send, exc: Exception) -> None:
        self.router.metrics.upstream_errors.labels(worker.id, "timeout").inc()
        rs = self.router.settings.routing
        err = UpstreamUnavailable(
            f"worker {worker.id} did not answer in time ({exc}; limits: "
            f"routing.connect_timeout_s={rs.connect_timeout_s}, routing.read_timeout_s={rs.read_timeout_s})",
            code="upstream_timeout",
        )
        await send_json(send, err.status, err.body())


# the path of the request being proxied (set at the entry): errors take that dialect's shape
REQUEST_PATH: ContextVar[str] = ContextVar("agentserve_router_path", default="")


async def send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    """An error (or other JSON) answer, in the dialect's shape for the request's path."""
    if "error" in body:
        body = shape_error(REQUEST_PATH.get(), status, body)
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
